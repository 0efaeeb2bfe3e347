"""Queue consumers: one task per queue at this broker, feeding its subscribers.

Theory of operation
-------------------
Sapo's queues have competing consumers: each message is held by one consumer
at a time, and one that does not acknowledge within the acknowledgement
timeout loses it to another. The engine provides the leases (``fetch`` leases
a message to one consumer until a deadline; ``ack`` removes it; a lease that
runs out makes it deliverable again); this module decides which subscriber at
this broker gets each leased message.

For every queue (or virtual queue) that has subscribers here, one
:class:`QueueConsumer` task loops:

1. Its *capacity* is the room its subscribers have left: for each, ``prefetch``
   minus the messages it holds unacknowledged, and no more than the frames its
   outbox takes now less those kept for its answers and polls
   (Endpoint.poll_share: the rule polls follow, docs/protocol.md "Topics and
   queues"). A subscriber whose outbox has no bytes to spare counts for
   nothing. With no room it waits until an acknowledgement, a release, an
   expired lease, a new subscriber or a subscriber's outbox draining makes some.
2. It fetches that many messages at once (at most :data:`BATCH`), waiting up to
   ``wait`` seconds for one. Other brokers sharing the engine run their own
   consumer for the same queue; the engine's leases keep them apart.
3. It hands each message to the subscriber with the fewest unacknowledged
   messages of this queue whose outbox has room for it, bytes included (ties
   taken in turn, so equals share the load), as an ``asbp.notification`` with
   its ``receipt``. So a consumer never cuts off a client that reads (2105)
   however large its messages and its ``prefetch``.

   A message that a subscriber could take but whose outbox is too full for it
   now is *held back*, with every message after it (so one subscriber still
   gets them in order), until an outbox drains: releasing it would count a
   delivery toward ``max_deliveries``, so a busy client could get messages
   discarded. No fetch is made while messages are held back, so they are one
   batch at most. One still held back when its lease runs out is forgotten
   (the engine delivers it again, as it would a message its client never
   acknowledged). A message nobody here can take any more (they left or
   filled their ``prefetch`` meanwhile) is released at once for other
   consumers.

Leases past their deadline are forgotten by the broker's housekeeping tick
(the engine has ended them), which frees room. A subscriber that closes
releases its leases, so the others get them without waiting for the timeout.

A virtual queue carries messages of many topics: for each, the subscriber must
also be allowed to READ that topic (as for a topic pattern subscription). A
message no subscriber may read is acknowledged away (and logged) so that it
cannot block the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from typing import Final

from asbp import AsbpError
from gateway.acl import AccessContext, DestinationType
from gateway.engines.base import Delivery, Engine
from gateway.messaging.notifications import notification
from gateway.messaging.subscriptions import Endpoint
from gateway.metrics.counts import MessagingCounts
from gateway.tasks import cancel_and_wait

__all__ = ["ANSWER_BYTES", "BATCH", "QueueConsumer"]

#: Messages fetched at once, at most (also the Redis engine's most per fetch). A
#: fetch asks for the room all subscribers have left, up to this: one round trip
#: per batch, not per message, and no subscriber left waiting for its share.
BATCH: Final = 1000
#: Outbox bytes a delivery leaves free for each answer still owed to its client
#: (a poll's deliveries too: gateway.messaging.polling).
ANSWER_BYTES: Final = 256
#: Seconds to wait before fetching again after the engine failed.
RETRY: Final = 1.0


class QueueConsumer:
    """Feeds one queue's messages to this broker's subscribers of it.

    Args:
        engine: where the queue lives.
        queue: its full name (``name@pattern`` for a virtual queue).
        kind: QUEUE or VIRTUAL_QUEUE.
        consumer: who the engine leases to (this broker).
        prefetch: unacknowledged messages per subscriber, at most.
        wait: seconds one fetch waits for a message.
        may_read: for a virtual queue, whether a subscriber (by its access
            context) may read a message of this topic.
        watch: asks for one :meth:`wake` once a subscriber's outbox drains
            (gateway.connections.outboxes.Outbox.when_drained).
        clock: the time in epoch seconds, as lease deadlines are given.
        log: where failures go.
    """

    def __init__(
        self,
        engine: Engine,
        queue: str,
        kind: DestinationType,
        *,
        consumer: str,
        prefetch: int,
        wait: float,
        may_read: Callable[[AccessContext, str], bool],
        watch: Callable[[Endpoint], object],
        clock: Callable[[], float],
        log: logging.Logger,
        counts: MessagingCounts | None = None,
    ) -> None:
        self.queue = queue
        self._counts = counts if counts is not None else MessagingCounts()
        self.kind = kind
        #: Subscribers, with the access context each subscribed with.
        self.members: dict[Endpoint, AccessContext] = {}
        self._engine = engine
        self._consumer = consumer
        self._prefetch = prefetch
        self._wait = wait
        self._may_read = may_read
        self._watch = watch
        self._clock = clock
        self._log = log
        self._room = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._turn = 0
        #: Messages fetched that no subscriber's outbox had room for yet, oldest
        #: first, with their notifications: one fetch's worth at most.
        self._held_back: deque[tuple[Delivery, bytes]] = deque()

    # -- members -------------------------------------------------------------

    def add(self, endpoint: Endpoint, access: AccessContext) -> None:
        """``endpoint`` consumes this queue from now on; starts the task if needed."""
        self.members[endpoint] = access
        endpoint.queues[self.queue] = self
        self.wake()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"asbp-consumer:{self.queue}")
            self._task.add_done_callback(self._finished)

    def remove(self, endpoint: Endpoint) -> None:
        """``endpoint`` stops consuming; the task ends once nobody is left."""
        self.members.pop(endpoint, None)
        endpoint.queues.pop(self.queue, None)
        self.wake()

    def wake(self) -> None:
        """Room may have appeared (an acknowledgement, a release, a new member, an
        outbox drained)."""
        self._room.set()

    @property
    def running(self) -> bool:
        """Whether the task is still running."""
        return self._task is not None

    async def stop(self) -> None:
        """Cancel the task (the broker is stopping) and wait for it to end."""
        task = self._task
        if task is not None:
            await cancel_and_wait(task)

    def take_held_back(self) -> list[str]:
        """The receipts of the messages held back, forgotten here (for the caller to
        release once the task has stopped)."""
        receipts = [delivery.receipt for delivery, _ in self._held_back]
        self._held_back.clear()
        return receipts

    # -- the loop --------------------------------------------------------------

    def _finished(self, task: asyncio.Task[None]) -> None:
        if self._task is task:
            self._task = None
        if not task.cancelled() and task.exception() is not None:
            self._log.error(
                "consumer.failed", extra={"queue": self.queue}, exc_info=task.exception()
            )

    def _capacity(self) -> int:
        """How many messages to fetch; with none, watches the outboxes that lack room."""
        prefetch, queue = self._prefetch, self.queue
        capacity = 0
        cramped: list[Endpoint] = []
        for endpoint in self.members:
            if endpoint.closed:
                continue
            wanted = prefetch - endpoint.held.get(queue, 0)
            if wanted <= 0:
                continue  # an acknowledgement wakes the task
            share = endpoint.poll_share(wanted)
            # No bytes to spare: whatever it fetched for it would only be held back.
            if share and endpoint.has_room_for_delivery(ANSWER_BYTES, ANSWER_BYTES):
                capacity += share
            else:
                cramped.append(endpoint)
        if not capacity:
            for endpoint in cramped:
                self._watch(endpoint)
        return capacity

    async def _run(self) -> None:
        while self.members:
            if self._held_back:
                await self._hand_held_back()
                continue
            self._room.clear()
            capacity = self._capacity()
            if capacity <= 0:
                await self._room.wait()
                continue
            try:
                deliveries = await self._engine.fetch(
                    self.queue, self._consumer, count=min(capacity, BATCH), wait=self._wait
                )
            except AsbpError as exc:
                self._log.warning(
                    "consumer.fetch_failed",
                    extra={"queue": self.queue, "code": int(exc.code), "reason": exc.message},
                )
                self._room.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._room.wait(), RETRY)
                continue
            if deliveries:
                await self._hand(deliveries)
        if self._held_back:  # everybody left while they waited
            await self._settle(self.take_held_back(), [])

    async def _hand(self, deliveries: list[Delivery]) -> None:
        release: list[str] = []
        unreadable: list[str] = []
        held_back = self._held_back
        # Taken once per batch: a member that leaves meanwhile is closed, and skipped.
        members = list(self.members.items())
        for delivery in deliveries:
            frame = notification(
                delivery.message, subscription=self.queue, kind=self.kind, delivery=delivery
            )
            if held_back:
                held_back.append((delivery, frame))  # behind the ones held back already
                continue
            endpoint, later = self._pick(delivery, len(frame), members)
            if endpoint is not None:
                endpoint.hold(delivery.receipt, self.queue, delivery.deadline)
                self._counts.delivered(delivery.delivery_count)
                (endpoint.send_delivery or endpoint.send)(frame)
            elif later:
                held_back.append((delivery, frame))
            else:
                (unreadable if self._unreadable(delivery) else release).append(delivery.receipt)
        if held_back:
            # Not a fault: the outboxes are full of what their clients are still reading.
            self._log.debug(
                "consumer.held_back", extra={"queue": self.queue, "held_back": len(held_back)}
            )
        await self._settle(release, unreadable)

    async def _hand_held_back(self) -> None:
        """Hand on the messages held back, in order, as far as outboxes have room;
        then wait for room (or for the first lease to run out)."""
        release: list[str] = []
        unreadable: list[str] = []
        held_back = self._held_back
        members = list(self.members.items())
        self._room.clear()
        now = self._clock()
        while held_back:
            delivery, frame = held_back[0]
            if delivery.deadline <= now:
                held_back.popleft()  # the engine ended its lease: it delivers it again
                continue
            endpoint, later = self._pick(delivery, len(frame), members)
            if endpoint is None and later:
                break
            held_back.popleft()
            if endpoint is not None:
                endpoint.hold(delivery.receipt, self.queue, delivery.deadline)
                self._counts.delivered(delivery.delivery_count)
                (endpoint.send_delivery or endpoint.send)(frame)
            else:
                (unreadable if self._unreadable(delivery) else release).append(delivery.receipt)
        if held_back:
            for endpoint, _ in members:
                if not endpoint.closed:
                    self._watch(endpoint)
        await self._settle(release, unreadable)
        if held_back:
            first = min(delivery.deadline for delivery, _ in held_back)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, first - self._clock())):
                    await self._room.wait()

    async def _settle(self, release: list[str], unreadable: list[str]) -> None:
        """Release what nobody here can take; acknowledge away what nobody may read."""
        try:
            if release:
                await self._engine.release(self.queue, release)
            if unreadable:
                self._log.warning(
                    "acl.denied",
                    extra={"queue": self.queue, "discarded": len(unreadable), "privilege": "READ"},
                )
                await self._engine.ack(self.queue, unreadable)
        except AsbpError as exc:
            # The leases run out by themselves; the messages are delivered again then.
            self._log.warning(
                "consumer.release_failed",
                extra={"queue": self.queue, "code": int(exc.code), "reason": exc.message},
            )

    def _pick(
        self, delivery: Delivery, size: int, members: list[tuple[Endpoint, AccessContext]]
    ) -> tuple[Endpoint | None, bool]:
        """The member with the fewest messages of this queue held whose outbox has room
        for a frame of ``size`` bytes, taking ties in turn; and, if none, whether a
        member could take it once its outbox has drained."""
        if not members:
            return None, False
        if len(members) == 1:
            turn = members
        else:
            start = self._turn % len(members)
            self._turn += 1
            turn = members[start:] + members[:start]
        best: Endpoint | None = None
        best_held = self._prefetch
        later = False
        topic = delivery.message.destination
        for endpoint, access in turn:
            held = endpoint.held.get(self.queue, 0)
            if endpoint.closed or held >= best_held:
                continue
            if self.kind is DestinationType.VIRTUAL_QUEUE and not self._may_read(access, topic):
                continue
            if not endpoint.has_room_for_delivery(size, ANSWER_BYTES):
                later = True
                continue
            best, best_held = endpoint, held
        return best, later

    def _unreadable(self, delivery: Delivery) -> bool:
        """A virtual-queue message that no member may read (so none ever will)."""
        if self.kind is not DestinationType.VIRTUAL_QUEUE or not self.members:
            return False
        topic = delivery.message.destination
        return not any(self._may_read(access, topic) for access in self.members.values())
