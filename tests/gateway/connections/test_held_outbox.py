"""HeldOutbox (gateway/connections/resume.py) on a lone broker's plane: every frame it
queues goes into the Channel's log, but queue deliveries (``offer_delivery``), whose
log is their queue; and once the broker hands the Channel over, a queue delivery is
neither sent nor logged (its lease goes back to the queue with the Channel)."""

from __future__ import annotations

import pytest

from gateway.connections.resume import HeldOutbox
from gateway.plane.memory import MemoryPlane

pytestmark = pytest.mark.anyio

CHANNEL = "0123456789abcdef0123456789abcdef"
DELIVERY = b"c=asbp.notification,destination=jobs,receipt=r1;job"


async def logged(plane: MemoryPlane) -> list[bytes]:
    read = await plane.channel_log.read(CHANNEL, 0, 100, 0)
    assert read is not None
    return [frame for _, frame in read.frames]


async def test_a_queue_delivery_is_sent_and_not_logged() -> None:
    plane = MemoryPlane("broker-a")
    await plane.channel_log.open(CHANNEL, digest=b"d" * 32, idle=60.0)
    assert await plane.channel_log.hold(CHANNEL) == ("", 0)
    outbox = HeldOutbox(16, 1 << 20, plane)
    outbox.start_logging(CHANNEL)
    assert outbox.offer(b"c=first;")
    assert outbox.offer_delivery(DELIVERY)
    assert outbox.offer(b"c=second;")
    await outbox.logged()
    assert await outbox.take() == [b"c=first;", DELIVERY, b"c=second;"]
    assert await logged(plane) == [b"c=first;", b"c=second;"]
    # Handed over (the broker stops): frames go to the log only, deliveries nowhere.
    outbox.hand_over()
    assert outbox.offer_delivery(DELIVERY)
    assert outbox.offer(b"c=third;")
    await outbox.logged()
    assert await outbox.take() == []
    assert await logged(plane) == [b"c=first;", b"c=second;", b"c=third;"]
    outbox.close()
