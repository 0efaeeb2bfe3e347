"""The Redis engine's own behaviour: durability, several brokers on one Redis, outages.

What every engine must do is in tests/conformance/ (which also runs two Redis
engines as two brokers). This file holds what only Redis has: the AOF across a
``kill -9`` of Redis, a Redis that goes away and comes back, the script cache
lost on restart, one script call per batch, one consumer name per broker in
the consumer groups, and wake-ups that cross brokers through pub/sub.

Every test gets its own ``redis-server`` (AOF on, ``appendfsync always``). No
test sleeps: a waiting fetch is observed through Redis keyspace notifications
on its waiting flag, and listeners through :class:`Recorder`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from redis.asyncio import Redis

from asbp import FaultCode
from gateway.engines.base import (
    MAX_DEAD_LETTERS,
    DeliveryNotice,
    EngineLimits,
    EngineUnavailable,
    Message,
    NoticeEvent,
)
from gateway.engines.redis.codec import parse_receipt, receipt, split_receipt
from gateway.engines.redis.engine import SWEEP_BUDGET, RedisEngine
from tests.support import RedisServer, T
from tests.support.engines import FakeClock, Recorder, ids, make_message, notify_address

pytestmark = pytest.mark.anyio

QUEUE = "/queue/work"
Make = Callable[..., Awaitable[RedisEngine]]


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(tmp_path / "redis", appendonly=True) as server:
        yield server


@pytest.fixture
async def make(redis_server: RedisServer) -> AsyncIterator[Make]:
    """Starts engines ("brokers") on the test's Redis; closes them at the end."""
    started: list[RedisEngine] = []

    async def make(broker_id: str = "broker-a", **options: Any) -> RedisEngine:
        engine = RedisEngine(redis_server.url, broker_id=broker_id, **options)
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
    """A plain client on the test's Redis, to look behind the engine."""
    client = Redis.from_url(redis_server.url)
    try:
        yield client
    finally:
        await client.aclose()


async def armed(client: Redis, queue: str) -> AsyncIterator[None]:
    """Yields once, then returns when a consumer of ``queue`` starts waiting.

    A waiting consumer sets ``asbp:q:<queue>:wt``; keyspace notifications
    report the SET, so the test knows the consumer waits without sleeping.
    """
    await client.config_set("notify-keyspace-events", "K$")
    pubsub = client.pubsub()
    await pubsub.subscribe(f"__keyspace@0__:asbp:q:{queue}:wt")
    try:
        await pubsub.get_message(timeout=5 * T)  # the subscribe confirmation
        yield
        with anyio.fail_after(5 * T):
            while True:
                event = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5 * T)
                if event is not None and event["data"] == b"set":
                    return
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]  # unannotated upstream


async def wait_armed(client: Redis, queue: str, start: Callable[[], object]) -> None:
    """Call ``start()`` (which starts a waiting fetch) and return once it waits."""
    watcher = armed(client, queue)
    await anext(watcher)
    start()
    with pytest.raises(StopAsyncIteration):
        await anext(watcher)


async def evalsha_calls(client: Redis) -> int:
    stats = await client.info("commandstats")
    entry = stats.get("cmdstat_evalsha")
    return int(entry["calls"]) if entry else 0


# -- durability ----------------------------------------------------------------


async def test_queued_messages_survive_a_redis_crash(make: Make, redis_server: RedisServer) -> None:
    clock = FakeClock()
    engine = await make(clock=clock, limits=EngineLimits(ack_timeout=30.0))
    urgent = make_message(QUEUE, clock, priority=9)
    leased = make_message(QUEUE, clock, priority=4)
    waiting = make_message(QUEUE, clock, priority=1)
    delayed = make_message(QUEUE, clock, not_before=clock() + 10)
    for message in (urgent, leased, waiting, delayed):
        await engine.enqueue(message)
    first = await engine.fetch(QUEUE, "consumer", count=2)
    assert ids(first) == [urgent.id, leased.id]
    assert await engine.ack(QUEUE, [first[0].receipt]) == 1

    redis_server.kill()  # SIGKILL: only what the AOF holds comes back
    redis_server.start()

    # The same engine carries on: fresh connections, scripts loaded again.
    assert await engine.depth(QUEUE) == 3
    assert ids(await engine.fetch(QUEUE, "consumer", count=10)) == [waiting.id]
    clock.advance(31)  # both leases ran out, the delay ended
    again = await engine.fetch(QUEUE, "consumer", count=10)
    assert ids(again) == [leased.id, delayed.id, waiting.id]
    assert [d.delivery_count for d in again] == [2, 1, 2]
    assert again[0].message == first[1].message
    assert await engine.ack(QUEUE, [d.receipt for d in again]) == 3
    assert await engine.depth(QUEUE) == 0


