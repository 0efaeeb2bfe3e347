"""The Redis engine's lease batches: one per fetch call and priority (issue 17).

What a consumer sees of leases is in tests/conformance/test_leases.py, on every
engine. These tests look behind the Redis engine: how many keys and members a
batch costs, how a batch shrinks as its receipts are acknowledged, and that a
lease written by the engine before batches (one member per message) still comes
back when it ends, so that an upgrade strands no message.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from gateway.engines.base import DeliveryNotice, EngineLimits, NoticeEvent
from gateway.engines.redis.codec import receipt, receipt_token
from gateway.engines.redis.engine import RedisEngine
from gateway.engines.redis.scripts import GROUP
from tests.support import RedisServer
from tests.support.engines import FakeClock, Recorder, ids, make_message, notify_address

pytestmark = pytest.mark.anyio

QUEUE = "/queue/work"
LEASES = f"asbp:q:{QUEUE}:l4"
LISTS = f"asbp:q:{QUEUE}:lb"
STREAM = f"asbp:q:{QUEUE}:s4"
Make = Callable[..., Awaitable[RedisEngine]]


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(tmp_path / "redis") as server:
        yield server


@pytest.fixture
async def make(redis_server: RedisServer) -> AsyncIterator[Make]:
    started: list[RedisEngine] = []

    async def make(**options: Any) -> RedisEngine:
        engine = RedisEngine(redis_server.url, broker_id="broker-a", **options)
        await engine.start()
        started.append(engine)
        return engine

    try:
        yield make
    finally:
        for engine in reversed(started):
            await engine.close()


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_server.url)
    try:
        yield client
    finally:
        await client.aclose()


async def test_a_fetch_of_a_hundred_is_one_lease(make: Make, client: Redis) -> None:
    engine = await make()
    for _ in range(100):
        await engine.enqueue(make_message(QUEUE))
    deliveries = await engine.fetch(QUEUE, "consumer", count=100)
    assert len(deliveries) == 100
    assert await client.zcard(LEASES) == 1
    assert await client.hlen(LISTS) == 1

    assert await engine.ack(QUEUE, [d.receipt for d in deliveries[:40]]) == 40
    [tokens] = await client.hvals(LISTS)
    assert len(tokens.split()) == 60  # what is still leased, in one list
    assert await engine.ack(QUEUE, [d.receipt for d in deliveries[:40]]) == 0  # not twice

    assert await engine.ack(QUEUE, [d.receipt for d in deliveries[40:]]) == 60
    assert await client.zcard(LEASES) == 0
    assert await client.exists(LISTS) == 0
    assert await client.xlen(STREAM) == 0


async def test_an_ended_batch_comes_back_in_parts(make: Make, client: Redis) -> None:
    clock = FakeClock()
    engine = await make(clock=clock, limits=EngineLimits(ack_timeout=10))
    messages = [make_message(QUEUE, clock) for _ in range(5)]
    for message in messages:
        await engine.enqueue(message)
    first = await engine.fetch(QUEUE, "consumer", count=5)
    clock.advance(10)  # the batch's lease ends

    again = await engine.fetch(QUEUE, "consumer", count=2)
    assert ids(again) == ids(messages[:2])
    assert [d.delivery_count for d in again] == [2, 2]
    # The three this fetch had no room for wait, ended, for the next one; the
    # first batch's receipts are dead.
    assert await engine.ack(QUEUE, [d.receipt for d in first]) == 0
    rest = await engine.fetch(QUEUE, "consumer", count=10)
    assert ids(rest) == ids(messages[2:])
    assert await engine.ack(QUEUE, [d.receipt for d in again + rest]) == 5
    assert await client.zcard(LEASES) == 0
    assert await client.exists(LISTS) == 0


async def test_a_lease_from_before_batches_comes_back_when_it_ends(
    make: Make, client: Redis
) -> None:
    clock = FakeClock()
    engine = await make(clock=clock, limits=EngineLimits(ack_timeout=10))
    message = make_message(QUEUE, clock)
    await engine.enqueue(message)
    # What the engine did before batches: the entry read for a consumer, and one
    # member '<stream id>:<count>:<tag>' scored by its deadline in milliseconds.
    read = await client.xreadgroup(GROUP, "broker-a", {STREAM: ">"}, count=1)
    stream_id = read[0][1][0][0].decode()
    await client.zadd(LEASES, {f"{stream_id}:1:0123456789ab": int((clock() + 10) * 1000)})
    assert await engine.fetch(QUEUE, "consumer") == []  # leased until then

    clock.advance(10)
    [again] = await engine.fetch(QUEUE, "consumer")
    assert (again.message.id, again.delivery_count) == (message.id, 2)
    assert await engine.ack(QUEUE, [again.receipt]) == 1
    assert await engine.depth(QUEUE) == 0
    assert await client.zcard(LEASES) == 0


async def test_the_sweep_removes_an_expired_message_under_a_lease_from_before_batches(
    make: Make, client: Redis
) -> None:
    clock = FakeClock()
    engine = await make(clock=clock, sweep_interval=None, limits=EngineLimits(ack_timeout=10))
    notices: Recorder[DeliveryNotice] = Recorder()
    engine.on_notice(notices)
    message = make_message(
        QUEUE,
        clock,
        expiration=clock() + 5,
        notify=notify_address("broker-a"),
        notices={NoticeEvent.EXPIRED},
    )
    await engine.enqueue(message)
    read = await client.xreadgroup(GROUP, "broker-a", {STREAM: ">"}, count=1)
    stream_id = read[0][1][0][0].decode()
    await client.zadd(LEASES, {f"{stream_id}:1:0123456789ab": int((clock() + 10) * 1000)})

    clock.advance(10)
    assert await engine.sweep() == 1
    [notice] = await notices.wait_count(1)
    assert (notice.event, notice.message_id) == (NoticeEvent.EXPIRED, message.id)
    assert await engine.depth(QUEUE) == 0
    assert await client.zcard(LEASES) == 0


async def test_acknowledged_entries_leave_redis_in_any_order(make: Make, client: Redis) -> None:
    # Entries below the oldest pending one go by XTRIM, the others by XDEL: the
    # stream holds exactly what is not acknowledged, whatever the order of acks.
    engine = await make()
    for _ in range(5):
        await engine.enqueue(make_message(QUEUE))
    leased = await engine.fetch(QUEUE, "consumer", count=5)
    waiting = [make_message(QUEUE) for _ in range(3)]
    for message in waiting:  # stored after the fetch: not delivered yet
        await engine.enqueue(message)

    for picked, left in [((1, 3), 6), ((4,), 5), ((0,), 4), ((2,), 3)]:
        assert await engine.ack(QUEUE, [leased[n].receipt for n in picked]) == len(picked)
        assert await client.xlen(STREAM) == left
        assert await engine.depth(QUEUE) == left
    rest = await engine.fetch(QUEUE, "consumer", count=10)
    assert ids(rest) == ids(waiting)
    assert await engine.ack(QUEUE, [d.receipt for d in rest]) == 3
    assert await client.xlen(STREAM) == 0


async def test_batches_that_end_together_come_back_in_stream_order(make: Make) -> None:
    clock = FakeClock()
    engine = await make(clock=clock, limits=EngineLimits(ack_timeout=10))
    messages = [make_message(QUEUE, clock) for _ in range(6)]
    for message in messages:
        await engine.enqueue(message)
    # Three batches, one deadline: which batch Redis lists first depends on the
    # fetch calls' random tags, never on what they hold.
    for _ in range(3):
        assert len(await engine.fetch(QUEUE, "consumer", count=2)) == 2
    clock.advance(10)

    again = [d for _ in range(6) for d in await engine.fetch(QUEUE, "consumer", count=1)]
    assert ids(again) == ids(messages)
    assert [d.delivery_count for d in again] == [2] * 6


@pytest.mark.parametrize(
    ("count", "noticed", "expected"),
    [
        (1, False, ("4", "1712345678901-12", "a1b2c3")),
        (3, True, ("4n", "1712345678901-12:3", "a1b2c3")),
    ],
)
def test_a_receipt_names_its_batch_and_its_token_in_the_list(
    count: int, noticed: bool, expected: tuple[str, str, str]
) -> None:
    text = receipt(4, "1712345678901-12", count, "a1b2c3", noticed)
    assert receipt_token(text) == expected
    assert receipt_token(text + ":x") is None  # a tag has no ':': not one of ours


async def test_an_ack_of_several_batches_past_one_script_call(make: Make, client: Redis) -> None:
    engine = await make()
    for _ in range(3 * 200):
        await engine.enqueue(make_message(QUEUE))
    batches = [await engine.fetch(QUEUE, "consumer", count=200) for _ in range(3)]
    receipts = [d.receipt for batch in batches for d in batch]
    # 600 receipts in three groups: more than one script call takes (MAX_PER_SCRIPT).
    assert await engine.ack(QUEUE, receipts) == 600
    assert await engine.ack(QUEUE, receipts) == 0
    assert await engine.depth(QUEUE) == 0
    assert await client.zcard(LEASES) == 0
    assert await client.exists(LISTS) == 0
