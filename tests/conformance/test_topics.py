"""Topics: publish reaches every listener of every broker; nothing is stored."""

from __future__ import annotations

import pytest

from gateway.engines.base import Message
from tests.support.engines import Engines, Recorder, ids, make_message

pytestmark = pytest.mark.anyio


async def test_every_listener_gets_every_message_once_in_order(engines: Engines) -> None:
    engine = await engines.one()
    first: Recorder[Message] = Recorder()
    second: Recorder[Message] = Recorder()
    engine.listen(first)
    engine.listen(second)

    messages = [make_message("/topic/a", payload=f"m{n}".encode()) for n in range(3)]
    for message in messages:
        await engine.publish(message)

    for recorder in (first, second):
        await recorder.wait_count(3)
        assert recorder.items == messages  # the fence: the last one is in


async def test_listeners_of_another_broker_get_it_too(engines: Engines) -> None:
    publisher, other = await engines.two()
    here: Recorder[Message] = Recorder()
    there: Recorder[Message] = Recorder()
    publisher.listen(here)
    other.listen(there)

    message = make_message("/topic/a", headers={"p": "1"}, priority=7)
    await publisher.publish(message)
    fence = make_message("/topic/fence")
    await publisher.publish(fence)

    for recorder in (here, there):
        await recorder.wait_count(2)
        assert ids(recorder.items) == [message.id, fence.id]
    assert there.items[0] == message  # every field crosses intact


async def test_a_topic_message_without_subscribers_is_not_stored(engines: Engines) -> None:
    engine = await engines.one()
    await engine.publish(make_message("/topic/nobody"))

    assert await engine.queues() == []
    assert await engine.depth("/topic/nobody") == 0
    assert await engine.fetch("/topic/nobody", "consumer") == []


async def test_listeners_registered_later_miss_earlier_messages(engines: Engines) -> None:
    engine = await engines.one()
    early: Recorder[Message] = Recorder()
    engine.listen(early)
    before = make_message("/topic/a")
    await engine.publish(before)
    await early.wait_count(1)

    late: Recorder[Message] = Recorder()
    engine.listen(late)
    after = make_message("/topic/a")
    await engine.publish(after)

    await late.wait_count(1)
    await early.wait_count(2)
    assert ids(late.items) == [after.id]
