"""Virtual queues: ``name@pattern``, fed by matching topics, consumed like queues."""

from __future__ import annotations

import pytest

from asbp import AsbpError, FaultCode
from gateway.engines.base import DeliveryNotice, EngineLimits, Message, NoticeEvent
from tests.support.engines import Engines, FakeClock, Recorder, ids, make_message, notify_address

pytestmark = pytest.mark.anyio

EVENTS = "events@/topic/.*"


async def test_fed_only_by_topics_that_fully_match(engines: Engines) -> None:
    engine = await engines.one()
    await engine.declare_virtual_queue("events", "/topic/.*")
    await engine.declare_virtual_queue("exact", "/topic/a")
    listener: Recorder[Message] = Recorder()
    engine.listen(listener)

    published = [
        make_message(topic)
        for topic in ("/topic/a", "/other/b", "x/topic/c", "/topic/ab", "/topic/b")
    ]
    for message in published:
        await engine.publish(message)

    by_id = {message.id: message for message in published}
    events = await engine.fetch(EVENTS, "consumer", count=10)
    assert [by_id[i].destination for i in ids(events)] == ["/topic/a", "/topic/ab", "/topic/b"]
    assert {d.queue for d in events} == {EVENTS}
    exact = await engine.fetch("exact@/topic/a", "consumer", count=10)
    assert ids(exact) == [published[0].id]
    assert exact[0].message.destination == "/topic/a"  # the copy keeps the topic's name
    await listener.wait_count(len(published))  # listeners got all of them regardless


async def test_each_virtual_queue_has_its_own_copy(engines: Engines) -> None:
    engine = await engines.one()
    await engine.declare_virtual_queue("one", "/topic/.*")
    await engine.declare_virtual_queue("two", "/topic/[^/]*")
    message = make_message("/topic/a")
    await engine.publish(message)

    [first] = await engine.fetch("one@/topic/.*", "consumer")
    assert await engine.ack("one@/topic/.*", [first.receipt]) == 1
    assert await engine.ack("two@/topic/[^/]*", [first.receipt]) == 0  # not its receipt

    [second] = await engine.fetch("two@/topic/[^/]*", "consumer")
    assert second.message.id == first.message.id == message.id
    assert second.receipt != first.receipt
    assert second.delivery_count == 1
    assert await engine.depth("one@/topic/.*") == 0
    assert await engine.depth("two@/topic/[^/]*") == 1


async def test_consumed_like_a_queue(engines: Engines) -> None:
    clock = FakeClock()
    engine = await engines.one(limits=EngineLimits(ack_timeout=10.0), clock=clock)
    await engine.declare_virtual_queue("events", "/topic/.*")
    low = make_message("/topic/a", clock, priority=1)
    high = make_message("/topic/b", clock, priority=8)
    await engine.publish(low)
    await engine.publish(high)

    [lease] = await engine.fetch(EVENTS, "consumer")
    assert lease.message.id == high.id
    clock.advance(10)
    deliveries = await engine.fetch(EVENTS, "consumer", count=5)
    assert ids(deliveries) == [high.id, low.id]
    assert [d.delivery_count for d in deliveries] == [2, 1]
    assert await engine.ack(EVENTS, [d.receipt for d in deliveries]) == 2
    assert await engine.depth(EVENTS) == 0


async def test_shared_by_brokers(engines: Engines) -> None:
    first, second = await engines.two()
    await first.declare_virtual_queue("events", "/topic/.*")
    message = make_message("/topic/a")

    await second.publish(message)

    assert await first.depth(EVENTS) == 1
    assert ids(await second.fetch(EVENTS, "consumer")) == [message.id]
    assert EVENTS in await second.queues()


async def test_declare_is_idempotent_and_listed_by_full_name(engines: Engines) -> None:
    engine = await engines.one(limits=EngineLimits(max_queues=2))
    await engine.declare_virtual_queue("events", "/topic/.*")
    await engine.declare_virtual_queue("events", "/topic/.*")
    await engine.enqueue(make_message("/queue/q"))  # the second of two queues

    assert sorted(await engine.queues()) == ["/queue/q", EVENTS]
    await engine.declare_virtual_queue("events", "/topic/.*")  # still no new queue

    await engine.publish(make_message("/topic/a"))
    assert await engine.depth(EVENTS) == 1  # one copy, however often declared


async def test_messages_published_before_the_declaration_are_not_copied(
    engines: Engines,
) -> None:
    engine = await engines.one()
    await engine.publish(make_message("/topic/a"))
    await engine.declare_virtual_queue("events", "/topic/.*")
    after = make_message("/topic/a")
    await engine.publish(after)

    assert ids(await engine.fetch(EVENTS, "consumer", count=10)) == [after.id]


async def test_each_copy_gives_its_own_notices(engines: Engines) -> None:
    engine = await engines.one()
    notices: Recorder[DeliveryNotice] = Recorder()
    engine.on_notice(notices)
    await engine.declare_virtual_queue("one", "/topic/.*")
    await engine.declare_virtual_queue("two", "/topic/a")
    address = notify_address("broker-a")
    message = make_message("/topic/a", notify=address, notices={NoticeEvent.QUEUED})

    await engine.publish(message)

    await notices.wait_count(2)
    assert sorted((n.queue, n.event, n.message_id) for n in notices.items) == [
        ("one@/topic/.*", NoticeEvent.QUEUED, message.id),
        ("two@/topic/a", NoticeEvent.QUEUED, message.id),
    ]


@pytest.mark.parametrize(
    ("name", "pattern"),
    [
        ("", "/topic/.*"),  # no private name
        ("a@b", "/topic/.*"),  # '@' belongs between name and pattern
        ("events", ""),  # no pattern
        ("events", "/topic/("),  # not a regular expression
        ("events", "(a+)+$"),  # exponential backtracking
        ("events", "/topic/(?=x).*"),  # lookahead
        ("events", ".*/.*/.*x"),  # polynomial backtracking
    ],
)
async def test_invalid_names_and_unsafe_patterns_are_refused(
    engines: Engines, name: str, pattern: str
) -> None:
    engine = await engines.one()

    with pytest.raises(ValueError) as refused:
        await engine.declare_virtual_queue(name, pattern)

    assert isinstance(refused.value, AsbpError)
    assert refused.value.code == FaultCode.INVALID_DESTINATION_NAME
    assert await engine.queues() == []