async def test_a_new_engine_finds_what_an_old_one_left(make: Make) -> None:
    clock = FakeClock()
    old = await make(clock=clock)
    message = make_message(QUEUE, clock, headers={"p": "1"}, payload=bytes(range(256)))
    await old.enqueue(message)
    [lease] = await old.fetch(QUEUE, "consumer")
    await old.close()  # a broker stops with a lease outstanding

    new = await make(clock=clock)
    assert await new.fetch(QUEUE, "consumer") == []
    clock.advance(EngineLimits().ack_timeout)
    [again] = await new.fetch(QUEUE, "consumer")
    stored = dataclasses.replace(message, expiration=message.timestamp + EngineLimits().default_ttl)
    assert again.message == lease.message == stored  # every field, the payload's bytes
    assert again.delivery_count == 2


async def test_close_writes_what_was_submitted(make: Make, client: Redis) -> None:
    engine = await make()
    messages = [make_message(QUEUE) for _ in range(50)]
    pending = [asyncio.ensure_future(engine.enqueue(message)) for message in messages]
    # Tasks start in order: by the time close() runs, every enqueue has been
    # submitted and none written.
    closing = asyncio.ensure_future(engine.close())
    await asyncio.gather(*pending, closing)
    assert await client.xlen(f"asbp:q:{QUEUE}:s4") == 50


# -- outages -------------------------------------------------------------------


async def test_redis_down_is_engine_unavailable_then_it_recovers(
    make: Make, redis_server: RedisServer
) -> None:
    engine = await make()
    redis_server.stop()

    for operation in (
        engine.enqueue(make_message(QUEUE)),
        engine.publish(make_message("/topic/a")),
        engine.fetch(QUEUE, "consumer", wait=0.1 * T),
        engine.ack(QUEUE, ["4:1-0:1:ab"]),
        engine.depth(QUEUE),
        engine.queues(),
        engine.declare_virtual_queue("v", "/topic/.*"),
    ):
        with pytest.raises(EngineUnavailable) as caught:
            await operation
        assert caught.value.code is FaultCode.ENGINE_UNAVAILABLE

    redis_server.start()
    message = make_message(QUEUE)
    await engine.enqueue(message)
    assert ids(await engine.fetch(QUEUE, "consumer")) == [message.id]


async def test_start_fails_when_redis_is_down(redis_server: RedisServer) -> None:
    redis_server.stop()
    engine = RedisEngine(redis_server.url, broker_id="broker-a")
    with pytest.raises(EngineUnavailable):
        await engine.start()
    await engine.close()


async def test_wake_ups_and_topics_come_back_after_a_redis_restart(
    make: Make, redis_server: RedisServer, client: Redis
) -> None:
    publisher, consumer = await make("broker-a"), await make("broker-b")
    heard: Recorder[Message] = Recorder()
    consumer.listen(heard)

    redis_server.restart()
    # The waiting fetch waits for the pub/sub connection to come back, arms
    # itself, and is woken by the other broker's enqueue.
    waiting: asyncio.Future[list[Any]] | None = None

    def start() -> None:
        nonlocal waiting
        waiting = asyncio.ensure_future(consumer.fetch(QUEUE, "consumer", wait=10 * T))

    await wait_armed(client, QUEUE, start)
    message = make_message(QUEUE)
    await publisher.enqueue(message)
    assert waiting is not None
    assert ids(await waiting) == [message.id]

    topic = make_message("/topic/after")
    await publisher.publish(topic)
    assert ids(await heard.wait_count(1)) == [topic.id]


