"""``asbp.poll``: a client's fetch of up to ``count`` queue messages, waiting up to ``wait``.

A poll's fetch is made in its turn (gateway.messaging.sequencing); it then
waits for messages beside the Commands sent after it. It takes no more
messages than the sender's outbox has room for, less what its other polls
hold and one frame per answer owed
(:meth:`~gateway.messaging.subscriptions.Endpoint.poll_share`), so polls never
cut their own client off (2105): several polls in flight would otherwise be
handed more deliveries than the outbox holds, and the client cut off although
it reads everything. A delivery with no room left when it arrives goes back
to the queue undelivered, for a later poll or another consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from asbp.names import POLL
from gateway.acl import AccessContext, DestinationType
from gateway.engines.base import Delivery, Engine
from gateway.messaging.acl_gate import AclGate
from gateway.messaging.consumers import ANSWER_BYTES
from gateway.messaging.notifications import accepted, notification
from gateway.messaging.requests import Destination
from gateway.messaging.subscriptions import Endpoint
from gateway.metrics.counts import MessagingCounts

__all__ = ["Poller"]


class Poller:
    """Carries out polls.

    Args:
        engine: where the queues live.
        broker_id: with the endpoint's key, who the engine leases to.
        gate: which virtual-queue messages a poller may read.
        release_later: gives receipts back to their queue in the background.
        log: where discarded unreadable messages are logged.
    """

    __slots__ = ("_broker_id", "_counts", "_engine", "_log", "_may_read", "_release_later")

    def __init__(
        self,
        engine: Engine,
        *,
        broker_id: str,
        gate: AclGate,
        release_later: Callable[[str, list[str]], None],
        log: logging.Logger,
        counts: MessagingCounts | None = None,
    ) -> None:
        self._engine = engine
        self._counts = counts if counts is not None else MessagingCounts()
        self._broker_id = broker_id
        self._may_read = gate.may_read
        self._release_later = release_later
        self._log = log

    async def poll(
        self,
        endpoint: Endpoint,
        access: AccessContext,
        destination: Destination,
        count: int,
        wait: float,
        command_id: int | None,
    ) -> None:
        """Fetch, hand out what fits, and answer with how many were delivered."""
        queue = destination.name
        loop = asyncio.get_running_loop()
        end = loop.time() + wait
        share = endpoint.poll_share(count)
        while share == 0 and endpoint.poll_frames and not endpoint.closed:
            # The room is held for this client's other polls: wait for one of their
            # fetches to end (within this poll's own wait), then look again.
            remaining = end - loop.time()
            if remaining <= 0:
                break
            ended = endpoint.poll_ended
            if ended is None:
                ended = endpoint.poll_ended = loop.create_future()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(ended), remaining)
            share = endpoint.poll_share(count)
        deliveries: list[Delivery] = []
        if share and not endpoint.closed:
            endpoint.poll_frames += share
            try:
                deliveries = await self._engine.fetch(
                    queue,
                    f"{self._broker_id}/{endpoint.key}",
                    count=share,
                    wait=max(0.0, end - loop.time()),
                )
            finally:
                endpoint.end_poll_fetch(share)
        self._counts.poll_wait.observe(loop.time() - (end - wait))
        unreadable: list[str] = []
        unsent: list[str] = []
        delivered = 0
        for delivery in deliveries:
            topic = delivery.message.destination
            if destination.type is DestinationType.VIRTUAL_QUEUE and not self._may_read(
                access, topic
            ):
                unreadable.append(delivery.receipt)
                continue
            if endpoint.closed:
                unsent.append(delivery.receipt)
                continue
            frame = notification(
                delivery.message,
                subscription=queue,
                kind=destination.type,
                delivery=delivery,
                command_id=command_id,
            )
            if not endpoint.has_room_for_delivery(len(frame), ANSWER_BYTES):
                # No room left for it (large messages, or other frames came first):
                # it goes back to the queue undelivered, for a later poll or another
                # consumer, rather than pass the outbox's bounds.
                unsent.append(delivery.receipt)
                continue
            endpoint.hold(delivery.receipt, queue, delivery.deadline)
            self._counts.delivered(delivery.delivery_count)
            (endpoint.send_delivery or endpoint.send)(frame)
            delivered += 1
        if unsent:
            self._release_later(queue, unsent)
        if unreadable:
            self._log.warning(
                "acl.denied",
                extra={"queue": queue, "discarded": len(unreadable), "privilege": "READ"},
            )
            await self._engine.ack(queue, unreadable)
        if command_id is not None:
            endpoint.reply(accepted(POLL, command_id, count=delivered))
