"""The release barrier (gateway.plane.redis.release_barriers): when a broker lifts the
barriers it put up (pure bookkeeping: the reader's position against the last entry
forwarded to it for each Channel), and what it is for, on the planes that keep it: a
log takes the frames in the order they were routed, the ones a broker passes on after
its release before the ones routed after them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import anyio
import pytest

from gateway.engines.base import EngineUnavailable
from gateway.plane.base import Envelope, EnvelopeKind, LogRetention
from gateway.plane.redis.counted_barriers import CountedBarriers
from gateway.plane.redis.plane import RedisPlane
from gateway.plane.redis.release_barriers import ReleaseBarriers, entry_order
from tests.support import RedisServer, T
from tests.support.planes import Bus

CHANNEL = "0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize(
    ("entry_id", "order"),
    [(b"0-0", (0, 0)), (b"1700000000000-12", (1700000000000, 12)), (b"5", (5, 0))],
)
def test_entry_ids_order_as_redis_orders_them(entry_id: bytes, order: tuple[int, int]) -> None:
    assert entry_order(entry_id) == order
    assert entry_order(b"9-10") > entry_order(b"9-9")  # not as text would


def test_a_barrier_lifts_once_the_reader_has_handled_the_newest_entry_at_the_release() -> None:
    lifted: list[str] = []
    barriers = ReleaseBarriers(lifted.append)
    barriers.released("empty", None)  # nothing was on its way: at once
    assert lifted == ["empty"]
    barriers.handled(b"10-0")
    barriers.released("handled", b"9-5")  # the reader is past it already: at once
    assert lifted == ["empty", "handled"]
    barriers.released("x", b"12-0")
    barriers.released("y", b"11-3")
    barriers.released("x", b"11-0")  # released again, earlier: the later entry stands
    barriers.handled(b"11-2")
    assert lifted == ["empty", "handled"]
    barriers.handled(b"11-3")
    assert lifted == ["empty", "handled", "y"]
    barriers.handled(b"12-0")
    assert lifted == ["empty", "handled", "y", "x"]
    barriers.handled(b"13-0")  # lifted once each
    assert lifted == ["empty", "handled", "y", "x"]


def test_a_counted_barrier_lifts_once_the_reader_has_read_every_frame_sent() -> None:
    lifted: list[str] = []
    now = [0.0]
    barriers = CountedBarriers(lifted.append, give_up=10.0, clock=lambda: now[0])
    barriers.holding("x")
    barriers.read("x")
    assert barriers.count("x") == 1
    barriers.read("not-held")  # not counted: nothing to wait for there
    assert barriers.count("not-held") == 0
    barriers.released("x", 3)  # three were sent, one read: up until two more are
    barriers.read("x")
    assert lifted == []
    barriers.read("x")
    assert lifted == ["x"]
    barriers.read("x")  # lifted once; the count is gone with it
    assert (lifted, barriers.count("x")) == (["x"], 0)
    barriers.holding("y")
    barriers.read("y")
    barriers.read("y")
    barriers.released("y", 2)  # all read before the release's answer: at once
    assert lifted == ["x", "y"]
    barriers.holding("z")
    barriers.released("z", 0)  # no barrier went up
    barriers.released("gone", None)  # not held here
    assert lifted == ["x", "y"]


def test_a_counted_barrier_whose_frames_never_come_is_lifted_after_give_up() -> None:
    lifted: list[str] = []
    now = [100.0]
    barriers = CountedBarriers(lifted.append, give_up=10.0, clock=lambda: now[0])
    barriers.expire()  # nothing up
    barriers.holding("x")
    barriers.released("x", 1)  # its sender died between its two calls
    barriers.holding("dropped")
    barriers.released("dropped", 5)
    barriers.forget("dropped")  # the log went: nothing to lift
    now[0] = 109.0
    barriers.expire()
    assert lifted == []
    now[0] = 110.0
    barriers.expire()
    assert lifted == ["x"]
    barriers.holding("again")
    barriers.released("again", 4)
    barriers.holding("again")  # held here again: the hold lifted the barrier
    now[0] = 200.0
    barriers.expire()
    assert lifted == ["x"]


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("release-barriers-redis")) as server:
        yield server


async def _bus(request: pytest.FixtureRequest) -> AsyncIterator[Bus]:
    url = None
    if request.param == "redis":
        url = request.getfixturevalue("redis_server").url
    elif request.param == "redis-cluster":
        url = request.getfixturevalue("redis_cluster").url
    built = Bus(request.param, url, lease=3.0)
    try:
        yield built
    finally:
        await built.close()


@pytest.fixture(params=("memory", "redis", "redis-cluster"))
async def bus(request: pytest.FixtureRequest) -> AsyncIterator[Bus]:
    # The barrier on every plane: an entry ID on one Redis, a count on a Redis Cluster
    # (gateway.plane.redis.counted_barriers), one loop turn in memory.
    async for built in _bus(request):
        yield built


@pytest.fixture(params=("redis", "redis-cluster"))
async def redis_bus(request: pytest.FixtureRequest) -> AsyncIterator[Bus]:
    """Planes on Redis: a broker that dies stays in the directory for its lease (in
    memory it is gone at once, so nothing is ever sent to it)."""
    async for built in _bus(request):
        yield built


#: More than the plane's reader takes in one read (1024): some are still in A's stream,
#: unread, when B routes the next frames, however fast A reads.
FIRST = 1100


@pytest.mark.anyio
async def test_frames_passed_on_after_a_release_go_into_the_log_before_later_ones(
    bus: Bus,
) -> None:
    # Broker A holds the Channel; B forwards frames to it. A's connection drops as A
    # delivers the first one: A releases the log, and B routes more frames at once.
    # What A reads after the release it passes on, as its router does; the log must
    # have all of it before B's later frames, whichever reached Redis first.
    first = [b"c=news,u=%d;" % u for u in range(1, FIRST + 1)]
    later = [b"c=news,u=%d;" % u for u in range(FIRST + 1, FIRST + 21)]
    delivered: list[bytes] = []
    routed: list[asyncio.Future[str | None]] = []

    def at_a(envelope: Envelope) -> None:
        if envelope.kind is not EnvelopeKind.CHANNEL or envelope.origin == "broker-a":
            return
        if not delivered:
            delivered.append(envelope.frame)  # to the connection, which drops now
            a.plane.channel_log.release(CHANNEL)
            for frame in later:
                news = Envelope(EnvelopeKind.CHANNEL, "broker-b", CHANNEL, frame)
                routed.append(b.plane.forward_to_channel(CHANNEL, news))
            return
        again = Envelope(EnvelopeKind.CHANNEL, "broker-a", CHANNEL, envelope.frame)
        a.plane.forward_to_channel(CHANNEL, again)

    a = await bus.join("broker-a", inbound=at_a)
    b = await bus.join("broker-b")
    log_a, log_b = a.plane.channel_log, b.plane.channel_log
    await log_a.open(CHANNEL, digest=b"digest", idle=3600.0)
    await log_a.hold(CHANNEL)
    a.plane.channel_opened(CHANNEL)
    await a.plane.locate_channel(CHANNEL)
    for frame in first:
        b.plane.forward_to_channel(
            CHANNEL, Envelope(EnvelopeKind.CHANNEL, "broker-b", CHANNEL, frame)
        )
    with anyio.fail_after(5 * T):
        while not routed:
            await a.inbound.get()
        await asyncio.gather(*routed)
        while await log_b.pending(CHANNEL):
            await asyncio.sleep(0)  # each look is a call to the plane: no busy loop
    read = await log_b.read(CHANNEL, 0, 2 * FIRST, 0)
    assert read is not None
    assert [frame for _, frame in read.frames] == first[1:] + later


@pytest.mark.anyio
async def test_frames_held_back_are_bounded_by_the_logs_retention(bus: Bus) -> None:
    # A barrier that stays up (its broker stuck) holds back at most max_frames frames:
    # at that many it lifts, and they go into the log, in order.
    retention = LogRetention(max_frames=3)
    a = await bus.join("broker-a", retention=retention)
    b = await bus.join("broker-b", retention=retention)
    log_a, log_b = a.plane.channel_log, b.plane.channel_log
    await log_a.open(CHANNEL, digest=b"digest", idle=3600.0)
    await log_a.hold(CHANNEL)
    a.plane.channel_opened(CHANNEL)
    await a.plane.locate_channel(CHANNEL)
    news = Envelope(EnvelopeKind.CHANNEL, "broker-b", CHANNEL, b"c=news,u=0;")
    assert await b.plane.forward_to_channel(CHANNEL, news) == "broker-a"
    await log_a.release(CHANNEL)
    frames = [b"c=news,u=%d;" % u for u in range(1, 4)]
    for frame in frames:
        news = Envelope(EnvelopeKind.CHANNEL, "broker-b", CHANNEL, frame)
        assert await b.plane.forward_to_channel(CHANNEL, news) is not None
    with anyio.fail_after(5 * T):
        while await log_b.pending(CHANNEL):
            await asyncio.sleep(0)
    read = await log_b.read(CHANNEL, 0, 10, 0)
    assert read is not None
    assert [frame for _, frame in read.frames] == frames


@pytest.mark.anyio
@pytest.mark.parametrize("url", ["redis://127.0.0.1:1/0", "redis+cluster://127.0.0.1:1"])
async def test_a_release_on_an_unreachable_bus_fails_as_every_call_does(url: str) -> None:
    plane = RedisPlane(url, broker_id="broker-a")  # never started
    with pytest.raises(EngineUnavailable):
        await plane.channel_log.release(CHANNEL)


@pytest.mark.anyio
@pytest.mark.parametrize("swept", [False, True], ids=["resumed", "swept"])
async def test_a_broker_that_dies_with_its_barrier_up_is_passed_over_and_its_frames_saved(
    bus: Bus, swept: bool
) -> None:
    # As above, but A dies right after its release: what it had not read yet is still
    # in its stream. Once its lease is gone, a resume's look (pending), or else the
    # sweep of A, saves those into the log (on a Redis Cluster from the stream's slot,
    # then the log's), then the frames held back behind the barrier: nothing lost,
    # the order kept.
    first = [b"c=news,u=%d;" % u for u in range(1, FIRST + 1)]
    later = [b"c=news,u=%d;" % u for u in range(FIRST + 1, FIRST + 21)]
    routed: list[asyncio.Future[str | None]] = []
    dying: list[asyncio.Task[None]] = []

    def at_a(envelope: Envelope) -> None:
        if envelope.kind is not EnvelopeKind.CHANNEL or envelope.origin == "broker-a":
            return
        if not dying:
            a.plane.channel_log.release(CHANNEL)
            # It reads no more after this read (a crash): the rest stays in its stream.
            dying.append(asyncio.ensure_future(a.abandon()))
            for frame in later:
                news = Envelope(EnvelopeKind.CHANNEL, "broker-b", CHANNEL, frame)
                routed.append(b.plane.forward_to_channel(CHANNEL, news))
            return
        again = Envelope(EnvelopeKind.CHANNEL, "broker-a", CHANNEL, envelope.frame)
        a.plane.forward_to_channel(CHANNEL, again)

    a = await bus.join("broker-a", inbound=at_a)
    b = await bus.join("broker-b")
    log_a, log_b = a.plane.channel_log, b.plane.channel_log
    await log_a.open(CHANNEL, digest=b"digest", idle=3600.0)
    await log_a.hold(CHANNEL)
    a.plane.channel_opened(CHANNEL)
    await a.plane.locate_channel(CHANNEL)
    for frame in first:
        b.plane.forward_to_channel(
            CHANNEL, Envelope(EnvelopeKind.CHANNEL, "broker-b", CHANNEL, frame)
        )
    with anyio.fail_after(a.plane.lease + 5 * T):
        while not dying:
            await a.inbound.get()
        await asyncio.gather(*routed, *dying)
        if swept:
            assert await b.lost.get() == "broker-a"  # swept first: then reported
        while await log_b.pending(CHANNEL):
            await asyncio.sleep(0)  # each look is a call to the plane: no busy loop
    read = await log_b.read(CHANNEL, 0, 2 * FIRST, 0)
    assert read is not None
    # The first frame went to the connection that dropped; every other one is logged.
    assert [frame for _, frame in read.frames] == first[1:] + later


@pytest.mark.anyio
async def test_frames_on_their_way_to_a_holder_that_died_go_into_the_log_at_its_sweep(
    redis_bus: Bus,
) -> None:
    bus = redis_bus
    # A holds the log and dies; B forwards to it while its lease lasts. Nobody resumes
    # the Channel: B's renewal sweeps A once its lease is gone, and what A never read
    # goes into the log (on a Redis Cluster from A's stream's slot, then the log's).
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    log_a, log_b = a.plane.channel_log, b.plane.channel_log
    await log_a.open(CHANNEL, digest=b"digest", idle=3600.0)
    await log_a.hold(CHANNEL)
    a.plane.channel_opened(CHANNEL)
    await a.plane.locate_channel(CHANNEL)
    await a.abandon()
    frames = [b"c=news,u=%d;" % u for u in range(1, 6)]
    for frame in frames:
        news = Envelope(EnvelopeKind.CHANNEL, "broker-b", CHANNEL, frame)
        assert await b.plane.forward_to_channel(CHANNEL, news) == "broker-a"
    with anyio.fail_after(b.plane.lease + 5 * T):
        assert await b.lost.get() == "broker-a"
    read = await log_b.read(CHANNEL, 0, 10, 0)
    assert read is not None
    assert [frame for _, frame in read.frames] == frames
    assert await log_b.pending(CHANNEL) == ""


@pytest.mark.anyio
async def test_frames_left_at_a_dead_holder_follow_the_channel_to_its_new_holder(
    redis_bus: Bus,
) -> None:
    # A holds the log and dies with frames on their way to it; C takes the log before
    # A's lease is gone (a resume that waited its lease). When B sweeps A, what A never
    # read goes on to C (on a Redis Cluster: taken out of A's stream, then forwarded).
    bus = redis_bus
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    c = await bus.join("broker-c")
    log_a = a.plane.channel_log
    await log_a.open(CHANNEL, digest=b"digest", idle=3600.0)
    await log_a.hold(CHANNEL)
    a.plane.channel_opened(CHANNEL)
    await a.plane.locate_channel(CHANNEL)
    await a.abandon()
    frames = [b"c=news,u=%d;" % u for u in range(1, 6)]
    for frame in frames:
        news = Envelope(EnvelopeKind.CHANNEL, "broker-b", CHANNEL, frame)
        assert await b.plane.forward_to_channel(CHANNEL, news) == "broker-a"
    assert await c.plane.channel_log.hold(CHANNEL) == ("broker-a", 0)
    with anyio.fail_after(b.plane.lease + 5 * T):
        assert await b.lost.get() == "broker-a"
        got = [(await c.inbound.get()).frame for _ in frames]
    assert got == frames