async def test_a_garbage_pubsub_message_does_not_stop_the_reader(make: Make, client: Redis) -> None:
    publisher, listener = await make("broker-a"), await make("broker-b")
    heard: Recorder[Message] = Recorder()
    listener.listen(heard)
    await client.publish("asbp:topics", b"not a topic message")
    await client.publish("asbp:notices:broker-b", b"not a notice")

    message = make_message("/topic/after")
    await publisher.publish(message)
    assert ids(await heard.wait_count(1)) == [message.id]


# -- several brokers on one Redis ----------------------------------------------


async def test_competing_consumers_on_two_brokers_share_the_work(make: Make) -> None:
    first, second = await make("broker-a"), await make("broker-b")
    messages = [make_message(QUEUE, payload=str(n).encode()) for n in range(500)]
    got: dict[str, list[str]] = {"broker-a": [], "broker-b": []}

    async def consume(engine: RedisEngine, name: str) -> None:
        while len(got["broker-a"]) + len(got["broker-b"]) < len(messages):
            deliveries = await engine.fetch(QUEUE, name, count=20, wait=0.5 * T)
            got[name] += ids(deliveries)
            assert await engine.ack(QUEUE, [d.receipt for d in deliveries]) == len(deliveries)

    async with anyio.create_task_group() as group:
        group.start_soon(consume, first, "broker-a")
        group.start_soon(consume, second, "broker-b")
        await asyncio.gather(*(first.enqueue(message) for message in messages))

    everything = got["broker-a"] + got["broker-b"]
    assert sorted(everything) == sorted(ids(messages))  # each once, none lost
    assert got["broker-a"] and got["broker-b"]
    assert await first.depth(QUEUE) == 0


async def test_topic_messages_reach_every_broker_once(make: Make) -> None:
    engines = [await make(f"broker-{n}") for n in range(3)]
    recorders: list[Recorder[Message]] = []
    for engine in engines:
        recorder: Recorder[Message] = Recorder()
        engine.listen(recorder)
        recorders.append(recorder)

    sent = []
    for n, engine in enumerate(engines):
        message = make_message(f"/topic/{n}")
        await engine.publish(message)
        sent.append(message)
    fence = make_message("/topic/fence")
    await engines[0].publish(fence)

    for recorder in recorders:
        await recorder.wait_for(lambda items: bool(items) and items[-1].id == fence.id)
        # One publisher at a time, so one order; no broker hears itself twice.
        assert ids(recorder.items) == [*ids(sent), fence.id]


async def test_each_virtual_queue_copy_is_made_once_across_brokers(make: Make) -> None:
    brokers = [await make(f"broker-{n}") for n in range(3)]
    for engine in brokers:  # every cache loaded, before the declaration
        await engine.publish(make_message("/topic/warm-up"))

    await brokers[0].declare_virtual_queue("audit", "/topic/.*")
    published = [make_message(f"/topic/{n}") for n in range(3)]
    for engine, message in zip(brokers, published, strict=True):
        await engine.publish(message)  # brokers 1 and 2 hold a stale cache

    deliveries = await brokers[2].fetch("audit@/topic/.*", "consumer", count=10)
    assert ids(deliveries) == ids(published)
    assert await brokers[1].depth("audit@/topic/.*") == 3


async def test_a_notice_reaches_the_publishing_broker_whoever_acks(make: Make) -> None:
    publisher, consumer = await make("broker-a"), await make("broker-b")
    at_publisher: Recorder[DeliveryNotice] = Recorder()
    at_consumer: Recorder[DeliveryNotice] = Recorder()
    publisher.on_notice(at_publisher)
    consumer.on_notice(at_consumer)

    message = make_message(QUEUE, notify=notify_address("broker-a"), notices=[NoticeEvent.CONSUMED])
    await publisher.enqueue(message)
    [delivery] = await consumer.fetch(QUEUE, "consumer")
    assert await consumer.ack(QUEUE, [delivery.receipt]) == 1

    [notice] = await at_publisher.wait_count(1)
    assert (notice.message_id, notice.event, notice.queue) == (
        message.id,
        NoticeEvent.CONSUMED,
        QUEUE,
    )
    assert notice.notify == notify_address("broker-a")
    # The fence: a notice for broker-b arrives, and it is the only one there.
    fence = make_message(QUEUE, notify=notify_address("broker-b"), notices=[NoticeEvent.QUEUED])
    await publisher.enqueue(fence)
    [only] = await at_consumer.wait_count(1)
    assert only.message_id == fence.id


