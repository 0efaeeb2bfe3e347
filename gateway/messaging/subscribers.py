"""Who consumes what at this broker: topic subscriptions and queue consumers.

Topic messages come from the engine (every broker sharing it gets every one)
to :meth:`Subscribers.on_topic`, which matches them against this broker's
subscriptions (gateway.messaging.subscriptions.Topics). Each matching
subscription gets one notification, encoded once and left in each member's
outbox (never awaited). If one client's subscriptions match a message twice,
it gets two notifications, each naming its subscription, as Sapo's
Notification does. No subscriber: the message is dropped.

Queues (and virtual queues) with subscribers here each have one
:class:`~gateway.messaging.consumers.QueueConsumer`, whose task leases
messages and hands them out. A consumer whose last subscriber leaves while
its task is fetching becomes an *orphan*: its task ends once the fetch
returns, releasing what it got, or at stop.

Distinct subscriptions (topics, patterns and queues) are counted against
``max_subscriptions`` (Sapo 2004, :class:`TooManySubscriptions`); every
change of a subscription's member count is published on ``/system/stats/…``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Final

from asbp import AsbpError, FaultCode
from asbp.names import SUBSCRIBE, UNSUBSCRIBE
from gateway.acl import AccessContext, DestinationType
from gateway.config.model import MessagingLimits
from gateway.connections.flow import PUBLISHER
from gateway.engines.base import Engine, Message
from gateway.errors import GatewayError
from gateway.messaging.acl_gate import AclGate
from gateway.messaging.background import BackgroundWork
from gateway.messaging.consumers import QueueConsumer
from gateway.messaging.notifications import accepted, notification
from gateway.messaging.requests import Destination
from gateway.messaging.subscriptions import Endpoint, Topics
from gateway.messaging.system_topics import SystemTopics
from gateway.metrics.counts import MessagingCounts
from gateway.types import TakesOrigins

__all__ = ["FETCH_WAIT", "Subscribers", "TooManySubscriptions"]

#: Seconds one fetch of a queue consumer waits for a message before it looks again.
FETCH_WAIT: Final = 1.0


class TooManySubscriptions(GatewayError):
    """Sapo 2004: one more distinct subscription would pass ``max_subscriptions``."""

    code = FaultCode.MAX_SUBSCRIPTIONS_REACHED


class Subscribers:
    """This broker's topic subscriptions and queue consumers.

    Args:
        engine: where queues live and leases are released.
        broker_id: who the engine leases queue messages to.
        limits: ``max_subscriptions`` and ``prefetch``.
        system: where member counts are published.
        gate: which topics a pattern subscription or virtual queue may deliver.
        watch: wakes an endpoint's consumers once its outbox drains.
        origins: the local publisher of each topic message, held back when its
            delivery fills a subscriber's outbox (gateway.connections.flow).
        background: where lease releases run.
        clock: wall-clock seconds, as lease deadlines are given.
        log: the broker's logger.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        broker_id: str,
        limits: MessagingLimits,
        system: SystemTopics,
        gate: AclGate,
        watch: Callable[[Endpoint], object],
        origins: TakesOrigins,
        background: BackgroundWork,
        clock: Callable[[], float],
        log: logging.Logger,
        counts: MessagingCounts | None = None,
    ) -> None:
        self._engine = engine
        self._counts = counts if counts is not None else MessagingCounts()
        self._broker_id = broker_id
        self._limits = limits
        self._system = system
        self._may_read = gate.may_read
        self._watch = watch
        self._origins = origins
        self._background = background
        self._clock = clock
        self._log = log
        self._topics = Topics()
        self._queues: dict[str, QueueConsumer] = {}
        #: Consumers whose last subscriber left while their task was fetching: the
        #: task ends once the fetch returns (releasing what it got), or at stop().
        self._orphans: set[QueueConsumer] = set()
        #: Told of an endpoint whose subscriptions changed (a resumable Channel's
        #: record follows them: gateway.connections.resume).
        self.changed: Callable[[Endpoint], object] | None = None

    # -- subscribing (in turn: gateway.messaging.sequencing) -------------------------

    async def subscribe(
        self,
        endpoint: Endpoint,
        access: AccessContext,
        destination: Destination,
        command_id: int | None,
    ) -> None:
        """``asbp.subscribe``: ``endpoint`` joins ``destination``, then is answered."""
        if endpoint.closed:
            return
        name = destination.name
        if destination.type is DestinationType.TOPIC:
            self._room_for(name, self._topics.get(name) is not None)
            if self._topics.add(endpoint, destination, access):
                subscription = self._topics.get(name)
                assert subscription is not None
                self._system.topic_count(name, len(subscription.members))
        else:
            self._room_for(name, name in self._queues)
            if destination.type is DestinationType.VIRTUAL_QUEUE:
                await self._engine.declare_virtual_queue(*destination.queue_parts)
                if _closed(endpoint):  # while the engine worked
                    return
                # The await let others in: the limit is checked again.
                self._room_for(name, name in self._queues)
            consumer = self._queues.get(name)
            if consumer is None:
                consumer = QueueConsumer(
                    self._engine,
                    name,
                    destination.type,
                    consumer=self._broker_id,
                    prefetch=self._limits.prefetch,
                    wait=FETCH_WAIT,
                    may_read=self._may_read,
                    watch=self._watch,
                    clock=self._clock,
                    log=self._log,
                    counts=self._counts,
                )
                self._queues[name] = consumer
            new = endpoint not in consumer.members
            consumer.add(endpoint, access)
            if new:
                self._system.queue_count(name, len(consumer.members))
        if self.changed is not None:
            self.changed(endpoint)
        if command_id is not None:
            endpoint.reply(accepted(SUBSCRIBE, command_id))

    async def unsubscribe(
        self, endpoint: Endpoint, destination: Destination, command_id: int | None
    ) -> None:
        """``asbp.unsubscribe``: ``endpoint`` leaves ``destination``, then is answered."""
        self.leave(endpoint, destination.name)
        if command_id is not None:
            endpoint.reply(accepted(UNSUBSCRIBE, command_id))

    def leave(self, endpoint: Endpoint, name: str) -> None:
        """``endpoint`` leaves the topic subscription or queue ``name``, if it held it."""
        subscription = self._topics.remove(endpoint, name)
        if subscription is not None:
            self._system.topic_count(name, len(subscription.members))
        consumer = endpoint.queues.get(name)
        if consumer is not None:
            consumer.remove(endpoint)
            if not consumer.members and self._queues.get(name) is consumer:
                del self._queues[name]
                if consumer.running:
                    self._orphans.add(consumer)
            self._system.queue_count(name, len(consumer.members))
        if (subscription is not None or consumer is not None) and self.changed is not None:
            self.changed(endpoint)

    def leave_all(self, endpoint: Endpoint) -> None:
        """``endpoint`` closed: it leaves every subscription and queue it held."""
        for name in [*endpoint.topics, *endpoint.queues]:
            self.leave(endpoint, name)

    def release_leases(self, endpoint: Endpoint) -> None:
        """``endpoint`` closed: the messages leased to it go back to their queues."""
        for queue, receipts in endpoint.leases_by_queue().items():
            for receipt in receipts:
                endpoint.drop(receipt)
            self.release_later(queue, receipts)

    def _room_for(self, name: str, exists: bool) -> None:
        if not exists and len(self._topics) + len(self._queues) >= self._limits.max_subscriptions:
            raise TooManySubscriptions(
                f"this broker holds {self._limits.max_subscriptions} distinct subscriptions; "
                f"{name!r} would be one more"
            )

    # -- leases --------------------------------------------------------------------

    def wake(self, queue: str) -> None:
        """Room was made for ``queue``'s messages (acknowledged, released): hand out more."""
        consumer = self._queues.get(queue)
        if consumer is not None:
            consumer.wake()

    def release_later(self, queue: str, receipts: list[str]) -> None:
        """Give ``receipts`` back to ``queue`` undelivered, in the background."""
        self._background.spawn(self._release(queue, receipts))

    async def _release(self, queue: str, receipts: list[str]) -> None:
        try:
            await self._engine.release(queue, receipts)
        except AsbpError as exc:
            # The leases run out by themselves; the messages are delivered again then.
            self._log.warning(
                "messaging.release_failed",
                extra={"queue": queue, "code": int(exc.code), "reason": exc.message},
            )
        self.wake(queue)

    # -- from the engine ---------------------------------------------------------------

    def on_topic(self, message: Message) -> None:
        """A topic message, from any broker sharing the engine: notify its subscribers."""
        # A subscriber's outbox this fills past its high-water mark holds the
        # publisher back, when it is a connection of this broker.
        previous, PUBLISHER.gate = PUBLISHER.gate, self._origins.take(message.id)
        try:
            self._notify(message)
        finally:
            PUBLISHER.gate = previous

    def _notify(self, message: Message) -> None:
        topic = message.destination
        for subscription in self._topics.matching(topic):
            frame: bytes | None = None
            for endpoint, access in list(subscription.members.items()):
                if endpoint.closed:
                    continue
                if subscription.pattern is not None and not self._may_read(access, topic):
                    continue
                if frame is None:
                    frame = notification(
                        message, subscription=subscription.name, kind=DestinationType.TOPIC
                    )
                if (endpoint.holding is not None or endpoint.parked) and _held(
                    endpoint, message.id, frame
                ):
                    continue
                endpoint.send(frame)

    # -- housekeeping --------------------------------------------------------------------

    def tick(self, endpoints: Iterable[Endpoint]) -> None:
        """Forget ended leases, forget ended orphans, publish member counts when due."""
        now = self._clock()
        for endpoint in endpoints:
            if endpoint.leases:
                for queue in endpoint.expired(now):
                    self.wake(queue)
        self._orphans = {c for c in self._orphans if c.running}
        self._system.tick(
            ((s.name, len(s.members)) for s in self._topics.all()),
            ((name, len(c.members)) for name, c in self._queues.items()),
        )

    async def stop(self) -> None:
        """Stop every consumer; what they held back goes back to its queue."""
        for consumer in [*self._queues.values(), *self._orphans]:
            await consumer.stop()
            held_back = consumer.take_held_back()
            if held_back:
                self.release_later(consumer.queue, held_back)
        self._queues.clear()
        self._orphans.clear()

    # -- observation ------------------------------------------------------------------

    def topic_subscribers(self, name: str) -> int:
        """This broker's members of the topic subscription ``name``."""
        subscription = self._topics.get(name)
        return 0 if subscription is None else len(subscription.members)

    def topic_subscriptions(self) -> list[tuple[str, bool, int]]:
        """This broker's topic subscriptions: name, whether a pattern, members."""
        return self._topics.counts()

    def queue_consumers(self, name: str) -> int:
        """This broker's consumers of the queue ``name``."""
        consumer = self._queues.get(name)
        return 0 if consumer is None else len(consumer.members)


#: Topic notifications a resumed endpoint holds back during a handover, at most: past
#: it, it stops holding (a slow or silent former broker costs duplicates, not memory).
MAX_HELD: Final = 10_000


def _held(endpoint: Endpoint, message_id: str, frame: bytes) -> bool:
    """Note a parked endpoint's last topic message, or hold one back during a
    handover (gateway.messaging.service, "Resumed Channels"): True if held."""
    if endpoint.parked:
        endpoint.last_topic = message_id
        return False
    holding = endpoint.holding
    assert holding is not None
    if len(holding) >= MAX_HELD:
        endpoint.holding = None
        for _, held in holding:
            endpoint.send(held)
        return False
    holding.append((message_id, frame))
    return True


def _closed(endpoint: Endpoint) -> bool:
    """Whether ``endpoint`` is closed (a call, so the type checker reads it afresh)."""
    return endpoint.closed
