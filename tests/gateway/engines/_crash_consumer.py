"""The child of tests/gateway/engines/test_redis_crash.py: publish, then consume until killed.

    python -m tests.gateway.engines._crash_consumer URL QUEUE COUNT ACK_TIMEOUT

It publishes COUNT messages to QUEUE with ``enqueue`` (100 in flight at a
time), then consumes them, always holding one leased batch while it acks the
previous one, so a kill always finds leases outstanding. Every fact is printed
on stdout *after* it became true, one line each, flushed at once:

``Q <id> ...``  these enqueues returned: the messages were accepted.
``P``           every message is published; consumption starts.
``D <id> ...``  these messages were delivered (leased) to this process.
``S <id> ...``  an ack of these is about to be sent.
``K <id> ...``  that ack returned and every receipt was live: acknowledged.
``L <id> ...``  that ack returned but some leases had ended: not acknowledged.
``E``           the queue is empty; the process ends.

The test kills the process with SIGKILL part-way, so the last line may be cut:
only lines that end in a newline count.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Iterable

from gateway.engines.base import Delivery, EngineLimits, Message
from gateway.engines.redis.engine import RedisEngine

BATCH = 100


def report(kind: str, ids: Iterable[str] = ()) -> None:
    sys.stdout.write(" ".join([kind, *ids]) + "\n")
    sys.stdout.flush()


def message_ids(deliveries: list[Delivery]) -> list[str]:
    return [delivery.message.id for delivery in deliveries]


async def main(url: str, queue: str, count: int, ack_timeout: float) -> None:
    engine = RedisEngine(url, broker_id="crash-child", limits=EngineLimits(ack_timeout=ack_timeout))
    await engine.start()
    try:
        for start in range(0, count, BATCH):
            batch = [
                Message(
                    id=uuid.uuid4().hex,
                    destination=queue,
                    payload=str(start + n).encode(),
                    timestamp=time.time(),
                )
                for n in range(min(BATCH, count - start))
            ]
            await asyncio.gather(*(engine.enqueue(message) for message in batch))
            report("Q", (message.id for message in batch))
        report("P")

        held = await engine.fetch(queue, "child", count=BATCH)
        report("D", message_ids(held))
        while held:
            following = await engine.fetch(queue, "child", count=BATCH)
            report("D", message_ids(following))
            report("S", message_ids(held))
            live = await engine.ack(queue, [delivery.receipt for delivery in held])
            report("K" if live == len(held) else "L", message_ids(held))
            held = following
        report("E")
    finally:
        await engine.close()


if __name__ == "__main__":
    url, queue, count, ack_timeout = sys.argv[1:]
    asyncio.run(main(url, queue, int(count), float(ack_timeout)))