async def test_a_waiting_consumer_is_woken_by_another_broker(make: Make, client: Redis) -> None:
    publisher, consumer = await make("broker-a"), await make("broker-b")
    waiting: asyncio.Future[list[Any]] | None = None

    def start() -> None:
        nonlocal waiting
        waiting = asyncio.ensure_future(consumer.fetch(QUEUE, "consumer", wait=30 * T))

    await wait_armed(client, QUEUE, start)
    message = make_message(QUEUE)
    with anyio.fail_after(5 * T):  # well before the 30 T the fetch would wait
        await publisher.enqueue(message)
        assert waiting is not None
        assert ids(await waiting) == [message.id]
    assert await client.exists(f"asbp:q:{QUEUE}:wt") == 0  # the wake-up cleared the flag


# -- batching ------------------------------------------------------------------


async def test_a_batch_is_one_script_call_per_operation(make: Make, client: Redis) -> None:
    engine = await make()
    messages = [make_message(QUEUE) for _ in range(100)]
    await engine.enqueue(make_message(QUEUE))  # the queue exists; the scripts are loaded
    await engine.ack(QUEUE, [d.receipt for d in await engine.fetch(QUEUE, "consumer")])
    await client.config_resetstat()

    await asyncio.gather(*(engine.enqueue(message) for message in messages))
    assert await evalsha_calls(client) == 1  # 100 concurrent enqueues: one script call
    deliveries = await engine.fetch(QUEUE, "consumer", count=100)
    assert ids(deliveries) == ids(messages)
    assert await evalsha_calls(client) == 2
    acks = await asyncio.gather(*(engine.ack(QUEUE, [d.receipt]) for d in deliveries))
    assert sum(acks) == 100
    assert await evalsha_calls(client) == 3  # 100 concurrent acks: one script call


async def test_enqueues_in_flight_are_stored_in_the_order_made(make: Make) -> None:
    engine = await make()
    messages = [make_message(QUEUE, payload=str(n).encode()) for n in range(1200)]
    # Not awaited one by one: several pipelines and script calls (500 messages
    # at most each), written in the order made.
    await asyncio.gather(*(engine.enqueue(message) for message in messages))
    deliveries = await engine.fetch(QUEUE, "consumer", count=1000)
    deliveries += await engine.fetch(QUEUE, "consumer", count=1000)
    assert ids(deliveries) == ids(messages)


# -- the sweep ---------------------------------------------------------------------


async def test_the_sweep_removes_what_no_fetch_meets(make: Make, client: Redis) -> None:
    clock = FakeClock()
    start = clock()
    # No sweeper task: the test runs the sweeps itself, so none runs beside them.
    engine = await make(clock=clock, sweep_interval=None, limits=EngineLimits(ack_timeout=10))
    notices: Recorder[DeliveryNotice] = Recorder()
    engine.on_notice(notices)
    address, expired = notify_address("broker-a"), {NoticeEvent.EXPIRED}

    def expiring(seconds: float, **fields: Any) -> Message:
        expiration = clock() + seconds
        return make_message(QUEUE, clock, expiration=expiration, notify=address, **fields)

    leased = expiring(5, notices=expired)
    ready = expiring(5, notices=expired, priority=9)
    delayed = expiring(30, notices=expired, not_before=start + 20)
    await engine.enqueue(leased)
    [delivery] = await engine.fetch(QUEUE, "consumer")  # leased until start + 10
    await engine.enqueue(ready)
    await engine.enqueue(delayed)

    clock.advance(5)
    assert await engine.sweep() == 1  # the one nobody read; the lease decides for the other
    await notices.wait_count(1)
    assert [n.message_id for n in notices.items] == [ready.id]
    # When the lease ends: start + 10, to the millisecond the lease is scored in.
    assert await client.zscore("asbp:expiry", QUEUE) == delivery.deadline
    assert start + 10 - 0.001 < delivery.deadline <= start + 10

    clock.advance(5)
    assert await engine.sweep() == 1  # the lease ended: no fetch needed to see it go
    await notices.wait_count(2)
    assert notices.items[1] == DeliveryNotice(
        leased.id, QUEUE, NoticeEvent.EXPIRED, address, clock()
    )
    assert await engine.ack(QUEUE, [delivery.receipt]) == 0
    assert await client.zscore("asbp:expiry", QUEUE) == start + 20  # when the delayed one is due

    clock.advance(20)
    await engine.sweep()  # due, and expired by then: it leaves instead of joining its stream
    await notices.wait_count(3)
    assert [n.event for n in notices.items] == [NoticeEvent.EXPIRED] * 3
    assert await engine.depth(QUEUE) == 0
    assert await client.zcard("asbp:expiry") == 0  # nothing left to watch: memory stays bounded


