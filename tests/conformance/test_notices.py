"""Delivery notices: QUEUED when asked, and every dequeue reason when any is asked.

The rule is in NoticeEvent's docstring (gateway/engines/base.py). Absence is
shown with a fence: a later message whose QUEUED notice travels the same path.
"""

from __future__ import annotations

import pytest

from gateway.engines.base import DeliveryNotice, Engine, EngineLimits, NoticeEvent
from tests.support.engines import Engines, FakeClock, Recorder, ids, make_message, notify_address

pytestmark = pytest.mark.anyio

QUEUE = "/queue/work"
ADDRESS = notify_address("broker-a")
QUEUED = NoticeEvent.QUEUED
CONSUMED = NoticeEvent.CONSUMED
EXPIRED = NoticeEvent.EXPIRED
DISCARDED = NoticeEvent.DISCARDED


async def fence(engine: Engine, notices: Recorder[DeliveryNotice]) -> None:
    """Return once every notice caused so far has arrived."""
    marker = make_message("/queue/fence", notify=ADDRESS, notices={QUEUED})
    await engine.enqueue(marker)
    await notices.wait_for(lambda items: any(n.message_id == marker.id for n in items))
    notices.items[:] = [n for n in notices.items if n.message_id != marker.id]


async def test_queued_and_consumed(engines: Engines) -> None:
    clock = FakeClock()
    engine = await engines.one(clock=clock)
    notices: Recorder[DeliveryNotice] = Recorder()
    engine.on_notice(notices)
    message = make_message(QUEUE, clock, notify=ADDRESS, notices={QUEUED, CONSUMED})

    await engine.enqueue(message)
    await notices.wait_count(1)
    assert notices.items == [DeliveryNotice(message.id, QUEUE, QUEUED, ADDRESS, clock())]

    clock.advance(2)
    [delivery] = await engine.fetch(QUEUE, "consumer")
    await engine.ack(QUEUE, [delivery.receipt])
    await notices.wait_count(2)
    assert notices.items[1] == DeliveryNotice(message.id, QUEUE, CONSUMED, ADDRESS, clock())


async def test_a_notice_reaches_the_publishing_broker(engines: Engines) -> None:
    # Message.notify: "<broker id>/<rest>" names the broker that gets the notice,
    # whichever broker saw the event. (For memory both are one broker.)
    publisher, consumer = await engines.two()
    notices: Recorder[DeliveryNotice] = Recorder()
    elsewhere: Recorder[DeliveryNotice] = Recorder()
    publisher.on_notice(notices)
    if consumer is not publisher:
        consumer.on_notice(elsewhere)
    message = make_message(QUEUE, notify=ADDRESS, notices={CONSUMED})
    await publisher.enqueue(message)

    [delivery] = await consumer.fetch(QUEUE, "consumer")
    assert await consumer.ack(QUEUE, [delivery.receipt]) == 1

    await notices.wait_count(1)
    assert [(n.message_id, n.event) for n in notices.items] == [(message.id, CONSUMED)]
    if consumer is not publisher:
        marker = make_message(QUEUE, notify=notify_address("broker-b"), notices={QUEUED})
        await consumer.enqueue(marker)
        await elsewhere.wait_count(1)
        assert [n.message_id for n in elsewhere.items] == [marker.id]


async def test_any_dequeued_event_asks_for_every_reason(engines: Engines) -> None:
    clock = FakeClock()
    engine = await engines.one(limits=EngineLimits(max_deliveries=1), clock=clock)
    notices: Recorder[DeliveryNotice] = Recorder()
    engine.on_notice(notices)
    expiring = make_message(
        QUEUE, clock, expiration=clock() + 5, notify=ADDRESS, notices={CONSUMED}
    )
    await engine.enqueue(expiring)
    clock.advance(5)
    assert await engine.fetch(QUEUE, "consumer") == []
    await notices.wait_count(1)
    assert notices.items == [DeliveryNotice(expiring.id, QUEUE, EXPIRED, ADDRESS, clock())]

    poison = make_message(QUEUE, clock, notify=ADDRESS, notices={EXPIRED})
    await engine.enqueue(poison)
    [delivery] = await engine.fetch(QUEUE, "consumer")
    assert await engine.release(QUEUE, [delivery.receipt]) == 1  # its one delivery is spent
    await notices.wait_count(2)
    assert notices.items[1] == DeliveryNotice(poison.id, QUEUE, DISCARDED, ADDRESS, clock())


async def test_an_expired_message_is_noticed_without_any_fetch(engines: Engines) -> None:
    # Nobody consumes the queue: the engine's own sweep removes the message once it
    # expires, and the publisher hears of it then, not at some later fetch.
    clock = FakeClock()
    engine = await engines.one(clock=clock)
    notices: Recorder[DeliveryNotice] = Recorder()
    engine.on_notice(notices)
    expiring = make_message(QUEUE, clock, expiration=clock() + 5, notify=ADDRESS, notices={EXPIRED})
    lasting = make_message(QUEUE, clock, expiration=clock() + 50, notify=ADDRESS, notices={EXPIRED})
    await engine.enqueue(expiring)
    await engine.enqueue(lasting)

    clock.advance(5)

    await notices.wait_count(1)  # within the sweep interval; no call on the engine
    assert notices.items == [DeliveryNotice(expiring.id, QUEUE, EXPIRED, ADDRESS, clock())]
    assert await engine.depth(QUEUE) == 1
    assert ids(await engine.fetch(QUEUE, "consumer", count=10)) == [lasting.id]


async def test_no_notice_unless_asked(engines: Engines) -> None:
    clock = FakeClock()
    engine = await engines.one(clock=clock)
    notices: Recorder[DeliveryNotice] = Recorder()
    engine.on_notice(notices)
    queued_only = make_message(QUEUE, clock, notify=ADDRESS, notices={QUEUED})
    no_address = make_message(QUEUE, clock, notices={QUEUED, CONSUMED, EXPIRED, DISCARDED})
    nothing_asked = make_message(QUEUE, clock, notify=ADDRESS)
    dequeued_only = make_message(QUEUE, clock, notify=ADDRESS, notices={CONSUMED})
    for message in (queued_only, no_address, nothing_asked, dequeued_only):
        await engine.enqueue(message)

    deliveries = await engine.fetch(QUEUE, "consumer", count=4)
    assert await engine.ack(QUEUE, [d.receipt for d in deliveries]) == 4
    await fence(engine, notices)

    assert [(n.message_id, n.event) for n in notices.items] == [
        (queued_only.id, QUEUED),
        (dequeued_only.id, CONSUMED),
    ]
