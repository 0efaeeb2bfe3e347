"""Leases: ack, release, deadlines, redelivery and poison messages."""

from __future__ import annotations

import time

import anyio
import pytest

from gateway.engines.base import Delivery, DeliveryNotice, EngineLimits, NoticeEvent
from tests.support import T
from tests.support.engines import Engines, FakeClock, Recorder, ids, make_message, notify_address

pytestmark = pytest.mark.anyio

QUEUE = "/queue/work"
LIMITS = EngineLimits(ack_timeout=30.0, max_deliveries=3)
ADDRESS = notify_address("broker-a")


async def test_ack_removes_the_message(engines: Engines) -> None:
    engine = await engines.one()
    first, second = make_message(QUEUE), make_message(QUEUE)
    await engine.enqueue(first)
    await engine.enqueue(second)
    deliveries = await engine.fetch(QUEUE, "consumer", count=2)

    assert await engine.ack(QUEUE, [deliveries[0].receipt]) == 1
    assert await engine.depth(QUEUE) == 1
    assert await engine.ack(QUEUE, [deliveries[0].receipt]) == 0  # twice: once counted
    assert await engine.ack(QUEUE, [deliveries[1].receipt, deliveries[1].receipt]) == 1
    assert await engine.depth(QUEUE) == 0
    assert await engine.fetch(QUEUE, "consumer") == []


async def test_a_leased_message_is_not_delivered_twice(engines: Engines) -> None:
    first, second = await engines.two()
    message = make_message(QUEUE)
    await first.enqueue(message)

    assert ids(await first.fetch(QUEUE, "c1")) == [message.id]
    assert await second.fetch(QUEUE, "c2") == []
    assert await first.fetch(QUEUE, "c3") == []


async def test_unknown_receipts_ack_nothing(engines: Engines) -> None:
    engine = await engines.one()
    await engine.enqueue(make_message(QUEUE))
    await engine.enqueue(make_message("/queue/other"))
    [delivery] = await engine.fetch(QUEUE, "consumer")

    assert await engine.ack(QUEUE, ["no-such-receipt"]) == 0
    assert await engine.ack("/queue/other", [delivery.receipt]) == 0  # another queue's
    assert await engine.ack("/queue/none", [delivery.receipt]) == 0
    assert await engine.release("/queue/none", [delivery.receipt]) == 0
    assert await engine.ack(QUEUE, []) == 0
    assert await engine.depth(QUEUE) == 1


async def test_a_lease_past_its_deadline_is_delivered_again(engines: Engines) -> None:
    clock = FakeClock()
    first, second = await engines.two(limits=LIMITS, clock=clock)
    message = make_message(QUEUE, clock)
    await first.enqueue(message)
    [lease] = await first.fetch(QUEUE, "c1")

    clock.advance(29.9)
    assert await second.fetch(QUEUE, "c2") == []
    clock.advance(0.1)
    [again] = await second.fetch(QUEUE, "c2")

    assert again.message == lease.message
    assert again.delivery_count == 2
    assert again.receipt != lease.receipt
    assert again.deadline == pytest.approx(clock() + 30.0)
    assert await first.ack(QUEUE, [lease.receipt]) == 0  # the late ack does nothing
    assert await first.depth(QUEUE) == 1
    assert await second.ack(QUEUE, [again.receipt]) == 1
    assert await first.depth(QUEUE) == 0


async def test_an_ack_after_the_deadline_does_nothing(engines: Engines) -> None:
    clock = FakeClock()
    engine = await engines.one(limits=LIMITS, clock=clock)
    await engine.enqueue(make_message(QUEUE, clock))
    [lease] = await engine.fetch(QUEUE, "consumer")

    clock.advance(30)  # nobody fetched since: the lease ended all the same

    assert await engine.ack(QUEUE, [lease.receipt]) == 0
    assert await engine.release(QUEUE, [lease.receipt]) == 0
    [again] = await engine.fetch(QUEUE, "consumer")
    assert again.delivery_count == 2


async def test_a_waiting_fetch_is_woken_when_a_lease_runs_out(engines: Engines) -> None:
    ack_timeout = 0.2 * T
    engine = await engines.one(limits=EngineLimits(ack_timeout=ack_timeout))
    message = make_message(QUEUE)
    await engine.enqueue(message)
    started = time.monotonic()
    [lease] = await engine.fetch(QUEUE, "c1")

    [again] = await engine.fetch(QUEUE, "c2", wait=5 * T)

    assert 0.5 * ack_timeout <= time.monotonic() - started < 3 * T
    assert again.message.id == message.id
    assert again.delivery_count == 2
    assert await engine.ack(QUEUE, [lease.receipt]) == 0