async def test_a_released_message_is_swept_when_it_expired(make: Make) -> None:
    clock = FakeClock()
    engine = await make(clock=clock, sweep_interval=None, limits=EngineLimits(ack_timeout=30))
    expiring = make_message(QUEUE, clock, expiration=clock() + 5)
    lasting = make_message(QUEUE, clock, expiration=clock() + 100)
    await engine.enqueue(expiring)
    [delivery] = await engine.fetch(QUEUE, "consumer")
    await engine.enqueue(lasting)
    clock.advance(5)
    assert await engine.sweep() == 0  # expired, but leased: the lease decides (until +30)

    clock.advance(1)
    assert await engine.release(QUEUE, [delivery.receipt]) == 1

    assert await engine.sweep() == 1  # the release made the queue due again at once
    assert ids(await engine.fetch(QUEUE, "consumer", count=10)) == [lasting.id]


async def test_the_sweep_comes_back_for_what_its_budget_left(make: Make) -> None:
    clock = FakeClock()
    engine = await make(clock=clock, sweep_interval=None)
    expiration = clock() + 5
    messages = [make_message(QUEUE, clock, expiration=expiration) for _ in range(SWEEP_BUDGET + 10)]
    await asyncio.gather(*(engine.enqueue(message) for message in messages))
    lasting = make_message(QUEUE, clock)
    await engine.enqueue(lasting)

    clock.advance(5)
    assert await engine.sweep() == SWEEP_BUDGET
    assert await engine.sweep() == 10
    assert await engine.sweep() == 0  # not due again until the lasting one expires
    assert await engine.depth(QUEUE) == 1
    assert ids(await engine.fetch(QUEUE, "consumer")) == [lasting.id]


async def test_the_sweeper_runs_by_itself(make: Make) -> None:
    clock = FakeClock()
    engine = await make(clock=clock, sweep_interval=0.02 * T)
    notices: Recorder[DeliveryNotice] = Recorder()
    engine.on_notice(notices)
    address = notify_address("broker-a")
    message = make_message(
        QUEUE, clock, expiration=clock() + 5, notify=address, notices={NoticeEvent.EXPIRED}
    )
    await engine.enqueue(message)

    clock.advance(5)

    await notices.wait_count(1)  # nobody called the engine: its sweeper did it
    assert await engine.depth(QUEUE) == 0


# -- what Redis holds ------------------------------------------------------------


async def test_redis_records_one_consumer_per_broker(make: Make, client: Redis) -> None:
    default = await make("broker-a")
    prefixed = await make("broker-b", consumer_prefix="gateway-7")
    for engine in (default, prefixed):
        for n in range(3):
            await engine.enqueue(make_message(QUEUE))
            await engine.fetch(QUEUE, f"channel-{n}")

    consumers = await client.xinfo_consumers(f"asbp:q:{QUEUE}:s4", "asbp")
    assert sorted((c["name"], c["pending"]) for c in consumers) == [
        (b"broker-a", 3),
        (b"gateway-7", 3),
    ]


async def test_queue_names_with_colons_do_not_collide(make: Make) -> None:
    engine = await make()
    names = ["q", "q:s4", "q:s4:s4", "q:dl", "q:l4", "q:wt"]
    for n, name in enumerate(names):
        for _ in range(n + 1):
            await engine.enqueue(make_message(name))
    assert [await engine.depth(name) for name in names] == [1, 2, 3, 4, 5, 6]
    assert await engine.queues() == sorted(names)


