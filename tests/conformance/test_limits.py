"""Limits: max_queues (virtual queues included) and max_queue_depth."""

from __future__ import annotations

import pytest

from asbp import FaultCode
from gateway.engines.base import EngineLimits, Message, QueueFull, QueueLimitReached
from tests.support.engines import Engines, Recorder, ids, make_message

pytestmark = pytest.mark.anyio


async def test_a_new_queue_past_max_queues_is_refused(engines: Engines) -> None:
    engine = await engines.one(limits=EngineLimits(max_queues=2))
    await engine.enqueue(make_message("/queue/a"))
    await engine.declare_virtual_queue("events", "/topic/.*")

    with pytest.raises(QueueLimitReached) as refused:
        await engine.enqueue(make_message("/queue/b"))
    assert refused.value.code == FaultCode.MAX_QUEUES_REACHED
    with pytest.raises(QueueLimitReached):
        await engine.declare_virtual_queue("more", "/topic/.*")

    await engine.enqueue(make_message("/queue/a"))  # existing queues still take messages
    await engine.declare_virtual_queue("events", "/topic/.*")  # and redeclaring is no-op
    assert sorted(await engine.queues()) == ["/queue/a", "events@/topic/.*"]
    assert await engine.depth("/queue/a") == 2
    assert await engine.depth("/queue/b") == 0


async def test_a_full_queue_refuses_messages(engines: Engines) -> None:
    engine = await engines.one(limits=EngineLimits(max_queue_depth=3))
    for _ in range(3):
        await engine.enqueue(make_message("/queue/a"))
    [lease] = await engine.fetch("/queue/a", "consumer")

    with pytest.raises(QueueFull) as refused:  # leased messages still count
        await engine.enqueue(make_message("/queue/a"))
    assert isinstance(refused.value, QueueLimitReached)
    assert refused.value.code == FaultCode.QUEUE_FULL

    assert await engine.ack("/queue/a", [lease.receipt]) == 1
    await engine.enqueue(make_message("/queue/a"))
    assert await engine.depth("/queue/a") == 3


async def test_a_full_virtual_queue_drops_copies_without_failing_publish(
    engines: Engines,
) -> None:
    engine = await engines.one(limits=EngineLimits(max_queue_depth=2))
    await engine.declare_virtual_queue("small", "/topic/.*")
    listener: Recorder[Message] = Recorder()
    engine.listen(listener)
    messages = [make_message("/topic/a") for _ in range(3)]

    for message in messages:
        await engine.publish(message)

    assert ids(await engine.fetch("small@/topic/.*", "consumer", count=5)) == ids(messages[:2])
    await listener.wait_count(3)  # topic subscribers are not held back by the full queue
