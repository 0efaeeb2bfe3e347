"""The memory engine's own behaviour: bounded memory, the sweep, timers, waiters, close.

What every engine must do is in tests/conformance/; this file looks inside the
memory engine (``retained``, its timers and waiters) where the contract cannot.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from gateway.engines.base import (
    Delivery,
    DeliveryNotice,
    EngineLimits,
    EngineUnavailable,
    Message,
    NoticeEvent,
)
from gateway.engines.memory.engine import MemoryEngine
from gateway.engines.memory.queue import SLACK, MemoryQueue, wants_notice
from gateway.engines.topic_patterns import (
    InvalidVirtualQueue,
    TopicMatcher,
    parse_virtual_queue,
    virtual_queue,
)
from tests.support import T
from tests.support.engines import FakeClock, Recorder, ids, make_message

pytestmark = pytest.mark.anyio

QUEUE = "/queue/work"
ADDRESS = "broker-a/channel-1/1"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def engine(clock: FakeClock) -> AsyncIterator[MemoryEngine]:
    engine = MemoryEngine(limits=EngineLimits(ack_timeout=30.0, default_ttl=3600.0), clock=clock)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.close()


# -- bounded memory ---------------------------------------------------------


async def test_the_sweep_removes_expired_messages_nobody_fetches(
    engine: MemoryEngine, clock: FakeClock
) -> None:
    notices: Recorder[DeliveryNotice] = Recorder()
    engine.on_notice(notices)
    for n in range(1_000):
        await engine.enqueue(
            make_message(
                QUEUE,
                clock,
                expiration=clock() + 10 + n % 7,  # not in enqueue order
                priority=n % 10,
                not_before=clock() + 5 if n % 3 == 0 else None,
                notify=ADDRESS if n == 0 else None,
                notices={NoticeEvent.EXPIRED},
            )
        )
    assert engine.retained(QUEUE) == 2_000  # an entry in a deque or the delay heap, one in expiry

    clock.advance(20)
    engine.sweep()

    assert engine.retained(QUEUE) == 0
    await notices.wait_count(1)
    assert [(n.event, n.at) for n in notices.items] == [(NoticeEvent.EXPIRED, clock())]


async def test_the_periodic_sweep_runs_without_any_call(clock: FakeClock) -> None:
    engine = MemoryEngine(clock=clock, sweep_interval=0.02 * T)
    notices: Recorder[DeliveryNotice] = Recorder()
    engine.on_notice(notices)
    await engine.start()
    try:
        message = make_message(
            QUEUE, clock, expiration=clock() + 1, notify=ADDRESS, notices={NoticeEvent.EXPIRED}
        )
        await engine.enqueue(message)
        clock.advance(1)

        await notices.wait_count(1)  # nobody touched the engine: the sweep did it

        assert notices.items[0].message_id == message.id
        assert engine.retained(QUEUE) == 0
    finally:
        await engine.close()


async def test_acknowledged_messages_leave_no_tombstones_behind(
    engine: MemoryEngine, clock: FakeClock
) -> None:
    # Each acknowledged message leaves an entry in the expiry heap (its TTL is
    # an hour away) and one in the lease-deadline heap: both are compacted.
    for _ in range(50):
        for _ in range(200):
            await engine.enqueue(make_message(QUEUE, clock))
        deliveries = await engine.fetch(QUEUE, "consumer", count=200)
        await engine.ack(QUEUE, [d.receipt for d in deliveries])
        clock.advance(0.1)
        assert engine.retained(QUEUE) <= 3 * SLACK

    assert await engine.depth(QUEUE) == 0


async def test_expired_messages_behind_live_ones_are_compacted(
    engine: MemoryEngine, clock: FakeClock
) -> None:
    for n in range(4_000):  # three in four expire, most of them behind a live one
        await engine.enqueue(make_message(QUEUE, clock, expiration=clock() + (5 if n % 4 else 50)))

    clock.advance(5)
    engine.sweep()

    assert await engine.depth(QUEUE) == 1_000
    # Without compaction: 1,000 in the expiry heap plus 4,000 in the deque.
    assert engine.retained(QUEUE) <= 2 * 1_000 + 2 * SLACK
    assert len(await engine.fetch(QUEUE, "consumer", count=5_000)) == 1_000


async def test_leases_ended_by_time_are_swept_even_without_fetches(clock: FakeClock) -> None:
    engine = MemoryEngine(limits=EngineLimits(ack_timeout=1.0, max_deliveries=1), clock=clock)
    notices: Recorder[DeliveryNotice] = Recorder()
    engine.on_notice(notices)
    await engine.enqueue(
        make_message(QUEUE, clock, notify=ADDRESS, notices={NoticeEvent.DISCARDED})
    )
    await engine.fetch(QUEUE, "consumer")

    clock.advance(1)
    engine.sweep()

    await notices.wait_count(1)
    assert notices.items[0].event is NoticeEvent.DISCARDED
    assert await engine.depth(QUEUE) == 0
    assert engine.retained(QUEUE) == 1  # its expiry entry, a tombstone until compaction
    await engine.close()


async def test_a_lease_ending_after_expiry_removes_the_message_at_once(
    engine: MemoryEngine, clock: FakeClock
) -> None:
    await engine.enqueue(make_message(QUEUE, clock, expiration=clock() + 10))
    await engine.fetch(QUEUE, "consumer")
    clock.advance(10)
    engine.sweep()  # its expiry comes up while it is leased: the lease decides
    clock.advance(20)

    engine.sweep()  # the lease ends: no fetch needed to see it go

    assert engine.retained(QUEUE) == 0
    assert await engine.depth(QUEUE) == 0


# -- waiters and timers ---------------------------------------------------------


async def test_timers_are_armed_only_while_someone_waits() -> None:
    engine = MemoryEngine()
    loop_time = asyncio.get_running_loop().time
    await engine.enqueue(make_message(QUEUE, not_before=_epoch_in(60)))
    assert engine._timers == {}

    waiting = asyncio.create_task(engine.fetch(QUEUE, "consumer", wait=0.05 * T))
    await anyio.wait_all_tasks_blocked()
    assert list(engine._timers) == [QUEUE]  # the delay ends in a minute

    started = loop_time()
    assert await waiting == []
    assert loop_time() - started < 2 * T
    assert engine._timers == {}
    assert engine._waiters == {}
    await engine.close()


async def test_a_woken_waiter_that_is_cancelled_passes_its_wake_up_on() -> None:
    engine = MemoryEngine()
    first = asyncio.create_task(engine.fetch(QUEUE, "c1", wait=10 * T))
    await anyio.wait_all_tasks_blocked()
    second = asyncio.create_task(engine.fetch(QUEUE, "c2", wait=10 * T))
    await anyio.wait_all_tasks_blocked()

    message = make_message(QUEUE)
    await engine.enqueue(message)  # wakes the first waiter only
    first.cancel()

    async with asyncio.timeout(5 * T):
        assert ids(await second) == [message.id]
    with pytest.raises(asyncio.CancelledError):
        await first
    await engine.close()


async def test_one_enqueue_wakes_one_waiter() -> None:
    engine = MemoryEngine()
    waiting = [asyncio.create_task(engine.fetch(QUEUE, f"c{n}", wait=0.3 * T)) for n in range(3)]
    await anyio.wait_all_tasks_blocked()

    await engine.enqueue(make_message(QUEUE))
    await anyio.wait_all_tasks_blocked()  # the woken waiter finishes; the others block
    assert sum(task.done() for task in waiting) == 1
    results = await asyncio.gather(*waiting)
    assert sorted(len(result) for result in results) == [0, 0, 1]
    await engine.close()


async def test_enqueue_many_stores_in_order_and_wakes_waiters_once_stored() -> None:
    engine = MemoryEngine(limits=EngineLimits(max_queue_depth=3, max_queues=2))
    waiting = asyncio.create_task(engine.fetch(QUEUE, "consumer", count=10, wait=5 * T))
    await anyio.wait_all_tasks_blocked()
    other = "/queue/other"
    messages = [
        make_message(QUEUE, payload=b"1"),
        make_message(other, payload=b"o"),
        make_message(QUEUE, payload=b"2", priority=10),  # refused: not 0-9
        make_message(QUEUE, payload=b"3"),
        make_message(QUEUE, payload=b"4"),
        make_message(QUEUE, payload=b"5"),  # refused: the queue holds 3
        make_message("/queue/third", payload=b"t"),  # refused: max_queues is 2
    ]

    outcomes = engine.enqueue_many(messages)

    assert [type(outcome).__name__ for outcome in outcomes] == [
        "NoneType",
        "NoneType",
        "ValueError",
        "NoneType",
        "NoneType",
        "QueueFull",
        "QueueLimitReached",
    ]
    assert not waiting.done()  # woken, not run inside the call
    async with asyncio.timeout(5 * T):
        fetched = await waiting
    assert [d.message.payload for d in fetched] == [b"1", b"3", b"4"]
    assert await engine.depth(other) == 1
    await engine.close()
    with pytest.raises(EngineUnavailable):
        engine.enqueue_many([make_message(QUEUE)])


async def test_close_ends_waiting_fetches_and_refuses_calls() -> None:
    engine = MemoryEngine()
    await engine.start()
    waiting = asyncio.create_task(engine.fetch(QUEUE, "consumer", wait=10 * T))
    await anyio.wait_all_tasks_blocked()

    await engine.close()

    async with asyncio.timeout(5 * T):
        assert await waiting == []
    with pytest.raises(EngineUnavailable):
        await engine.enqueue(make_message(QUEUE))
    with pytest.raises(EngineUnavailable):
        await engine.fetch(QUEUE, "consumer")
    with pytest.raises(EngineUnavailable):
        await engine.start()
    await engine.close()  # twice is fine


# -- listeners ----------------------------------------------------------------


async def test_listeners_run_after_the_call_not_inside_it(engine: MemoryEngine) -> None:
    messages: Recorder[Message] = Recorder()
    notices: Recorder[DeliveryNotice] = Recorder()
    engine.listen(messages)
    engine.on_notice(notices)

    await engine.publish(make_message("/topic/a"))
    await engine.enqueue(make_message(QUEUE, notify=ADDRESS, notices={NoticeEvent.QUEUED}))
    assert messages.items == []
    assert notices.items == []

    await messages.wait_count(1)
    await notices.wait_count(1)


async def test_a_failing_listener_does_not_disturb_the_others(engine: MemoryEngine) -> None:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []

    def broken(message: Message) -> None:
        raise RuntimeError("listener bug")

    working: Recorder[Message] = Recorder()
    engine.listen(broken)
    engine.listen(working)
    loop.set_exception_handler(lambda loop, context: errors.append(context))
    try:
        await engine.publish(make_message("/topic/a"))
        await working.wait_count(1)
    finally:
        loop.set_exception_handler(None)

    assert [type(context["exception"]) for context in errors] == [RuntimeError]


# -- odds and ends ------------------------------------------------------------


async def test_receipts_of_another_engine_match_nothing(clock: FakeClock) -> None:
    before, after = MemoryEngine(clock=clock), MemoryEngine(clock=clock)
    leases: list[Delivery] = []
    for engine in (before, after):
        await engine.enqueue(make_message(QUEUE, clock))
        leases.extend(await engine.fetch(QUEUE, "consumer"))

    assert leases[0].receipt != leases[1].receipt  # a restarted broker starts afresh
    assert await after.ack(QUEUE, [leases[0].receipt]) == 0


async def test_bad_arguments_are_refused(engine: MemoryEngine) -> None:
    with pytest.raises(ValueError, match="priority"):
        await engine.enqueue(make_message(QUEUE, priority=10))
    with pytest.raises(ValueError, match="count"):
        await engine.fetch(QUEUE, "consumer", count=0)
    assert await engine.queues() == []


def test_the_notice_rule() -> None:
    asked = {
        frozenset(): [],
        frozenset({NoticeEvent.QUEUED}): [NoticeEvent.QUEUED],
        frozenset({NoticeEvent.EXPIRED}): [
            NoticeEvent.CONSUMED,
            NoticeEvent.EXPIRED,
            NoticeEvent.DISCARDED,
        ],
        frozenset(NoticeEvent): list(NoticeEvent),
    }
    for notices, sent in asked.items():
        message = make_message(QUEUE, notify=ADDRESS, notices=notices)
        assert [event for event in NoticeEvent if wants_notice(message, event)] == sent
        silent = make_message(QUEUE, notices=notices)
        assert not any(wants_notice(silent, event) for event in NoticeEvent)


# -- virtual-queue names and the topic matcher ----------------------------------


def test_virtual_queue_names() -> None:
    events = parse_virtual_queue("events@/topic/@home/.*")
    assert (events.name, events.pattern, events.full_name) == (
        "events",
        "/topic/@home/.*",
        "events@/topic/@home/.*",
    )
    assert events == virtual_queue("events", "/topic/@home/.*")
    assert events.feeds_on("/topic/@home/x")
    assert not events.feeds_on("/topic/x")

    with pytest.raises(InvalidVirtualQueue, match="'name@pattern'") as refused:
        parse_virtual_queue("no-separator")
    assert (refused.value.name, refused.value.pattern) == ("no-separator", "")
    with pytest.raises(InvalidVirtualQueue, match="not a valid regular expression"):
        virtual_queue("events", "[")


def test_the_topic_matcher() -> None:
    matcher = TopicMatcher(cache_size=2)
    matcher.add("all", virtual_queue("all", "/topic/.*"))
    matcher.add("exact", virtual_queue("exact", "/topic/a-b"))
    matcher.add("exact-too", virtual_queue("exact-too", "/topic/a-b"))
    matcher.add("exact", virtual_queue("exact", "/topic/a-b"))  # idempotent

    assert sorted(matcher.match("/topic/a-b")) == ["all", "exact", "exact-too"]
    assert matcher.match("/topic/a-bc") == ("all",)
    assert matcher.match("/other") == ()  # the cache starts over when full
    assert sorted(matcher.match("/topic/a-b")) == ["all", "exact", "exact-too"]
    assert (len(matcher), "all" in matcher, sorted(matcher)) == (
        3,
        True,
        ["all", "exact", "exact-too"],
    )

    matcher.discard("exact")
    matcher.discard("all")
    matcher.discard("unknown")
    assert matcher.match("/topic/a-b") == ("exact-too",)
    matcher.discard("exact-too")
    assert matcher.match("/topic/a-b") == ()
    assert len(matcher) == 0


# -- helpers ------------------------------------------------------------------


def _epoch_in(seconds: float) -> float:
    return time.time() + seconds


def test_dead_letters_keep_the_newest_max_dead_letters() -> None:
    queue = MemoryQueue(QUEUE, EngineLimits(max_deliveries=1), max_dead_letters=2)
    clock = FakeClock()
    messages = [make_message(QUEUE, clock, expiration=clock() + 60) for _ in range(3)]
    for seq, message in enumerate(messages):
        queue.put(message, seq, clock())
    receipts = iter(range(100))
    leases = queue.take(3, clock(), lambda: str(next(receipts)))
    assert queue.release([lease.receipt for lease in leases], clock()) == 3

    assert queue.dead_count == 2
    assert [q.message.id for q in queue.dead_letters(10)] == ids(messages[1:])
    assert queue.depth == 0