async def test_an_acknowledged_message_is_gone_from_redis(make: Make, client: Redis) -> None:
    engine = await make()
    await engine.enqueue(make_message(QUEUE))
    [delivery] = await engine.fetch(QUEUE, "consumer")
    assert await client.zcard(f"asbp:q:{QUEUE}:l4") == 1
    assert await engine.ack(QUEUE, [delivery.receipt]) == 1

    assert await client.xlen(f"asbp:q:{QUEUE}:s4") == 0  # XDEL: no acknowledged backlog
    assert await client.zcard(f"asbp:q:{QUEUE}:l4") == 0
    summary = await client.xpending(f"asbp:q:{QUEUE}:s4", "asbp")
    assert summary["pending"] == 0


def test_the_fallback_packer_matches_hiredis() -> None:
    import hiredis

    from gateway.engines.redis.batch import _pack_python

    for command in [
        ("EVALSHA", "a" * 40, 2, "key:é", b"\x00\r\n", "", 0, -7, 10**12),
        ("SMEMBERS", "asbp:queues"),
    ]:
        # hiredis.pyi types the argument as a 1-tuple; any tuple works.
        assert _pack_python(command) == hiredis.pack_command(command)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "no-such-receipt",
        "4:1-0:1",  # no tag
        "4:1-0:1:",  # empty tag
        "44:1-0:1:ab",  # two-digit priority
        "x:1-0:1:ab",
        "4:1:1:ab",  # not a stream id
        "4:1-x:1:ab",
        "4:1-0:-1:ab",
        "4:1-0:1:ab:n",
        "4:1-0:\u0661:ab",  # a digit, but not an ASCII one
    ],
)
def test_receipts_this_engine_did_not_make_are_refused(text: str) -> None:
    assert parse_receipt(text) is None
    assert split_receipt(text) is None


@pytest.mark.parametrize("noticed", [False, True])
def test_receipts_round_trip(noticed: bool) -> None:
    text = receipt(7, "1712345678901-12", 3, "a1b2c3", noticed)
    parsed = parse_receipt(text)
    assert parsed is not None
    assert (parsed.priority, parsed.stream_id, parsed.delivery_count, parsed.tag) == (
        7,
        "1712345678901-12",
        "3",
        "a1b2c3",
    )
    assert parsed.noticed is noticed
    # As the ack and release scripts take it: the priority and flag, then the lease.
    assert split_receipt(text) == ("7n" if noticed else "7", "1712345678901-12:3:a1b2c3")


async def test_one_ack_of_many_priorities_counts_each_live_receipt_once(make: Make) -> None:
    """The ack script looks leases up per priority in one call: the counts still come
    back per receipt, in order, a repeated receipt counting once."""
    engine = await make()
    for priority in (9, 1, 9, 4):
        await engine.enqueue(make_message(QUEUE, priority=priority))
    receipts = [d.receipt for d in await engine.fetch(QUEUE, "consumer", count=4)]
    forged = receipts[1].rsplit(":", 1)[0] + ":000000000000"
    answers = await asyncio.gather(
        engine.ack(QUEUE, [receipts[3], forged, receipts[0]]),  # merged into one call
        engine.ack(QUEUE, [receipts[0], receipts[1]]),
        engine.ack(QUEUE, [receipts[2], receipts[2]]),
    )
    assert list(answers) == [2, 1, 1]
    assert await engine.depth(QUEUE) == 0


async def test_garbage_receipts_ack_nothing(make: Make) -> None:
    engine = await make()
    await engine.enqueue(make_message(QUEUE))
    [delivery] = await engine.fetch(QUEUE, "consumer")
    forged = delivery.receipt.rsplit(":", 1)[0] + ":000000000000"  # right entry, wrong lease
    assert await engine.ack(QUEUE, ["no-such-receipt", forged, "9:1-0:1:ab"]) == 0
    assert await engine.release(QUEUE, [forged]) == 0
    assert await engine.ack(QUEUE, [delivery.receipt]) == 1


# -- a pub/sub connection that dies without a reset -----------------------------


