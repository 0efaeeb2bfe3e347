"""Inspection for operators: peek, a queue's stats, dead letters and moving them back."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.engines.base import DeliveryNotice, EngineLimits, Message, NoticeEvent, QueueStats
from tests.support.engines import Engines, FakeClock, Recorder, ids, make_message, notify_address

pytestmark = pytest.mark.anyio

QUEUE = "/queue/inspected"
LIMITS = EngineLimits(ack_timeout=30.0, max_deliveries=2)


def stored(message: Message) -> Message:
    """``message`` as a queue keeps it: with the default TTL's expiration."""
    return replace(message, expiration=message.timestamp + LIMITS.default_ttl)


async def test_peek_shows_ready_and_leased_messages_in_delivery_order(engines: Engines) -> None:
    clock = FakeClock()
    engine = await engines.one(limits=LIMITS, clock=clock)
    low, high, low_later = (
        make_message(QUEUE, clock, priority=1),
        make_message(QUEUE, clock, priority=7),
        make_message(QUEUE, clock, priority=1),
    )
    delayed = make_message(QUEUE, clock, not_before=clock() + 60)
    for message in (low, high, low_later, delayed):
        await engine.enqueue(message)
    [leased] = await engine.fetch(QUEUE, "consumer")  # the priority-7 one

    peeked = await engine.peek(QUEUE, 10)

    assert leased.message.id == high.id
    assert ids(q.message for q in peeked) == [high.id, low.id, low_later.id]
    assert [q.deliveries for q in peeked] == [1, 0, 0]
    assert peeked[1].message == stored(low)  # the stored message, payload and all
    assert ids(q.message for q in await engine.peek(QUEUE, 2)) == [high.id, low.id]
    # Nothing was leased by looking: the ready ones are still there for a consumer.
    assert ids(await engine.fetch(QUEUE, "consumer", count=10)) == [low.id, low_later.id]
    assert await engine.peek("/queue/unknown", 10) == []
    assert await engine.peek(QUEUE, 0) == []


async def test_stats_give_depth_and_the_age_of_the_oldest_message(engines: Engines) -> None:
    clock = FakeClock()
    engine = await engines.one(limits=LIMITS, clock=clock)
    assert await engine.queue_stats(QUEUE) == QueueStats(depth=0, oldest_age=None, dead_letters=0)

    first = make_message(QUEUE, clock, priority=2)
    await engine.enqueue(first)
    clock.advance(5)
    await engine.enqueue(make_message(QUEUE, clock, priority=8))
    clock.advance(5)

    stats = await engine.queue_stats(QUEUE)
    assert (stats.depth, stats.oldest_age, stats.dead_letters) == (2, 10.0, 0)
    # A leased message is still waiting to be done with: it still counts.
    await engine.fetch(QUEUE, "consumer", count=2)
    assert (await engine.queue_stats(QUEUE)).oldest_age == 10.0


async def test_a_poison_message_becomes_a_dead_letter_and_can_be_moved_back(
    engines: Engines,
) -> None:
    clock = FakeClock()
    engine = await engines.one(limits=LIMITS, clock=clock)  # max_deliveries=2
    notices: Recorder[DeliveryNotice] = Recorder()
    engine.on_notice(notices)
    poison = make_message(
        QUEUE, clock, notify=notify_address("broker-a"), notices=[NoticeEvent.CONSUMED]
    )
    healthy = make_message(QUEUE, clock)
    await engine.enqueue(poison)
    await engine.enqueue(healthy)

    [one] = await engine.fetch(QUEUE, "consumer")
    clock.advance(30)  # the first lease runs out: the fetch script buries nothing yet
    [two] = await engine.fetch(QUEUE, "consumer")
    assert (one.message.id, two.message.id, two.delivery_count) == (poison.id, poison.id, 2)
    assert await engine.release(QUEUE, [two.receipt]) == 1  # the release script buries it

    await notices.wait_for(lambda items: len(items) == 1)
    assert notices.items[0].event is NoticeEvent.DISCARDED
    [dead] = await engine.dead_letters(QUEUE, 10)
    assert (dead.message, dead.deliveries) == (stored(poison), 2)
    stats = await engine.queue_stats(QUEUE)
    assert (stats.depth, stats.dead_letters) == (1, 1)  # dead letters are not the depth
    assert ids(q.message for q in await engine.peek(QUEUE, 10)) == [healthy.id]

    assert await engine.requeue_dead_letters(QUEUE, 10) == 1
    assert await engine.dead_letters(QUEUE, 10) == []
    assert await engine.queue_stats(QUEUE) == QueueStats(depth=2, oldest_age=30.0, dead_letters=0)
    # Back at the tail, delivered from the first again; done with as any message.
    deliveries = await engine.fetch(QUEUE, "consumer", count=10)
    assert ids(deliveries) == [healthy.id, poison.id]
    assert deliveries[1].delivery_count == 1
    assert await engine.ack(QUEUE, [d.receipt for d in deliveries]) == 2
    await notices.wait_for(lambda items: len(items) == 2)
    assert notices.items[1].event is NoticeEvent.CONSUMED