async def test_release_makes_it_deliverable_at_once(engines: Engines) -> None:
    clock = FakeClock()
    engine = await engines.one(limits=LIMITS, clock=clock)
    message, later = make_message(QUEUE, clock), make_message(QUEUE, clock)
    await engine.enqueue(message)
    [lease] = await engine.fetch(QUEUE, "c1")
    await engine.enqueue(later)

    assert await engine.release(QUEUE, [lease.receipt]) == 1
    assert await engine.release(QUEUE, [lease.receipt]) == 0
    assert await engine.ack(QUEUE, [lease.receipt]) == 0

    deliveries = await engine.fetch(QUEUE, "c2", count=2)
    assert ids(deliveries) == [message.id, later.id]  # it keeps its place
    assert [d.delivery_count for d in deliveries] == [2, 1]
    assert deliveries[0].receipt != lease.receipt


async def test_release_wakes_a_waiting_fetch(engines: Engines) -> None:
    first, second = await engines.two()
    await first.enqueue(make_message(QUEUE))
    [lease] = await first.fetch(QUEUE, "c1")
    results: list[list[Delivery]] = []

    async def consume() -> None:
        results.append(await second.fetch(QUEUE, "c2", wait=10 * T))

    with anyio.fail_after(5 * T):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(consume)
            await anyio.wait_all_tasks_blocked()
            assert await first.release(QUEUE, [lease.receipt]) == 1

    [[again]] = results
    assert again.message.id == lease.message.id
    assert again.delivery_count == 2


async def test_a_message_delivered_max_deliveries_times_is_discarded(engines: Engines) -> None:
    clock = FakeClock()
    engine = await engines.one(limits=LIMITS, clock=clock)  # max_deliveries=3
    poison, healthy = make_message(QUEUE, clock), make_message(QUEUE, clock)
    await engine.enqueue(poison)
    await engine.enqueue(healthy)

    [one] = await engine.fetch(QUEUE, "consumer")
    clock.advance(30)  # the lease runs out
    [two] = await engine.fetch(QUEUE, "consumer")
    assert await engine.release(QUEUE, [two.receipt]) == 1  # released: it still counts
    [three] = await engine.fetch(QUEUE, "consumer")
    assert [d.message.id for d in (one, two, three)] == [poison.id] * 3
    assert [d.delivery_count for d in (one, two, three)] == [1, 2, 3]
    assert await engine.release(QUEUE, [three.receipt]) == 1

    assert ids(await engine.fetch(QUEUE, "consumer", count=10)) == [healthy.id]
    assert await engine.depth(QUEUE) == 1


async def test_messages_coming_back_together_keep_their_order(engines: Engines) -> None:
    clock = FakeClock()
    engine = await engines.one(limits=LIMITS, clock=clock)
    messages = [make_message(QUEUE, clock) for _ in range(6)]
    for message in messages:
        await engine.enqueue(message)
    leases = await engine.fetch(QUEUE, "consumer", count=3)

    assert await engine.release(QUEUE, [lease.receipt for lease in reversed(leases)]) == 3
    released = await engine.fetch(QUEUE, "consumer", count=3)
    assert ids(released) == ids(messages[:3])

    clock.advance(30)  # all three leases run out at once
    assert ids(await engine.fetch(QUEUE, "consumer", count=10)) == ids(messages)


async def test_a_message_that_expires_while_leased_is_not_delivered_again(
    engines: Engines,
) -> None:
    clock = FakeClock()
    engine = await engines.one(limits=LIMITS, clock=clock)
    notices: Recorder[DeliveryNotice] = Recorder()
    engine.on_notice(notices)
    message = make_message(
        QUEUE, clock, expiration=clock() + 10, notify=ADDRESS, notices={NoticeEvent.EXPIRED}
    )
    await engine.enqueue(message)
    assert len(await engine.fetch(QUEUE, "consumer")) == 1

    clock.advance(10)
    assert await engine.depth(QUEUE) == 1  # leased: the consumer may still ack it
    clock.advance(20)

    assert await engine.fetch(QUEUE, "consumer") == []
    assert await engine.depth(QUEUE) == 0
    await notices.wait_count(1)
    assert [(n.message_id, n.event) for n in notices.items] == [(message.id, NoticeEvent.EXPIRED)]