class StallingProxy:
    """Forwards a loopback port to Redis; :meth:`stall` stops every connection open
    now, both ways, without closing it: what a connection whose host or NAT
    vanished looks like (TCP reports nothing for hours). New connections pass."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = 0
        self.opened = 0
        self._running: set[asyncio.Event] = set()  # set: forwarding; cleared: stalled
        self._tasks: set[asyncio.Task[Any]] = set()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> StallingProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.resume()
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def stall(self) -> None:
        for running in self._running:
            running.clear()

    def resume(self) -> None:
        for running in self._running:
            running.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        running = asyncio.Event()
        running.set()
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                "127.0.0.1", self.target
            )
            self._running.add(running)
            self.opened += 1
            await asyncio.gather(
                self._pipe(reader, upstream_writer, running),
                self._pipe(upstream_reader, writer, running),
            )
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self._running.discard(running)
            writer.transport.abort()
            self._tasks.discard(task)

    @staticmethod
    async def _pipe(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, running: asyncio.Event
    ) -> None:
        try:
            while data := await reader.read(65536):
                await running.wait()  # stalled: hold what was read, send nothing
                writer.write(data)
                await writer.drain()
        finally:
            writer.transport.abort()


class _Restored(logging.Handler):
    """Sets ``event`` when the subscriber says its connection is back."""

    def __init__(self, event: asyncio.Event) -> None:
        super().__init__(logging.INFO)
        self.event = event

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == "Redis pub/sub connection restored":
            self.event.set()


async def test_a_pubsub_connection_that_dies_silently_is_replaced(
    make: Make, redis_server: RedisServer
) -> None:
    publisher = await make("broker-a")
    restored = asyncio.Event()
    handler = _Restored(restored)
    pubsub_log = logging.getLogger("gateway.engines.redis.pubsub")
    level = pubsub_log.level
    pubsub_log.setLevel(logging.INFO)
    pubsub_log.addHandler(handler)
    async with StallingProxy(redis_server.port) as proxy:
        listener = RedisEngine(
            f"redis://127.0.0.1:{proxy.port}/0",
            broker_id="broker-b",
            sweep_interval=None,  # nothing but the pub/sub reader uses the stalled links
            pubsub_health_interval=0.2 * T,
        )
        await listener.start()
        try:
            heard: Recorder[Message] = Recorder()
            listener.listen(heard)
            before = make_message("/topic/before")
            await publisher.publish(before)
            assert ids(await heard.wait_count(1)) == [before.id]

            opened = proxy.opened
            restored.clear()  # a slow reply to an earlier PING may have replaced it already
            proxy.stall()
            # Silence, an unanswered PING, then a new connection and SUBSCRIBE.
            await asyncio.wait_for(restored.wait(), 10 * T)
            assert proxy.opened > opened
            proxy.resume()  # the queue calls below use a pooled connection
            # A fetch that waits subscribes to the queue's wake-up channel on the new
            # connection and awaits Redis's confirmation, which comes after that of
            # the topics channel sent before it: from here a publication is heard.
            assert await listener.fetch("unrelated", "c", count=1, wait=0.01 * T) == []

            after = make_message("/topic/after")
            await publisher.publish(after)
            assert ids(await heard.wait_count(2)) == [before.id, after.id]
        finally:
            proxy.resume()
            await listener.close()
            pubsub_log.removeHandler(handler)
            pubsub_log.setLevel(level)


async def test_dead_letters_keep_the_newest_max_dead_letters(make: Make, client: Redis) -> None:
    engine = await make(limits=EngineLimits(max_deliveries=1))
    dead = f"asbp:q:{QUEUE}:dd"
    # A full list of older dead letters, written behind the engine's back.
    await client.rpush(dead, *([b"old"] * MAX_DEAD_LETTERS))
    poison = make_message(QUEUE)
    await engine.enqueue(poison)
    [delivery] = await engine.fetch(QUEUE, "consumer")
    assert await engine.release(QUEUE, [delivery.receipt]) == 1

    assert await client.llen(dead) == MAX_DEAD_LETTERS
    assert await client.lindex(dead, 0) == b"old"  # the oldest one went
    await client.ltrim(dead, -1, -1)
    assert ids(q.message for q in await engine.dead_letters(QUEUE, 10)) == [poison.id]
