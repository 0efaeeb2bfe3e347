"""Packed stream entries on the Redis plane (gateway/plane/redis/batches.py): what an
older broker is sent, what a newer one reads, what a dead broker's stream gives to
a Channel's log, and what a broken entry does (nothing to the rest)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest

from gateway.engines.redis.connection import Client, connect
from gateway.plane.base import Envelope, EnvelopeKind, PlaneUnavailable
from gateway.plane.redis.batches import (
    pack_answers,
    pack_meta,
    pack_record,
    targets_of,
    unpack_answers,
    unpack_frames,
    unpack_records,
)
from gateway.plane.redis.keys import directory_prefix, live_key, stream_key
from gateway.plane.redis.plane import RedisPlane
from gateway.routing.remote import ForwardingOutbox
from tests.support import RedisServer, T

pytestmark = pytest.mark.anyio

PREFIX = "batches:"
CHANNEL = "0123456789abcdef0123456789abcdef"
DIGEST = b"d" * 32


@dataclass
class Broker:
    plane: RedisPlane
    inbound: asyncio.Queue[Envelope] = field(default_factory=asyncio.Queue)
    lost: asyncio.Queue[str] = field(default_factory=asyncio.Queue)


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory: Path = tmp_path_factory.mktemp("batches-redis")
    with RedisServer(directory) as server:
        yield server.url


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[Client]:
    client = connect(redis_url, connect_timeout=T, command_timeout=5 * T)
    await client.flushall()
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture(params=[30.0])
async def brokers(
    request: pytest.FixtureRequest, redis_url: str, client: Client
) -> AsyncIterator[list[Broker]]:
    """Brokers A and B, with the lease the test asks for (30 s: none runs out)."""
    started: list[Broker] = []
    for broker_id in ("broker-a", "broker-b"):
        plane = RedisPlane(redis_url, broker_id=broker_id, lease=request.param, prefix=PREFIX)
        broker = Broker(plane)
        await plane.start(broker.inbound.put_nowait, broker.lost.put_nowait)
        started.append(broker)
    try:
        yield started
    finally:
        for broker in started:
            await broker.plane.close()


async def test_an_older_broker_is_sent_one_entry_per_envelope_in_the_old_format(
    brokers: list[Broker], client: Client
) -> None:
    a, b = brokers
    b.plane.serving("echo")
    await b.plane.written()
    await b.plane.abandon()  # reads nothing more: its stream keeps what it is sent
    # What a broker from before packed entries writes beside its stream.
    await client.set(live_key(PREFIX, "broker-b"), "1", keepttl=True)
    requests = [
        Envelope(EnvelopeKind.REQUEST, "broker-a", CHANNEL, b"c=echo,u=%d;" % n, ("x", "y"))
        for n in range(3)
    ]
    frames = [
        Envelope(EnvelopeKind.CHANNEL, "broker-a", CHANNEL, b"c=r,u=%d;" % n) for n in range(3)
    ]
    placed = [a.plane.forward_request("echo", envelope) for envelope in requests]
    sent = [a.plane.send_to("broker-b", envelope) for envelope in frames]
    assert await asyncio.gather(*placed) == ["broker-b"] * 3
    assert all(await asyncio.gather(*sent))
    entries = await client.xrange(stream_key(PREFIX, "broker-b"))
    assert entries is not None
    assert [fields for _, fields in entries] == [
        {b"k": e.kind.value.encode(), b"o": b"broker-a", b"i": CHANNEL.encode(),
         b"g": "\n".join(e.among).encode(), b"f": e.frame}
        for e in (*requests, *frames)
    ]  # fmt: skip


async def test_a_newer_broker_reads_old_entries_and_skips_broken_packed_ones(
    brokers: list[Broker], client: Client
) -> None:
    a, _ = brokers
    stream = stream_key(PREFIX, "broker-a")
    old = Envelope(EnvelopeKind.CHANNEL, "broker-b", CHANNEL, b"c=old;")
    await client.xadd(stream, {"k": "c", "o": "broker-b", "i": CHANNEL, "g": "", "f": b"c=old;"})
    whole = Envelope(EnvelopeKind.REQUEST, "broker-b", CHANNEL, b"c=whole;")
    # A record whole, then one cut short; frames whole, then one cut short.
    await client.xadd(stream, {"k": "b", "o": "broker-b", "f": pack_record(whole) + b"\x71\x00"})
    packed = b"\x00\x00\x00\x07c=five;" + b"\x00\x00\x00\x09c=n"
    await client.xadd(stream, {"k": "d", "o": "broker-b", "i": CHANNEL, "f": packed})
    # An unknown envelope kind inside a record; a record shorter than its header says.
    await client.xadd(stream, {"k": "b", "o": "broker-b", "f": b"\x01" + pack_record(whole)[1:]})
    await client.xadd(stream, {"k": "b", "o": "broker-b", "f": pack_record(whole)[:-2]})
    after = Envelope(EnvelopeKind.CHANNEL, "broker-b", CHANNEL, b"c=after;")
    assert await brokers[1].plane.send_to("broker-a", after)
    with anyio.fail_after(5 * T):
        got = [await a.inbound.get() for _ in range(4)]
    five = Envelope(EnvelopeKind.CHANNEL, "broker-b", CHANNEL, b"c=five;")
    assert got == [old, whole, five, after]


@pytest.mark.parametrize("brokers", [3.0], indirect=True)
async def test_frames_packed_for_a_dead_holder_go_into_the_channels_log(
    brokers: list[Broker],
) -> None:
    a, b = brokers
    log_a, log_b = a.plane.channel_log, b.plane.channel_log
    await log_a.open(CHANNEL, digest=DIGEST, idle=60.0)
    assert await log_a.hold(CHANNEL) == ("", 0)
    a.plane.channel_opened(CHANNEL)
    await a.plane.written()
    await a.plane.abandon()  # dies: what it is sent now it never reads
    frames = [b"c=r,u=%d;" % n for n in range(5)]
    sent = [
        b.plane.send_to("broker-a", Envelope(EnvelopeKind.CHANNEL, "broker-b", CHANNEL, f))
        for f in frames
    ]
    assert all(await asyncio.gather(*sent))
    # B's renewal sweeps A once its lease is gone, salvaging its stream, then
    # reports it lost.
    with anyio.fail_after(b.plane.lease + 5 * T):
        assert await b.lost.get() == "broker-a"
    read = await log_b.read(CHANNEL, 0, 10, 0)
    assert read is not None
    assert [frame for _, frame in read.frames] == frames


async def test_forwards_after_close_fail_as_unavailable(brokers: list[Broker]) -> None:
    a, _ = brokers
    a.plane.serving("other")  # a name A serves: a batch for it holds nothing to B
    await a.plane.close()
    request = Envelope(EnvelopeKind.REQUEST, "broker-a", CHANNEL, b"c=echo;")
    frame = Envelope(EnvelopeKind.CHANNEL, "broker-a", CHANNEL, b"c=echo.reply;")
    for future in (a.plane.forward_request("echo", request), a.plane.send_to("broker-b", frame)):
        with pytest.raises(PlaneUnavailable):
            await future


async def test_a_refused_batch_fails_every_forward_in_it(
    brokers: list[Broker], client: Client
) -> None:
    a, b = brokers
    b.plane.serving("echo")
    await b.plane.written()
    # B's stream is not a stream any more: Redis refuses the XADD (WRONGTYPE).
    await client.delete(stream_key(PREFIX, "broker-b"))
    await client.set(stream_key(PREFIX, "broker-b"), "not a stream")
    request = Envelope(EnvelopeKind.REQUEST, "broker-a", CHANNEL, b"c=echo;")
    frame = Envelope(EnvelopeKind.CHANNEL, "broker-a", CHANNEL, b"c=echo.reply;")
    placed = [a.plane.forward_request("echo", request) for _ in range(3)]
    sent = [a.plane.send_to("broker-b", frame) for _ in range(3)]
    for outcome in await asyncio.gather(*placed, *sent, return_exceptions=True):
        assert isinstance(outcome, PlaneUnavailable)
    await client.delete(stream_key(PREFIX, "broker-b"))


async def test_requests_for_the_one_serving_broker_go_as_one_entry(
    brokers: list[Broker], client: Client
) -> None:
    # One live broker serves the name: the script passes the records on as the blob
    # they came in (no splitting in Lua), and its one target stands for them all.
    a, b = brokers
    b.plane.serving("echo")
    await b.plane.written()
    await b.plane.abandon()  # reads nothing more: its stream keeps what it is sent
    requests = [
        Envelope(EnvelopeKind.REQUEST, "broker-a", CHANNEL, b"c=echo,u=%d;" % n, ("x",))
        for n in range(5)
    ]
    placed = [a.plane.forward_request("echo", envelope) for envelope in requests]
    assert await asyncio.gather(*placed) == ["broker-b"] * 5
    entries = await client.xrange(stream_key(PREFIX, "broker-b"))
    assert entries is not None
    assert [fields for _, fields in entries] == [
        {b"k": b"b", b"o": b"broker-a", b"f": b"".join(pack_record(e) for e in requests)}
    ]
    # Each request counted against B, as one call per request would have.
    assert await client.hget(directory_prefix(PREFIX) + "name:echo", "broker-b") == b"5"


async def test_requests_spread_over_several_serving_brokers_keep_their_order(
    redis_url: str, client: Client
) -> None:
    # Two live brokers serve the name: the script splits the records between them,
    # each target's in the order they were forwarded, and says where each went.
    started: list[Broker] = []
    for broker_id in ("broker-a", "broker-b", "broker-c"):
        plane = RedisPlane(redis_url, broker_id=broker_id, lease=30.0, prefix=PREFIX)
        broker = Broker(plane)
        await plane.start(broker.inbound.put_nowait, broker.lost.put_nowait)
        started.append(broker)
    try:
        a, b, c = started
        for server in (b, c):
            server.plane.serving("echo")
            await server.plane.written()
        requests = [
            Envelope(EnvelopeKind.REQUEST, "broker-a", CHANNEL, b"c=echo,u=%d;" % n)
            for n in range(6)
        ]
        placed = await asyncio.gather(
            *(a.plane.forward_request("echo", envelope) for envelope in requests)
        )
        # Balanced by the count of each: three each.
        assert sorted(str(t) for t in placed) == ["broker-b"] * 3 + ["broker-c"] * 3
        with anyio.fail_after(5 * T):
            for server, broker_id in ((b, "broker-b"), (c, "broker-c")):
                mine = [e for e, t in zip(requests, placed, strict=True) if t == broker_id]
                assert [await server.inbound.get() for _ in mine] == mine
    finally:
        for broker in started:
            await broker.plane.close()


async def test_a_reply_of_the_wrong_length_fails_the_batch() -> None:
    assert targets_of([b"b"], 3) == [b"b", b"b", b"b"]
    assert targets_of([b"b", b"c"], 2) == [b"b", b"c"]
    with pytest.raises(ValueError, match="2 targets for 3 requests"):
        targets_of([b"b", b"c"], 3)


async def test_frames_in_one_call_share_one_future(brokers: list[Broker], client: Client) -> None:
    # Frames for one Channel gathered into one call are one entry: one outcome, so one
    # future stands for them all (a caller needs one callback, not one a frame).
    a, b = brokers
    frames = [
        Envelope(EnvelopeKind.CHANNEL, "broker-a", CHANNEL, b"c=r,u=%d;" % n) for n in range(3)
    ]
    sent = [a.plane.send_to("broker-b", envelope) for envelope in frames]
    assert sent[0] is sent[1] is sent[2]
    assert await sent[0] is True
    with anyio.fail_after(5 * T):
        assert [await b.inbound.get() for _ in frames] == frames
    # B's lease beside its stream is gone: the next call's frames all say so.
    await client.delete(live_key(PREFIX, "broker-b"))
    later = [a.plane.send_to("broker-b", envelope) for envelope in frames]
    assert later[0] is later[2] and later[0] is not sent[0]
    assert await asyncio.gather(*later) == [False] * 3


async def test_frames_of_one_call_to_a_gone_broker_follow_the_channel_in_order(
    brokers: list[Broker],
) -> None:
    # A proxy's outbox at A holds one callback for the frames of one call; the
    # broker it names is gone (no lease beside its stream), so each frame, in
    # order, follows the Channel to where the directory says it is now: B.
    a, b = brokers
    b.plane.channel_opened(CHANNEL)
    await b.plane.written()
    outbox = ForwardingOutbox(a.plane, "broker-gone", CHANNEL, logging.getLogger("test"))
    frames = [b"c=r,u=%d;" % n for n in range(4)]
    assert all(outbox.offer(frame) for frame in frames)
    with anyio.fail_after(5 * T):
        got = [await b.inbound.get() for _ in frames]
    assert got == [Envelope(EnvelopeKind.CHANNEL, "broker-a", CHANNEL, f) for f in frames]


def _named(n: int, among: tuple[str, ...] = ()) -> Envelope:
    """A request that says its name and ``u`` beside its frame (as Remote.request does);
    the third of every three has no ``u``."""
    command_id = None if n % 3 == 2 else n
    frame = b"c=echo;" if command_id is None else b"c=echo,u=%d;" % n
    return Envelope(EnvelopeKind.REQUEST, "broker-a", CHANNEL, frame, among, "echo", command_id)


async def test_requests_carry_their_name_and_u_beside_the_records(
    brokers: list[Broker], client: Client
) -> None:
    # One target takes the whole call: the entry carries the field "m" (the name,
    # each record's u), and the reader hands each envelope on with them, so the
    # serving broker routes it without decoding the frame.
    a, b = brokers
    b.plane.serving("echo")
    await b.plane.written()
    requests = [_named(n, ("x",)) for n in range(5)]
    placed = [a.plane.forward_request("echo", envelope) for envelope in requests]
    assert await asyncio.gather(*placed) == ["broker-b"] * 5
    with anyio.fail_after(5 * T):
        assert [await b.inbound.get() for _ in requests] == requests


async def test_records_with_their_meta_are_what_an_older_reader_reads(
    brokers: list[Broker], client: Client
) -> None:
    # Mixed versions: the records are unchanged and "m" is one more field, which a
    # reader that predates it never looks at (it reads k, o and f); a broker from
    # before packed entries (live "1") gets the old entries, without it.
    a, b = brokers
    b.plane.serving("echo")
    await b.plane.written()
    await b.plane.abandon()  # reads nothing more: its stream keeps what it is sent
    requests = [_named(n) for n in range(4)]
    placed = [a.plane.forward_request("echo", envelope) for envelope in requests]
    assert await asyncio.gather(*placed) == ["broker-b"] * 4
    stream = stream_key(PREFIX, "broker-b")
    entries = await client.xrange(stream)
    assert entries is not None
    assert [fields for _, fields in entries] == [
        {
            b"k": b"b",
            b"o": b"broker-a",
            b"f": b"".join(pack_record(e) for e in requests),
            b"m": b"echo\n0,1,,3",
        }
    ]
    # What an older reader makes of "f" alone: the envelopes, without the meta.
    assert list(unpack_records("broker-a", entries[0][1][b"f"])) == [
        Envelope(e.kind, e.origin, e.channel, e.frame, e.among) for e in requests
    ]
    await client.delete(stream)
    await client.set(live_key(PREFIX, "broker-b"), "1", keepttl=True)
    placed = [a.plane.forward_request("echo", envelope) for envelope in requests]
    assert await asyncio.gather(*placed) == ["broker-b"] * 4
    entries = await client.xrange(stream)
    assert entries is not None
    assert [fields for _, fields in entries] == [
        {b"k": b"q", b"o": b"broker-a", b"i": CHANNEL.encode(), b"g": b"", b"f": e.frame}
        for e in requests
    ]


async def test_requests_split_among_brokers_go_without_their_meta(
    redis_url: str, client: Client
) -> None:
    # Where the script splits the records among several targets it sends no meta:
    # each broker gets its requests whole, and decodes them as it always did.
    started: list[Broker] = []
    for broker_id in ("broker-a", "broker-b", "broker-c"):
        plane = RedisPlane(redis_url, broker_id=broker_id, lease=30.0, prefix=PREFIX)
        broker = Broker(plane)
        await plane.start(broker.inbound.put_nowait, broker.lost.put_nowait)
        started.append(broker)
    try:
        a, b, c = started
        for server in (b, c):
            server.plane.serving("echo")
            await server.plane.written()
        requests = [_named(n) for n in range(6)]
        placed = await asyncio.gather(
            *(a.plane.forward_request("echo", envelope) for envelope in requests)
        )
        assert sorted(str(t) for t in placed) == ["broker-b"] * 3 + ["broker-c"] * 3
        with anyio.fail_after(5 * T):
            for server, broker_id in ((b, "broker-b"), (c, "broker-c")):
                mine = [e for e, t in zip(requests, placed, strict=True) if t == broker_id]
                assert [await server.inbound.get() for _ in mine] == [
                    Envelope(e.kind, e.origin, e.channel, e.frame, e.among) for e in mine
                ]
    finally:
        for broker in started:
            await broker.plane.close()


async def test_a_call_with_a_request_that_does_not_say_its_name_goes_without_meta(
    brokers: list[Broker], client: Client
) -> None:
    a, b = brokers
    b.plane.serving("echo")
    await b.plane.written()
    await b.plane.abandon()
    plain = Envelope(EnvelopeKind.AGENT, "broker-a", "tube-1", b"c=echo;")
    requests = [_named(0), plain, _named(1)]
    placed = [a.plane.forward_request("echo", envelope) for envelope in requests]
    assert await asyncio.gather(*placed) == ["broker-b"] * 3
    entries = await client.xrange(stream_key(PREFIX, "broker-b"))
    assert entries is not None
    assert [set(fields) for _, fields in entries] == [{b"k", b"o", b"f"}]


def test_meta_covers_the_records_it_names() -> None:
    first = Envelope(EnvelopeKind.REQUEST, "o", CHANNEL, b"c=echo,u=7;")
    second = Envelope(EnvelopeKind.REQUEST, "o", CHANNEL, b"c=echo,u=8;")
    blob = pack_record(first) + pack_record(second)
    assert pack_meta("echo", [7]) == b"echo\n7"
    # Meta for the first record only: the second goes without (and is decoded).
    assert list(unpack_records("o", blob, b"echo\n7")) == [
        Envelope(EnvelopeKind.REQUEST, "o", CHANNEL, b"c=echo,u=7;", (), "echo", 7),
        second,
    ]
    with pytest.raises(ValueError):
        list(unpack_records("o", blob, b"echo\nseven"))


async def test_a_broken_meta_is_reported_and_the_reader_goes_on(
    brokers: list[Broker], client: Client
) -> None:
    a, _ = brokers
    stream = stream_key(PREFIX, "broker-a")
    whole = Envelope(EnvelopeKind.REQUEST, "broker-b", CHANNEL, b"c=whole;")
    await client.xadd(stream, {"k": "b", "o": "broker-b", "f": pack_record(whole), "m": "x\nz"})
    after = Envelope(EnvelopeKind.CHANNEL, "broker-b", CHANNEL, b"c=after;")
    assert await brokers[1].plane.send_to("broker-a", after)
    with anyio.fail_after(5 * T):
        assert await a.inbound.get() == after


async def test_whole_answers_say_their_u_beside_the_frames(
    brokers: list[Broker], client: Client
) -> None:
    # Frames for one Channel in one call: the entry's "m" gives each whole answer's
    # u (empty for the others), and the reader hands each frame on with it; an
    # older reader reads "f" as before, and a broker from before packed entries
    # gets old entries, without it.
    a, b = brokers
    frames = [
        Envelope(EnvelopeKind.CHANNEL, "broker-a", CHANNEL, b"c=r,u=%d;" % n, (), None, u)
        for n, u in enumerate((0, None, 2))
    ]
    sent = [a.plane.send_to("broker-b", envelope) for envelope in frames]
    assert all(await asyncio.gather(*sent))
    with anyio.fail_after(5 * T):
        assert [await b.inbound.get() for _ in frames] == frames
    await b.plane.abandon()
    stream = stream_key(PREFIX, "broker-b")
    await client.delete(stream)
    sent = [a.plane.send_to("broker-b", envelope) for envelope in frames]
    assert all(await asyncio.gather(*sent))
    entries = await client.xrange(stream)
    assert entries is not None
    packed = b"".join(len(e.frame).to_bytes(4, "big") + e.frame for e in frames)
    assert [fields for _, fields in entries] == [
        {b"k": b"d", b"o": b"broker-a", b"i": CHANNEL.encode(), b"f": packed, b"m": b"0,,2"}
    ]
    assert list(unpack_frames(packed)) == [e.frame for e in frames]
    await client.delete(stream)
    await client.set(live_key(PREFIX, "broker-b"), "1", keepttl=True)
    sent = [a.plane.send_to("broker-b", envelope) for envelope in frames]
    assert all(await asyncio.gather(*sent))
    entries = await client.xrange(stream)
    assert entries is not None
    assert [fields for _, fields in entries] == [
        {b"k": b"c", b"o": b"broker-a", b"i": CHANNEL.encode(), b"g": b"", b"f": e.frame}
        for e in frames
    ]


async def test_frames_without_answers_go_without_meta(
    brokers: list[Broker], client: Client
) -> None:
    a, b = brokers
    await b.plane.abandon()
    frames = [Envelope(EnvelopeKind.CHANNEL, "broker-a", CHANNEL, b"c=news;") for _ in range(2)]
    assert all(await asyncio.gather(*(a.plane.send_to("broker-b", e) for e in frames)))
    entries = await client.xrange(stream_key(PREFIX, "broker-b"))
    assert entries is not None
    assert [set(fields) for _, fields in entries] == [{b"k", b"o", b"i", b"f"}]


def test_answers_meta_round_trips() -> None:
    assert pack_answers([None, None]) == b""
    assert pack_answers([3, None, 12]) == b"3,,12"
    assert unpack_answers(b"3,,12") == [3, None, 12]
    assert unpack_answers(None) == []
    with pytest.raises(ValueError):
        unpack_answers(b"3,x")


async def test_a_broken_answers_meta_is_reported_and_the_reader_goes_on(
    brokers: list[Broker], client: Client
) -> None:
    a, _ = brokers
    stream = stream_key(PREFIX, "broker-a")
    packed = b"\x00\x00\x00\x07c=five;"
    await client.xadd(stream, {"k": "d", "o": "broker-b", "i": CHANNEL, "f": packed, "m": "x"})
    # Meta for fewer frames than the entry holds: the rest go without.
    await client.xadd(stream, {"k": "d", "o": "broker-b", "i": CHANNEL, "f": packed * 2, "m": "4"})
    with anyio.fail_after(5 * T):
        got = [await a.inbound.get() for _ in range(2)]
    five = Envelope(EnvelopeKind.CHANNEL, "broker-b", CHANNEL, b"c=five;")
    assert got == [five._replace(command_id=4), five]
