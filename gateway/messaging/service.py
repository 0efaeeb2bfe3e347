"""Topics and queues for Channels and Tubes: the messaging built-ins.

Theory of operation
-------------------
The router hands this module every ``asbp.publish``, ``asbp.subscribe``,
``asbp.unsubscribe``, ``asbp.poll`` and ``asbp.ack``, from User-Agents and
Application-Agents alike, and tells it when a Channel or Tube closes. The
router never awaits, and engine calls do; so each Command goes through three
steps:

1. **On sight** (synchronously, inside the router's call;
   gateway.messaging.dispatch): the Command is read into a request
   (gateway.messaging.requests: faults 2001, 2002, 1203), its size is checked
   (1101: every notification of it must fit the frame limit), and the
   access-control lists are asked (3201, gateway.messaging.acl_gate). A
   Command refused here is answered at once.
2. **In order** (gateway.messaging.sequencing): the accepted Command becomes an
   :class:`~gateway.messaging.subscriptions.Operation` of its sender's
   :class:`~gateway.messaging.subscriptions.Endpoint`, of one of two kinds:

   * *Pipelined* (queue publications, acknowledgements): the engine call
     starts at once, without waiting for the calls ahead of it, and the
     operation joins the sender's ``in_flight`` FIFO. The call's first step
     runs inside the router's call (gateway.messaging.eager), so calls reach
     the engine in the order the Commands arrived, and a call that finishes
     there (the memory engine's) costs no task. The engines carry out calls in
     the order they were made (the Redis engine writes concurrent calls in one
     pipeline, merging the enqueues to one queue, and the acknowledgements of
     one queue, into one script call each), so a sender that keeps many
     Commands outstanding costs one round trip per batch, not per Command, and
     its messages are still stored in the order sent.
   * *In turn* (topic publications, subscribe, unsubscribe, poll): starts once
     every Command ahead of it has been answered, and the Commands behind it
     wait in ``operations`` until it is done, worked through by one task per
     sender. So a subscription is in place after everything sent before it
     took effect and before anything sent after it starts. A poll's fetch is
     made in its turn; the poll then waits for messages beside the Commands
     sent after it. It takes no more messages than the sender's outbox has
     room for, less what its other polls hold and one frame per answer owed
     (Endpoint.poll_share), so polls never cut their own client off (2105;
     gateway.messaging.polling).
     Topic publications are in turn because the Redis engine's
     ``publish`` may first await its virtual-queue cache, so two concurrent
     calls could reach Redis out of order.

   At most ``max_pending`` Commands per sender are unanswered (waiting, in
   flight, or polling); one more is fault 2106 (backpressure: a sender that
   keeps sending without reading its answers is refused, not buffered).
3. **Answered**, in the order sent: a Command with ``u`` gets
   ``asbp.accepted`` once the broker has taken responsibility: after the engine
   stored a queue message (Sapo; the DCE model's "Persistence"), after the
   engine took a topic message, once a subscription is in place. The answers
   of pipelined Commands leave from the head of ``in_flight``: each once its
   own engine call is done *and* every Command ahead of it has been answered.
   A fault on sight (step 1) is sent at once and may overtake them; a poll's
   acceptance comes when the poll ends.

   **Faults are per Command.** An engine call that fails faults its own
   Command (with its ``u``), in its place in the order, and no other: the
   Commands behind it were handed to the engine already and stand or fall on
   their own (a publication behind one refused by a full queue is stored if
   the queue has room for it; when Redis is lost, every call of the batch
   fails, each with its own 2005). No later Command is faulted for an earlier
   one's failure, because none depends on another's outcome: they name their
   own destinations and receipts. It is also what running them one after
   another gave, since a fault never stopped the Commands behind it. A
   publisher that must not leave a gap in what it stored waits for each
   answer before sending the next, or publishes again from the faulted one.

Messages flow back by two paths:

* **Topics**: the engine calls back for every topic message of every broker
  sharing it; gateway.messaging.subscribers matches it against this broker's
  subscriptions and leaves one notification, encoded once, in each member's
  outbox (never awaited).
* **Queues**: one task per queue with subscribers here
  (gateway.messaging.consumers) leases messages and hands them out.

Delivery notices (gateway.messaging.delivery_notices) come from the engine
with the ``notify`` address given at publication; one that arrives before the
publication's ``asbp.accepted`` waits for it, so a publisher always learns the
message id first.

Resumed Channels
----------------
A WebSocket Channel that can resume (gateway.connections.resume) keeps its
subscriptions across a dropped connection, and its record beside its log lists
them (:attr:`Messaging.on_subscriptions` tells of every change). When its
connection drops (:meth:`Messaging.channel_closed` asks :attr:`Messaging.parks`):

- its **topic** subscriptions stay here, *parked*: the endpoint's notifications
  go to the Channel wherever it is (its log while it is away, the broker it
  resumed on once it has), so a publication made while it is away is in its
  log, in order, like any Command routed to it;
- its **queue** subscriptions stop taking messages and the messages leased to
  it and not acknowledged go back to their queues at once (released), to be
  delivered again to another consumer or to the Channel once it resumes: a
  client that is away cannot acknowledge, and holding its leases would only
  delay them by the acknowledgement timeout.

It resumes here: :meth:`Messaging.resume_channel` binds the parked endpoint to
the resumed Channel (its topic subscriptions never stopped) and subscribes its
queues again. It resumes at another broker: that broker subscribes it again from
the record, and this one ends the parked endpoint when told
(:meth:`Messaging.unpark`), or once the log's ``log_max_age`` has passed.

The handover between the two brokers loses nothing and repeats nothing: both
see the topic messages in the same order (the engine's), the new broker
subscribes before it tells the parked one, and until the parked one answers
with the id of the last message it sent on (``Endpoint.last_topic``) the new
one holds its own notifications back (``Endpoint.holding``); then
:meth:`Messaging.handover` sends those after that id. The parked broker's
last frames reach the Channel before its answer (one stream between them).
A parked broker that does not answer (it died) within the bus lease: every
held notification goes out.

The parts
---------
:class:`Messaging` is the façade the router calls (through
gateway.types.MessagingHooks); it builds the parts below, each with one
concern, and holds the life cycle (start, stop, housekeeping) and the
endpoints' opening and closing:

=====================================  ===========================================
gateway.messaging.endpoints            endpoints by key; outbox flow control
gateway.messaging.dispatch             on sight: read, check, make an operation
gateway.messaging.acl_gate             the ACL questions (3201)
gateway.messaging.message_ids          the message id pool
gateway.messaging.sequencing           in order: engine calls and answers (2106)
gateway.messaging.polling              ``asbp.poll``
gateway.messaging.subscribers          topic subscriptions, queue consumers (2004)
gateway.messaging.delivery_notices     ``asbp.notice``, held until accepted
gateway.messaging.background           what must end, or be cancelled, at stop
=====================================  ===========================================
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Final

import asbp
from asbp import AsbpError, Command, FaultCode
from asbp.names import SUBSCRIBE
from gateway.acl import AccessContext, Acl, DestinationType, Privilege
from gateway.config.model import MessagingLimits
from gateway.connections.channels import UNCOUNTED_DELIVERIES
from gateway.connections.flow import TopicOrigins
from gateway.engines.base import Engine
from gateway.messaging.acl_gate import AclGate
from gateway.messaging.background import BackgroundWork
from gateway.messaging.delivery_notices import DeliveryNotices
from gateway.messaging.dispatch import CommandDispatcher, MessageTooLarge
from gateway.messaging.endpoints import Endpoints
from gateway.messaging.message_ids import MessageIdPool
from gateway.messaging.polling import Poller
from gateway.messaging.requests import read_subscription
from gateway.messaging.sequencing import Sequencer, TooManyPending
from gateway.messaging.subscribers import FETCH_WAIT, Subscribers, TooManySubscriptions
from gateway.messaging.subscriptions import Endpoint
from gateway.messaging.system_topics import SystemTopics
from gateway.metrics.counts import MessagingCounts

if TYPE_CHECKING:
    from gateway.connections.channels import Channel
    from gateway.connections.tubes import Tube
    from gateway.types import Outlets

__all__ = [
    "FETCH_WAIT",
    "STOP_GRACE",
    "MessageTooLarge",
    "Messaging",
    "TooManyPending",
    "TooManySubscriptions",
]

#: Seconds the broker gives its last releases of leases when it stops.
STOP_GRACE: Final = 5.0


class Messaging:
    """The messaging built-ins of one broker.

    Args:
        outlets: where frames and faults for Channels and Tubes go (the router's).
        engine: topics, queues and virtual queues (started by the caller).
        broker_id: this broker, in notice addresses and system topics.
        limits: subscriptions, prefetch, pending Commands, poll wait.
        frame_limits: the codec limits every notification must fit.
        acl: the access-control lists; None (or one not enabled) allows all.
        log: the broker's logger.
        clock: wall-clock seconds, as the engine uses.
    """

    def __init__(
        self,
        outlets: Outlets,
        engine: Engine,
        *,
        broker_id: str,
        limits: MessagingLimits,
        frame_limits: asbp.Limits,
        acl: Acl | None = None,
        log: logging.Logger,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        #: Queue traffic and long-polls, for the metrics (gateway.metrics).
        self.counts = counts = MessagingCounts()
        self.system = SystemTopics(
            engine, broker_id=broker_id, interval=limits.system_topic_interval, log=log, clock=clock
        )
        self._background = BackgroundWork()
        self._endpoints = Endpoints(outlets)
        self._by_key = self._endpoints.by_key
        self._gate = gate = AclGate(acl, log=log)
        #: Each topic message's local publisher until delivery (flow control).
        self.origins = origins = TopicOrigins()
        self._subscribers = Subscribers(
            engine,
            broker_id=broker_id,
            limits=limits,
            system=self.system,
            gate=gate,
            watch=self._endpoints.watch,
            origins=origins,
            background=self._background,
            clock=clock,
            log=log,
            counts=counts,
        )
        self._notices = DeliveryNotices(broker_id, self._by_key)
        self._sequencer = Sequencer(self._background, log=log, latency=counts.engine_latency)
        self._dispatcher = CommandDispatcher(
            engine,
            limits=limits,
            frame_limits=frame_limits,
            gate=gate,
            ids=MessageIdPool(),
            notices=self._notices,
            subscribers=self._subscribers,
            poller=Poller(
                engine,
                broker_id=broker_id,
                gate=gate,
                release_later=self._subscribers.release_later,
                log=log,
                counts=counts,
            ),
            sequencer=self._sequencer,
            origins=origins,
            clock=clock,
            counts=counts,
        )
        self._command = self._dispatcher.command
        self._gate_require = gate.require
        #: Set by gateway.connections.resume: given a Channel whose connection
        #: closed, where its topic notifications go while it is away; None: its
        #: subscriptions end (it cannot resume).
        self.parks: Callable[[Channel], Callable[[bytes], object] | None] | None = None
        #: Set by gateway.connections.resume: told a Channel's ``i`` when its
        #: subscriptions changed.
        self.on_subscriptions: Callable[[str], object] | None = None
        self._subscribers.changed = self._subscriptions_changed

    # -- life cycle ----------------------------------------------------------

    def start(self) -> None:
        """Listen to the engine and start publishing system topics (inside the loop)."""
        self.engine.listen(self._subscribers.on_topic)
        self.engine.on_notice(self._notices.on_notice)
        self.system.start()

    async def stop(self) -> None:
        """Stop consumers and workers; release every lease still held (best effort).

        Call after every Channel and Tube is closed, before the engine closes.
        """
        await self._subscribers.stop()
        for endpoint in list(self._endpoints):
            self._close(endpoint)
        # Publications sent before the close still reach the engine, and leases are
        # released, within a grace period; whatever is left then is cancelled.
        await self._background.drain(STOP_GRACE)
        await self.system.stop()

    def tick(self) -> None:
        """Housekeeping: forget ended leases, publish consumer counts when due."""
        self._subscribers.tick(self._endpoints)

    # -- the router's hooks (gateway.types.MessagingHooks) ---------------------------

    def channel_command(
        self, channel: Channel, access: AccessContext, command: Command, name: str
    ) -> None:
        """A messaging built-in from a User-Agent, sent with ``access``."""
        endpoint = self._by_key.get("c/" + channel.id)
        if endpoint is None:
            endpoint = self._endpoints.open_channel(channel)
        self._command(endpoint, access, command, name)

    def tube_command(self, tube: Tube, command: Command, name: str) -> None:
        """A messaging built-in from an Application-Agent."""
        endpoint = self._by_key.get("t/" + tube.id)
        if endpoint is None:
            endpoint = self._endpoints.open_tube(tube)
        self._command(endpoint, tube.access, command, name)

    def channel_closed(self, channel: Channel) -> None:
        """The Channel closed: its subscriptions end and its leases are released
        (a resumable Channel's topic subscriptions are parked instead)."""
        key = "c/" + channel.id
        endpoint = self._by_key.get(key)
        if endpoint is None or endpoint.parked:
            return
        # Only topic subscriptions are parked (queues are let go at the drop).
        forward = self.parks(channel) if self.parks is not None and endpoint.topics else None
        if forward is None:
            del self._by_key[key]
            self._close(endpoint)
            return
        self._park(endpoint, forward, uncounted=channel.count == UNCOUNTED_DELIVERIES)

    def _park(
        self, endpoint: Endpoint, forward: Callable[[bytes], object], *, uncounted: bool
    ) -> None:
        endpoint.parked = True
        self._endpoints.release_outbox(endpoint)
        for name in list(endpoint.queues):
            self._subscribers.leave(endpoint, name)
        self._sequencer.close(endpoint)
        self._subscribers.release_leases(endpoint)
        endpoint.send = forward
        # It consumes no queue while parked. A delivery still on its way is not
        # logged for a client that does not count queue deliveries (its lease ends
        # and the queue delivers it again); one that counts every frame gets it in
        # the log, numbered with the rest (None: ``send``, as before ``count=2``).
        endpoint.send_delivery = _drop if uncounted else None
        endpoint.fault = _nobody
        endpoint.room = _no_room

    def unpark(self, channel_id: str) -> str | None:
        """The Channel ``channel_id`` resumed elsewhere, or never will: its parked
        topic subscriptions here end. The id of the last topic message they sent on
        ('' none); None if it had none parked."""
        key = "c/" + channel_id
        endpoint = self._by_key.get(key)
        if endpoint is None or not endpoint.parked:
            return None
        del self._by_key[key]
        self._close(endpoint)
        return endpoint.last_topic

    def handover(self, channel_id: str, last: str | None) -> None:
        """The broker where the Channel's topic subscriptions were parked stopped
        after the topic message ``last`` (None: it did not say; all are new): the
        notifications held back since it resumed here go out, those up to ``last``
        (which that broker sent it) left out."""
        endpoint = self._by_key.get("c/" + channel_id)
        if endpoint is None or endpoint.holding is None:
            return
        held, endpoint.holding = endpoint.holding, None
        start = 0
        if last:
            for index in range(len(held) - 1, -1, -1):
                if held[index][0] == last:
                    start = index + 1
                    break
        for _, frame in held[start:]:
            endpoint.send(frame)

    def parked(self, channel_id: str) -> bool:
        """Whether ``channel_id`` has topic subscriptions parked here."""
        endpoint = self._by_key.get("c/" + channel_id)
        return endpoint is not None and endpoint.parked

    def subscriptions(self, channel_id: str) -> list[tuple[str, str, str | None]]:
        """The Channel's subscriptions here: type, name, the Subject it subscribed as."""
        endpoint = self._by_key.get("c/" + channel_id)
        if endpoint is None:
            return []
        found: list[tuple[str, str, str | None]] = []
        for name, subscription in endpoint.topics.items():
            access = subscription.members.get(endpoint)
            subject = access.subject_id if access is not None else None
            found.append((DestinationType.TOPIC.value, name, subject))
        for name, consumer in endpoint.queues.items():
            access = consumer.members.get(endpoint)
            subject = access.subject_id if access is not None else None
            found.append((consumer.kind.value, name, subject))
        return found

    async def resume_channel(
        self,
        channel: Channel,
        kept: Iterable[tuple[str, str, str | None]],
        access_of: Callable[[str | None], AccessContext],
        *,
        hold: bool = False,
    ) -> None:
        """``channel`` resumed here: its subscriptions again, before ``asbp.resumed``.

        A parked endpoint (it was here) serves it again, its topic subscriptions
        unbroken; whatever else ``kept`` lists is subscribed anew, checked against
        the access-control lists as ``asbp.subscribe`` is. One refused (3201, or
        no longer a valid name) is told to the client as a fault and left out.
        ``hold``: another broker's parked subscriptions may still send it topic
        messages; the new subscriptions' notifications wait for :meth:`handover`.
        """
        key = "c/" + channel.id
        endpoint = self._by_key.get(key)
        if endpoint is not None and endpoint.parked:
            endpoint.parked = False
            self._endpoints.rebind(endpoint, channel)
        elif endpoint is None:
            endpoint = self._endpoints.open_channel(channel)
            if hold:
                endpoint.holding = []
        for kind, name, subject in kept:
            if name in endpoint.topics or name in endpoint.queues:
                continue
            access = access_of(subject)
            try:
                destination = read_subscription(
                    Command(c=SUBSCRIBE, destination=name, type=kind)
                ).destination
                if destination.type is not DestinationType.TOPIC or destination.exact:
                    self._gate_require(access, destination, Privilege.READ)
                await self._subscribers.subscribe(endpoint, access, destination, None)
            except AsbpError as exc:
                endpoint.fault(
                    exc.code,
                    f"{name!r} was not subscribed again on resuming: {exc.message}",
                    command_id=None,
                    cause=SUBSCRIBE,
                )

    def _subscriptions_changed(self, endpoint: Endpoint) -> None:
        hook = self.on_subscriptions
        if hook is not None and not endpoint.parked and endpoint.key.startswith("c/"):
            hook(endpoint.key[2:])

    def tube_closed(self, tube: Tube) -> None:
        """The Tube closed: likewise."""
        endpoint = self._endpoints.pop("t/" + tube.id)
        if endpoint is not None:
            self._close(endpoint)

    def fault_sent(
        self, code: FaultCode, message: str, *, cause: str | None, agent: str | None
    ) -> None:
        """The broker sent a fault: record it on ``/system/faults/<broker>``."""
        self.system.fault(
            code,
            message,
            cause=cause,
            to="user-agent" if agent is None else "application-agent",
            agent=agent,
        )

    def _close(self, endpoint: Endpoint) -> None:
        if endpoint.closed:
            return
        endpoint.closed = True
        self._endpoints.release_outbox(endpoint)
        self._subscribers.leave_all(endpoint)
        self._sequencer.close(endpoint)
        self._subscribers.release_leases(endpoint)

    # -- observation ------------------------------------------------------------------

    def replace_acl(self, acl: Acl) -> None:
        """Check subscriptions, publications and polls against ``acl`` from now on."""
        self._gate.replace(acl)

    def topic_subscribers(self, name: str) -> int:
        """This broker's members of the topic subscription ``name`` (for tests, stats)."""
        return self._subscribers.topic_subscribers(name)

    def topic_subscriptions(self) -> list[tuple[str, bool, int]]:
        """This broker's topic subscriptions: name, whether a pattern, members."""
        return self._subscribers.topic_subscriptions()

    def queue_consumers(self, name: str) -> int:
        """This broker's consumers of the queue ``name``."""
        return self._subscribers.queue_consumers(name)


def _nobody(*args: object, **kwargs: object) -> None:
    """A parked endpoint's faults: its client is away (its Commands were answered
    before the drop, or their answers are lost with the connection)."""


def _drop(frame: bytes) -> None:
    """A parked endpoint's queue deliveries: none are logged (the queue is their log)."""


def _no_room() -> tuple[int, int]:
    """A parked endpoint's outbox room: none (it consumes no queue, polls nothing)."""
    return 0, 0
