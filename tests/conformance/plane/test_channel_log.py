"""The Channel log, the same on every plane: order, acknowledgement, wake-ups, retention, expiry."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from gateway.plane.base import Envelope, EnvelopeKind, LogRetention
from tests.support import T
from tests.support.planes import Bus

pytestmark = pytest.mark.anyio

CHANNEL = "0123456789abcdef0123456789abcdef"
DIGEST = b"\x00digest\xff" * 4
#: A long idle expiry: only the tests about expiry move the clock past it.
IDLE = 3600.0


async def test_a_log_written_at_one_broker_reads_in_order_at_another(bus: Bus) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    log_a, log_b = a.plane.channel_log, b.plane.channel_log
    log_a.open(CHANNEL, digest=DIGEST, idle=IDLE)
    appended = [log_a.append(CHANNEL, b"c=n,u=%d;\x00\xff" % n) for n in range(1, 6)]
    assert [await f for f in appended] == [1, 2, 3, 4, 5]
    read = await log_b.read(CHANNEL, 0, 100, 0)
    assert read is not None
    assert read.frames == tuple((n, b"c=n,u=%d;\x00\xff" % n) for n in range(1, 6))
    assert (read.last_seq, read.lost_through) == (5, 0)
    assert await log_b.digest(CHANNEL) == DIGEST


async def test_a_read_acknowledges_what_it_is_after_and_honours_its_limit(bus: Bus) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    log_a, log_b = a.plane.channel_log, b.plane.channel_log
    # Awaited: another broker's read follows them only once they are in Redis
    # (one plane's calls keep their order; two planes' need not, as on a cluster).
    await log_a.open(CHANNEL, digest=DIGEST, idle=IDLE)
    await asyncio.gather(*(log_a.append(CHANNEL, b"c=n;%d" % n) for n in range(1, 8)))
    first = await log_b.read(CHANNEL, 2, 3, 0)
    assert first is not None and [seq for seq, _ in first.frames] == [3, 4, 5]
    # Acknowledged through 2: gone for every reader, and never counted as lost.
    again = await log_a.read(CHANNEL, 0, 100, 0)
    assert again is not None and [seq for seq, _ in again.frames] == [3, 4, 5, 6, 7]
    assert again.lost_through == 0
    await log_b.acknowledge(CHANNEL, 6)
    rest = await log_a.read(CHANNEL, 0, 100, 0)
    assert rest is not None and rest.frames == ((7, b"c=n;7"),)
    # Acknowledging past the newest acknowledges what there is, not numbers to come.
    await log_b.acknowledge(CHANNEL, 100)
    assert await log_a.append(CHANNEL, b"c=n;8") == 8
    last = await log_b.read(CHANNEL, 7, 100, 0)
    assert last is not None and last.frames == ((8, b"c=n;8"),)


async def test_a_reader_parked_at_one_broker_wakes_on_an_append_at_another(bus: Bus) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    log_a, log_b = a.plane.channel_log, b.plane.channel_log
    await log_a.open(CHANNEL, digest=DIGEST, idle=IDLE)
    for _ in range(3):  # parked and woken again and again, never left behind
        empty = await log_b.read(CHANNEL, 0, 10, 0)
        assert empty is not None
        after = empty.last_seq
        reading = asyncio.ensure_future(log_b.read(CHANNEL, after, 10, 60 * T))
        second = asyncio.ensure_future(log_b.read(CHANNEL, after, 10, 60 * T))
        # The readers are parked once the Redis round trip of a later call is back.
        await log_b.digest(CHANNEL)
        assert not reading.done()
        await log_a.append(CHANNEL, b"c=wake;")
        with anyio.fail_after(5 * T):
            woken = await reading
            also = await second
        assert woken is not None and woken.frames == ((after + 1, b"c=wake;"),)
        assert also == woken


async def test_a_wait_that_nothing_ends_returns_empty(bus: Bus) -> None:
    a = await bus.join("broker-a")
    log = a.plane.channel_log
    log.open(CHANNEL, digest=DIGEST, idle=IDLE)
    with anyio.fail_after(5 * T):
        read = await log.read(CHANNEL, 0, 10, 0.05)
    assert read is not None and read.frames == () and read.last_seq == 0


async def test_retention_by_commands_drops_the_oldest_and_reports_the_gap(bus: Bus) -> None:
    retention = LogRetention(max_frames=3)
    a = await bus.join("broker-a", retention=retention)
    b = await bus.join("broker-b", retention=retention)
    log_a, log_b = a.plane.channel_log, b.plane.channel_log
    assert log_a.retention == retention
    await log_a.open(CHANNEL, digest=DIGEST, idle=IDLE)
    await asyncio.gather(*(log_a.append(CHANNEL, b"c=n;%d" % n) for n in range(1, 6)))
    read = await log_b.read(CHANNEL, 0, 100, 0)
    assert read is not None
    assert [seq for seq, _ in read.frames] == [3, 4, 5]
    assert read.lost_through == 2  # a reader that had 0 lost 1 and 2


async def test_what_was_acknowledged_is_never_a_gap(bus: Bus) -> None:
    retention = LogRetention(max_frames=2)
    a = await bus.join("broker-a", retention=retention)
    log = a.plane.channel_log
    log.open(CHANNEL, digest=DIGEST, idle=IDLE)
    log.append(CHANNEL, b"c=n;1")
    log.append(CHANNEL, b"c=n;2")
    log.acknowledge(CHANNEL, 2)
    for n in range(3, 5):
        log.append(CHANNEL, b"c=n;%d" % n)
    read = await log.read(CHANNEL, 2, 100, 0)
    assert read is not None and [seq for seq, _ in read.frames] == [3, 4]
    assert read.lost_through == 0


async def test_retention_by_bytes_keeps_at_least_the_newest(bus: Bus) -> None:
    retention = LogRetention(max_bytes=25)
    a = await bus.join("broker-a", retention=retention)
    log = a.plane.channel_log
    log.open(CHANNEL, digest=DIGEST, idle=IDLE)
    for n in range(1, 4):
        log.append(CHANNEL, b"c=ten;1234" + b"%d" % n)  # 11 bytes each: two fit
    read = await log.read(CHANNEL, 0, 100, 0)
    assert read is not None and [seq for seq, _ in read.frames] == [2, 3]
    assert read.lost_through == 1
    log.append(CHANNEL, b"x" * 100)  # alone past the bound, and still kept
    read = await log.read(CHANNEL, 0, 100, 0)
    assert read is not None and read.frames == ((4, b"x" * 100),)
    assert read.lost_through == 3


async def test_retention_by_age_drops_what_is_older(bus: Bus) -> None:
    retention = LogRetention(max_age=60.0)
    a = await bus.join("broker-a", retention=retention)
    log = a.plane.channel_log
    log.open(CHANNEL, digest=DIGEST, idle=IDLE)
    log.append(CHANNEL, b"c=old;")
    bus.skew += 30
    log.append(CHANNEL, b"c=newer;")
    bus.skew += 31
    read = await log.read(CHANNEL, 0, 100, 0)
    assert read is not None and read.frames == ((2, b"c=newer;"),)
    assert read.lost_through == 1
    bus.skew += 60
    read = await log.read(CHANNEL, 0, 100, 0)
    assert read is not None and read.frames == () and read.lost_through == 2


async def test_retention_drops_many_frames_at_once_by_commands_bytes_and_age(bus: Bus) -> None:
    # A held log is trimmed only by retention: one batch of appends may drop more
    # frames than the plane reads at a time, by each bound.
    retention = LogRetention(max_frames=30, max_bytes=400, max_age=60.0)
    a = await bus.join("broker-a", retention=retention)
    log = a.plane.channel_log
    await log.open(CHANNEL, digest=DIGEST, idle=IDLE)
    assert await log.hold(CHANNEL) == ("", 0)
    frames = [b"c=ten;%04d" % n for n in range(1, 101)]  # 10 bytes each
    assert await log.held_append(CHANNEL, frames) == 100
    read = await log.read(CHANNEL, 0, 1000, 0)
    assert read is not None
    assert [seq for seq, _ in read.frames] == list(range(71, 101))  # by commands
    assert read.lost_through == 70
    assert await log.held_append(CHANNEL, [b"c=big;" + b"x" * 194] * 2) == 102
    read = await log.read(CHANNEL, 0, 1000, 0)
    assert read is not None  # by bytes: 2 x 200 fill it, the 30 before go
    assert [seq for seq, _ in read.frames] == [101, 102]
    assert read.lost_through == 100
    assert await log.held_append(CHANNEL, frames[:20]) == 122
    bus.skew += 61
    assert await log.held_append(CHANNEL, [b"c=new;"]) == 123
    read = await log.read(CHANNEL, 0, 1000, 0)
    assert read is not None and read.frames == ((123, b"c=new;"),)  # by age
    assert read.lost_through == 122


async def test_an_idle_log_expires_bus_wide_and_use_keeps_it(bus: Bus) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    log_a, log_b = a.plane.channel_log, b.plane.channel_log
    await log_a.open(CHANNEL, digest=DIGEST, idle=100.0)
    await log_a.append(CHANNEL, b"c=n;")
    bus.skew += 90
    assert await log_b.digest(CHANNEL) == DIGEST  # a use at any broker renews it
    bus.skew += 90
    read = await log_b.read(CHANNEL, 0, 10, 0)
    assert read is not None and read.last_seq == 1
    bus.skew += 101
    assert await log_a.read(CHANNEL, 0, 10, 0) is None
    assert await log_b.digest(CHANNEL) is None
    assert await log_a.append(CHANNEL, b"c=late;") == 0


async def test_unknown_and_dropped_logs_are_nothing(bus: Bus) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    log_a, log_b = a.plane.channel_log, b.plane.channel_log
    assert await log_a.read("f" * 32, 0, 10, 0) is None
    assert await log_a.append("f" * 32, b"c=x;") == 0
    assert await log_a.digest("f" * 32) is None
    await log_a.acknowledge("f" * 32, 3)  # nothing to acknowledge, and no error
    await log_a.open(CHANNEL, digest=DIGEST, idle=IDLE)
    parked = asyncio.ensure_future(log_b.read(CHANNEL, 0, 10, 60 * T))
    await log_b.digest(CHANNEL)
    await log_a.drop(CHANNEL)
    with anyio.fail_after(5 * T):
        assert await parked is None  # the parked reader finds it gone
    assert await log_b.digest(CHANNEL) is None


async def test_opening_again_starts_afresh(bus: Bus) -> None:
    a = await bus.join("broker-a")
    log = a.plane.channel_log
    log.open(CHANNEL, digest=DIGEST, idle=IDLE)
    log.append(CHANNEL, b"c=n;")
    log.open(CHANNEL, digest=b"other", idle=IDLE)
    read = await log.read(CHANNEL, 0, 10, 0)
    assert read is not None and (read.frames, read.last_seq) == ((), 0)
    assert await log.digest(CHANNEL) == b"other"


async def test_frames_for_a_channel_with_a_log_go_into_it(bus: Bus) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    log = b.plane.channel_log
    a.plane.channel_opened(CHANNEL)
    await log.open(CHANNEL, digest=DIGEST, idle=IDLE)
    await a.plane.locate_channel(CHANNEL)
    news = Envelope(EnvelopeKind.CHANNEL, "broker-b", CHANNEL, b"c=news;hi")
    # An agent's d: whatever broker lists the Channel, its log is where it is read.
    assert await b.plane.forward_to_channel(CHANNEL, news) is not None
    assert await b.plane.forward_to_channel(CHANNEL, news) is not None
    read = await log.read(CHANNEL, 0, 10, 0)
    assert read is not None
    assert read.frames == ((1, b"c=news;hi"), (2, b"c=news;hi"))
    assert a.inbound.empty()
    # A logged request reaches its broker intact, kind and all.
    b.plane.serving("echo")
    await b.plane.respondents("echo")
    request = Envelope(EnvelopeKind.LOGGED_REQUEST, "broker-a", CHANNEL, b"c=echo,u=1;")
    assert await a.plane.forward_request("echo", request) == "broker-b"
    with anyio.fail_after(5 * T):
        assert await b.inbound.get() == request


async def test_a_held_log_takes_frames_only_from_its_holder_and_the_rest_goes_there(
    bus: Bus,
) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    log_a, log_b = a.plane.channel_log, b.plane.channel_log
    await log_a.open(CHANNEL, digest=DIGEST, idle=IDLE)
    assert await log_a.hold(CHANNEL) == ("", 0)
    a.plane.channel_opened(CHANNEL)
    await a.plane.locate_channel(CHANNEL)
    assert await log_a.held_append(CHANNEL, [b"c=one;"]) == 1
    # Held: another broker neither appends nor holds-appends; its d goes to the holder.
    assert await log_b.append(CHANNEL, b"c=no;") == 0
    assert await log_b.held_append(CHANNEL, [b"c=no;"]) == -1
    news = Envelope(EnvelopeKind.CHANNEL, "broker-b", CHANNEL, b"c=news;hi")
    assert await b.plane.forward_to_channel(CHANNEL, news) == "broker-a"
    with anyio.fail_after(5 * T):
        assert (await a.inbound.get()).frame == b"c=news;hi"
    # Released (the connection dropped): the log takes what is routed to the Channel.
    await log_a.release(CHANNEL)
    a.plane.channel_closed(CHANNEL)
    await a.plane.written()
    assert await b.plane.forward_to_channel(CHANNEL, news) is not None
    assert a.inbound.empty()
    # Held again at B (a resume): it learns the newest number; A's appends are refused.
    assert await log_b.hold(CHANNEL) == ("", 2)
    assert await log_a.held_append(CHANNEL, [b"c=late;"]) == -1
    assert await log_b.held_append(CHANNEL, [b"c=three;", b"c=four;"]) == 4
    assert await log_a.hold(CHANNEL) == ("broker-b", 4)
    await log_b.release(CHANNEL)  # not B's any more: nothing changes
    assert await log_b.held_append(CHANNEL, [b"c=no;"]) == -1
    read = await log_b.read(CHANNEL, 0, 10, 0)
    assert read is not None
    assert read.frames == ((1, b"c=one;"), (2, b"c=news;hi"), (3, b"c=three;"), (4, b"c=four;"))
    # No log at all: nothing to hold or append.
    other = "f" * 32
    assert await log_a.hold(other) is None
    assert await log_a.held_append(other, [b"c=x;"]) == 0
    await log_a.release(other)


async def test_a_log_is_pending_on_its_holder_and_then_on_what_was_sent_to_it(
    bus: Bus,
) -> None:
    # What a resume waits for before it holds the log (ChannelLog.pending): its holder,
    # then, once released, the frames forwarded to the holder until it has passed
    # them on (the release barrier; the order it keeps is tested on the planes that
    # keep it, tests/gateway/plane/redis/test_release_barriers.py).
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    log_a, log_b = a.plane.channel_log, b.plane.channel_log
    assert await log_b.pending(CHANNEL) == ""  # no log
    await log_a.open(CHANNEL, digest=DIGEST, idle=IDLE)
    assert await log_b.pending(CHANNEL) == ""
    await log_a.hold(CHANNEL)
    a.plane.channel_opened(CHANNEL)  # on a cluster (and in memory) the directory says where
    await a.plane.locate_channel(CHANNEL)
    assert await log_b.pending(CHANNEL) == "broker-a"
    sent = [b"c=news,u=%d;" % u for u in range(1, 6)]
    for frame in sent:
        news = Envelope(EnvelopeKind.CHANNEL, "broker-b", CHANNEL, frame)
        assert await b.plane.forward_to_channel(CHANNEL, news) == "broker-a"
    await log_b.release(CHANNEL)  # not B's: nothing changes
    assert await log_b.pending(CHANNEL) == "broker-a"
    await log_a.release(CHANNEL)
    with anyio.fail_after(5 * T):
        while await log_b.pending(CHANNEL):
            await asyncio.sleep(0)  # each look is a call to the plane: no busy loop
        got = [(await a.inbound.get()).frame for _ in sent]
    assert got == sent
    # Held at B (a resume): pending on B; released there, on nobody (nothing was
    # forwarded to B while it held it).
    assert await log_b.hold(CHANNEL) == ("", 0)
    assert await log_a.pending(CHANNEL) == "broker-b"
    await log_b.release(CHANNEL)
    with anyio.fail_after(5 * T):
        while await log_a.pending(CHANNEL):
            await asyncio.sleep(0)


async def test_a_record_kept_with_a_log_is_read_at_another_broker_and_goes_with_it(
    bus: Bus,
) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    log_a, log_b = a.plane.channel_log, b.plane.channel_log
    await log_a.keep(CHANNEL, b"before any log")  # no log: nothing kept
    assert await log_b.kept(CHANNEL) == b""
    await log_a.open(CHANNEL, digest=DIGEST, idle=100.0)
    assert await log_b.kept(CHANNEL) == b""
    await log_a.keep(CHANNEL, b'{"groups":["room"]}\x00\xff')
    await log_a.keep(CHANNEL, b'{"groups":["hall"]}')  # replaced whole
    assert await log_b.kept(CHANNEL) == b'{"groups":["hall"]}'
    await log_a.open(CHANNEL, digest=DIGEST, idle=100.0)  # opened again: afresh
    assert await log_b.kept(CHANNEL) == b""
    await log_a.keep(CHANNEL, b"kept")
    bus.skew += 101
    assert await log_b.kept(CHANNEL) == b""  # expired with its log
    await log_a.open(CHANNEL, digest=DIGEST, idle=IDLE)
    await log_a.keep(CHANNEL, b"kept")
    await log_b.drop(CHANNEL)
    assert await log_a.kept(CHANNEL) == b""