async def test_a_lease_running_out_for_the_last_time_buries_it_at_the_next_fetch(
    engines: Engines,
) -> None:
    clock = FakeClock()
    engine = await engines.one(limits=LIMITS, clock=clock)
    poison = make_message(QUEUE, clock)
    await engine.enqueue(poison)
    for _ in range(2):
        assert ids(await engine.fetch(QUEUE, "consumer")) == [poison.id]
        clock.advance(30)

    assert await engine.fetch(QUEUE, "consumer") == []
    assert ids(q.message for q in await engine.dead_letters(QUEUE, 10)) == [poison.id]
    assert (await engine.queue_stats(QUEUE)).dead_letters == 1


async def test_moving_back_stops_at_the_queue_limit_and_drops_expired_ones(
    engines: Engines,
) -> None:
    clock = FakeClock()
    limits = EngineLimits(ack_timeout=30.0, max_deliveries=1, max_queue_depth=3)
    engine = await engines.one(limits=limits, clock=clock)
    short = make_message(QUEUE, clock, expiration=clock() + 45)
    kept = [make_message(QUEUE, clock) for _ in range(2)]
    for message in (short, *kept):
        await engine.enqueue(message)
    leases = await engine.fetch(QUEUE, "consumer", count=3)
    assert await engine.release(QUEUE, [d.receipt for d in leases]) == 3  # all dead at once
    assert ids(q.message for q in await engine.dead_letters(QUEUE, 10)) == ids([short, *kept])
    assert ids(q.message for q in await engine.dead_letters(QUEUE, 2)) == ids([short, kept[0]])

    clock.advance(60)  # ``short`` has expired meanwhile
    for _ in range(2):
        await engine.enqueue(make_message(QUEUE, clock))  # one place left of three

    assert await engine.requeue_dead_letters(QUEUE, 10) == 1
    remaining = await engine.dead_letters(QUEUE, 10)
    assert ids(q.message for q in remaining) == [kept[1].id]
    assert (await engine.queue_stats(QUEUE)).depth == 3
    assert await engine.requeue_dead_letters(QUEUE, 10) == 0  # full
    assert await engine.requeue_dead_letters(QUEUE, 0) == 0
    assert await engine.requeue_dead_letters("/queue/unknown", 5) == 0


async def test_a_message_moved_back_comes_after_delayed_ones_already_due(
    engines: Engines,
) -> None:
    clock = FakeClock()
    engine = await engines.one(limits=EngineLimits(max_deliveries=1), clock=clock)
    poison = make_message(QUEUE, clock)
    await engine.enqueue(poison)
    [lease] = await engine.fetch(QUEUE, "consumer")
    assert await engine.release(QUEUE, [lease.receipt]) == 1  # dead
    delayed = make_message(QUEUE, clock, not_before=clock() + 10)
    await engine.enqueue(delayed)
    clock.advance(20)  # due: "received" at its time, before the move back

    assert await engine.requeue_dead_letters(QUEUE, 1) == 1
    assert ids(await engine.fetch(QUEUE, "consumer", count=5)) == [delayed.id, poison.id]
