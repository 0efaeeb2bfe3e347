"""Topics and queues for Channels and Tubes: the messaging built-ins.

Theory of operation
-------------------
The router hands this module every ``asbp.publish``, ``asbp.subscribe``,
``asbp.unsubscribe``, ``asbp.poll`` and ``asbp.ack``, from User-Agents and
Application-Agents alike, and tells it when a Channel or Tube closes. The
router never awaits, and engine calls do; so each Command goes through three
steps:

1. **On sight** (synchronously, inside the router's call): the Command is read
   into a request (gateway.messaging.requests: faults 2001, 2002, 1203), its
   size is checked (1101: every notification of it must fit the frame limit),
   and the access-control lists are asked (3201). A Command refused here is
   answered at once.
2. **In order**: the accepted Command becomes an
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
     (Endpoint.poll_share), so polls never cut their own client off (2105).
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

* **Topics**: the engine calls :meth:`Messaging._on_topic` for every topic
  message of every broker sharing it. It is matched against this broker's
  subscriptions (gateway.messaging.subscriptions.Topics); each matching
  subscription gets one notification, encoded once and left in each member's
  outbox (never awaited). If one client's subscriptions match a message
  twice, it gets two notifications, each naming its subscription, as Sapo's
  Notification does. No subscriber: the message is dropped.
* **Queues**: one task per queue with subscribers here
  (gateway.messaging.consumers) leases messages and hands them out.

Delivery notices come from the engine with the ``notify`` address given at
publication, ``<broker>/<c|t>/<Channel- or Tube id>/<u>``: only this broker's
notices reach it (the engine routes on the prefix), and the rest names the
client and the publication's ``u``. A notice that arrives before the
publication's ``asbp.accepted`` waits for it, so a publisher always learns the
message id first.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Final

import asbp
from asbp import AsbpError, Command, FaultCode
from gateway.acl import AccessContext, DestinationType, Privilege
from gateway.config.model import MessagingLimits
from gateway.engines.base import (
    DEFAULT_PRIORITY,
    Delivery,
    DeliveryNotice,
    Engine,
    Message,
    new_message,
)
from gateway.messaging.consumers import ANSWER_BYTES, QueueConsumer, cancel_and_wait
from gateway.messaging.eager import start_eagerly
from gateway.messaging.notifications import (
    accepted,
    notice,
    notification,
    notification_size,
    published,
)
from gateway.messaging.requests import (
    Destination,
    read_ack,
    read_poll,
    read_publish,
    read_subscription,
)
from gateway.messaging.subscriptions import Endpoint, Operation, Topics
from gateway.messaging.system_topics import SystemTopics
from gateway.routing import builtin_commands

if TYPE_CHECKING:
    from gateway.connections.channels import Channel
    from gateway.connections.outboxes import Outbox
    from gateway.connections.tubes import Tube
    from gateway.routing.router import Router

__all__ = [
    "FETCH_WAIT",
    "MessageTooLarge",
    "Messaging",
    "TooManyPending",
    "TooManySubscriptions",
    "message_id",
]

#: Seconds one fetch of a queue consumer waits for a message before it looks again.
FETCH_WAIT: Final = 1.0
#: Seconds the broker gives its last releases of leases when it stops.
STOP_GRACE: Final = 5.0


class TooManySubscriptions(AsbpError):
    """Sapo 2004: one more distinct subscription would pass ``max_subscriptions``."""

    code = FaultCode.MAX_SUBSCRIPTIONS_REACHED


class MessageTooLarge(AsbpError):
    """Sapo 1101: a notification of this message would not fit the frame limit."""

    code = FaultCode.INVALID_MESSAGE_SIZE


class TooManyPending(AsbpError):
    """2106: the sender has ``max_pending`` messaging Commands waiting already."""

    code = FaultCode.TOO_MANY_IN_FLIGHT


class Messaging:
    """The messaging built-ins of one broker.

    Args:
        router: delivers to Channels and Tubes, sends faults, holds the ACL.
        engine: topics, queues and virtual queues (started by the caller).
        broker_id: this broker, in notice addresses and system topics.
        limits: subscriptions, prefetch, pending Commands, poll wait.
        frame_limits: the codec limits every notification must fit.
        log: the broker's logger.
        clock: wall-clock seconds, as the engine uses.
    """

    def __init__(
        self,
        router: Router,
        engine: Engine,
        *,
        broker_id: str,
        limits: MessagingLimits,
        frame_limits: asbp.Limits,
        log: logging.Logger,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self._router = router
        self._acl = router.acl
        self._broker_id = broker_id
        self._notify_prefix = broker_id + "/"
        self._limits = limits
        self._frame_limits = frame_limits
        self._log = log
        self._clock = clock
        self._endpoints: dict[str, Endpoint] = {}
        #: Each endpoint's outbox, for its queue consumers to wait on (_watch).
        self._outboxes: dict[Endpoint, Outbox] = {}
        self._topics = Topics()
        self._queues: dict[str, QueueConsumer] = {}
        #: Consumers whose last subscriber left while their task was fetching: the
        #: task ends once the fetch returns (releasing what it got), or at stop().
        self._orphans: set[QueueConsumer] = set()
        #: Notices for publications whose asbp.accepted has not been sent yet.
        self._held_notices: dict[str, list[DeliveryNotice]] = {}
        self._background: set[asyncio.Future[Any]] = set()
        self.system = SystemTopics(
            engine, broker_id=broker_id, interval=limits.system_topic_interval, log=log, clock=clock
        )

    # -- life cycle ----------------------------------------------------------

    def start(self) -> None:
        """Listen to the engine and start publishing system topics (inside the loop)."""
        self.engine.listen(self._on_topic)
        self.engine.on_notice(self._on_notice)
        self.system.start()

    async def stop(self) -> None:
        """Stop consumers and workers; release every lease still held (best effort).

        Call after every Channel and Tube is closed, before the engine closes.
        """
        for consumer in [*self._queues.values(), *self._orphans]:
            await consumer.stop()
            held_back = consumer.take_held_back()
            if held_back:
                self._spawn(self._release(consumer.queue, held_back))
        self._queues.clear()
        self._orphans.clear()
        for endpoint in list(self._endpoints.values()):
            self._close(endpoint)
        pending = list(self._background)
        if pending:
            # Publications sent before the close still reach the engine, and leases are
            # released, within a grace period; whatever is left then is cancelled.
            _, late = await asyncio.wait(pending, timeout=STOP_GRACE)
            for task in late:
                await cancel_and_wait(task)
        await self.system.stop()

    def tick(self) -> None:
        """Housekeeping: forget ended leases, publish consumer counts when due."""
        now = self._clock()
        for endpoint in self._endpoints.values():
            if endpoint.leases:
                for queue in endpoint.expired(now):
                    consumer = self._queues.get(queue)
                    if consumer is not None:
                        consumer.wake()
        self._orphans = {c for c in self._orphans if c.running}
        self.system.tick(
            ((s.name, len(s.members)) for s in self._topics.all()),
            ((name, len(c.members)) for name, c in self._queues.items()),
        )

    # -- the router's hooks --------------------------------------------------------

    def channel_command(self, channel: Channel, command: Command, name: str) -> None:
        """A messaging built-in from a User-Agent."""
        endpoint = self._endpoints.get("c/" + channel.id)
        if endpoint is None:
            endpoint = Endpoint(
                "c/" + channel.id,
                functools.partial(self._router.deliver, channel),
                functools.partial(self._router.fault, channel),
                channel.outbox.room,
            )
            self._endpoints[endpoint.key] = endpoint
            self._outboxes[endpoint] = channel.outbox
        access = channel.access
        if "s" in command:
            auth = self._router.auth
            if auth is None:
                self._router.fault(
                    channel,
                    FaultCode.ACCESS_DENIED,
                    "Subject-Identifier 's' does not belong to this Channel",
                    command_id=command.command_id,
                    cause=name,
                )
                return
            subject = auth.resolve(channel, command)
            if subject is None:
                return
            access = subject.access
        self._command(endpoint, access, command, name)

    def tube_command(self, tube: Tube, command: Command, name: str) -> None:
        """A messaging built-in from an Application-Agent."""
        endpoint = self._endpoints.get("t/" + tube.id)
        if endpoint is None:
            endpoint = Endpoint(
                "t/" + tube.id,
                functools.partial(self._router.send_tube_frame, tube),
                functools.partial(self._router.fault_tube, tube),
                tube.outbox.room,
                agent_id=tube.agent_id,
            )
            self._endpoints[endpoint.key] = endpoint
            self._outboxes[endpoint] = tube.outbox
        self._command(endpoint, tube.access, command, name)

    def channel_closed(self, channel: Channel) -> None:
        """The Channel closed: its subscriptions end and its leases are released."""
        endpoint = self._endpoints.pop("c/" + channel.id, None)
        if endpoint is not None:
            self._close(endpoint)

    def tube_closed(self, tube: Tube) -> None:
        """The Tube closed: likewise."""
        endpoint = self._endpoints.pop("t/" + tube.id, None)
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

    # -- on sight --------------------------------------------------------------------

    def _command(
        self, endpoint: Endpoint, access: AccessContext, command: Command, name: str
    ) -> None:
        command_id = command.command_id
        try:
            if endpoint.pending >= self._limits.max_pending:
                raise TooManyPending(
                    f"{endpoint.pending} messaging Commands already wait for the engine "
                    "on this connection"
                )
            operation = self._operation(endpoint, access, command, name, command_id)
        except AsbpError as exc:
            self._fault(endpoint, exc.code, exc.message, command_id, name)
            return
        endpoint.pending += 1
        if operation.pipelined and endpoint.worker is None:
            self._start(endpoint, operation)  # nothing waits for its turn: go now
            return
        endpoint.operations.append(operation)
        if endpoint.worker is None:
            endpoint.worker = worker = asyncio.create_task(
                self._work(endpoint), name=f"asbp-messaging:{endpoint.key}"
            )
            # Tracked until done, even after its endpoint is forgotten: stop() lets the
            # publications of closed Channels reach the engine.
            self._background.add(worker)
            worker.add_done_callback(self._background.discard)

    def _operation(
        self,
        endpoint: Endpoint,
        access: AccessContext,
        command: Command,
        name: str,
        command_id: int | None,
    ) -> Operation:
        """Read, check and prepare one Command (the "on sight" step)."""
        if name == builtin_commands.PUBLISH:
            return self._publish_operation(endpoint, access, command, command_id)
        if name in (builtin_commands.SUBSCRIBE, builtin_commands.UNSUBSCRIBE):
            return self._subscription_operation(endpoint, access, command, name)
        if name == builtin_commands.POLL:
            poll = read_poll(
                command, max_count=self._limits.prefetch, max_wait=self._limits.max_poll_wait
            )
            self._require(access, poll.destination, Privilege.READ)
            run = functools.partial(
                self._poll, endpoint, access, poll.destination, poll.count, poll.wait,
                command_id,
            )  # fmt: skip
            return Operation(name, command_id, run, detached=True)
        if name == builtin_commands.ACK:
            ack = read_ack(command)
            self._require(access, ack.destination, Privilege.READ)
            queue = ack.destination.name
            return Operation(
                name,
                command_id,
                functools.partial(self.engine.ack, queue, ack.receipts),
                answer=functools.partial(
                    self._acknowledged, endpoint, queue, ack.receipts, command_id
                ),
                pipelined=True,
                after_close=True,
            )
        raise AsbpError(
            f"{name} is sent by the broker, never to it", code=FaultCode.UNEXPECTED_MESSAGE_TYPE
        )

    def _publish_operation(
        self, endpoint: Endpoint, access: AccessContext, command: Command, command_id: int | None
    ) -> Operation:
        publish = read_publish(command)
        destination = publish.destination
        self._require(access, destination, Privilege.WRITE)
        headers = publish.headers  # read_publish's own dict: nobody else holds it
        if endpoint.agent_id is not None:
            headers = {**headers, "a": endpoint.agent_id}
        self._check_size(destination.name, publish.payload, headers)
        now = self._clock()
        if publish.delay is not None:
            not_before: float | None = now + publish.delay
        elif publish.not_before_ms is not None:
            not_before = publish.not_before_ms / 1000
        else:
            not_before = None
        notify = None
        if publish.notices:
            # "<broker>/<c|t>/<id>/<u>": the engine routes on the broker, we on the rest.
            notify = (
                f"{self._notify_prefix}{endpoint.key}/{'' if command_id is None else command_id}"
            )
        message = new_message(
            message_id(),
            destination.name,
            publish.payload,
            now,
            None if publish.ttl is None else now + publish.ttl,
            DEFAULT_PRIORITY if publish.priority is None else publish.priority,
            not_before,
            notify,
            publish.notices,
            headers,
        )
        queued = destination.type is DestinationType.QUEUE
        run = functools.partial(self.engine.enqueue if queued else self.engine.publish, message)
        abandon = None
        if notify is not None:
            # Notices that arrive before the acceptance wait for it (_on_notice).
            self._held_notices[message.id] = []
            abandon = functools.partial(self._held_notices.pop, message.id, None)
        return Operation(
            builtin_commands.PUBLISH,
            command_id,
            run,
            answer=functools.partial(self._published, endpoint, message.id, command_id),
            abandon=abandon,
            pipelined=queued,
            after_close=True,
        )

    def _subscription_operation(
        self, endpoint: Endpoint, access: AccessContext, command: Command, name: str
    ) -> Operation:
        command_id = command.command_id
        destination = read_subscription(command).destination
        if name == builtin_commands.UNSUBSCRIBE:
            run = functools.partial(self._unsubscribe, endpoint, destination, command_id)
            return Operation(name, command_id, run)
        if destination.type is not DestinationType.TOPIC or destination.exact:
            # A topic pattern is checked per topic delivered instead: its text is not a
            # name the policy could judge.
            self._require(access, destination, Privilege.READ)
        run = functools.partial(self._subscribe, endpoint, access, destination, command_id)
        return Operation(name, command_id, run)

    def _require(
        self, access: AccessContext, destination: Destination, privilege: Privilege
    ) -> None:
        acl = self._acl
        if acl is None:
            return
        decision = acl.check(access, destination.type, destination.name, privilege)
        if not decision.allowed:
            self._log.warning(
                "acl.denied",
                extra={
                    "who": access.channel_id,
                    "type": destination.type.value,
                    "destination": destination.name,
                    "privilege": privilege.value,
                    "reason": acl.describe(decision),
                },
            )
            verb = "publishing to" if privilege is Privilege.WRITE else "consuming from"
            raise AsbpError(
                f"{verb} {destination.type.value} {destination.name!r} is denied",
                code=FaultCode.ACCESS_DENIED,
            )

    def _may_read(self, access: AccessContext, topic: str) -> bool:
        acl = self._acl
        return (
            acl is None or acl.check(access, DestinationType.TOPIC, topic, Privilege.READ).allowed
        )

    def _check_size(self, destination: str, payload: bytes, headers: Mapping[str, str]) -> None:
        header = notification_size(destination, payload, headers)
        limits = self._frame_limits
        if header > limits.max_header_bytes or header + len(payload) > limits.max_frame_bytes:
            room = max(0, limits.max_frame_bytes - header)
            raise MessageTooLarge(
                f"a notification of this message would pass the frame limit of "
                f"{limits.max_frame_bytes} bytes; its payload may be {room} bytes at most"
            )

    def _fault(
        self,
        endpoint: Endpoint,
        code: FaultCode,
        message: str,
        command_id: int | None,
        cause: str,
    ) -> None:
        endpoint.fault(code, message, command_id=command_id, cause=cause)

    # -- in order ----------------------------------------------------------------------

    def _start(self, endpoint: Endpoint, operation: Operation) -> None:
        """Start a pipelined operation's engine call; answer it once it and those ahead are done.

        The call's first step runs now (:func:`~gateway.messaging.eager.start_eagerly`):
        a call that finishes at once (the memory engine's) with nothing ahead of it is
        answered at once, without a task. An engine call that returns a future (the
        Redis engine's) was made already, and its future is awaited as it is.
        """
        try:
            awaitable = operation.run()
        except Exception as exc:  # raised before it could return an awaitable
            call: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            call.set_exception(exc)
        else:
            if isinstance(awaitable, asyncio.Future):
                call = awaitable
            else:
                assert isinstance(awaitable, Coroutine), awaitable
                call = start_eagerly(awaitable)
        operation.task = call
        if call.done():
            if not endpoint.in_flight:
                endpoint.pending -= 1
                self._settle(endpoint, operation, call)
                return
            endpoint.in_flight.append(operation)  # answered after those ahead of it
            return
        in_flight = endpoint.in_flight
        in_flight.append(operation)
        # Tracked until done, even after its endpoint is forgotten: stop() lets the
        # publications of closed Channels reach the engine.
        self._background.add(call)
        if len(in_flight) == 1:
            # Only the head's call is watched: once it is done, _call_done answers it
            # and every one behind it that is done too, then watches the next head.
            # The engine settles a batch at once, so a batch costs one callback.
            call.add_done_callback(functools.partial(self._call_done, endpoint))

    def _call_done(self, endpoint: Endpoint, _: asyncio.Future[Any]) -> None:
        """The head's engine call ended: answer every operation at the head that is done."""
        in_flight = endpoint.in_flight
        while in_flight:
            operation = in_flight[0]
            done = operation.task
            assert done is not None
            if not done.done():
                # Answered after the one ahead of it; watched from now on, as the head.
                done.add_done_callback(functools.partial(self._call_done, endpoint))
                break
            in_flight.popleft()
            self._background.discard(done)
            endpoint.pending -= 1
            self._settle(endpoint, operation, done)
        if not in_flight and endpoint.idle is not None:
            idle, endpoint.idle = endpoint.idle, None
            if not idle.done():
                idle.set_result(None)

    def _settle(self, endpoint: Endpoint, operation: Operation, call: asyncio.Future[Any]) -> None:
        """Answer a pipelined operation whose engine call is done."""
        if call.cancelled():  # stop() gave up on it: nobody is left to answer
            if operation.abandon is not None:
                operation.abandon()
            return
        error = call.exception()
        if error is None:
            assert operation.answer is not None
            operation.answer(call.result())
            return
        if operation.abandon is not None:
            operation.abandon()
        self._failed(endpoint, operation, error)

    async def _work(self, endpoint: Endpoint) -> None:
        """Work through ``endpoint.operations``: in turn, or starting pipelined ones."""
        operations = endpoint.operations
        try:
            while operations:
                operation = operations[0]  # left in place while it waits: _close sees it
                if endpoint.closed and not operation.after_close:
                    operations.popleft()
                    endpoint.pending -= 1
                    continue
                if operation.pipelined:
                    operations.popleft()
                    self._start(endpoint, operation)
                    continue
                if endpoint.in_flight:
                    # In turn: everything ahead is answered first.
                    idle = endpoint.idle
                    if idle is None:
                        idle = endpoint.idle = asyncio.get_running_loop().create_future()
                    await idle
                    continue
                operations.popleft()
                if operation.detached:
                    # Its first step now (the fetch is in place before anything sent
                    # after it starts), the rest beside the others.
                    poll = start_eagerly(self._execute(endpoint, operation), task=True)
                    if not poll.done():
                        endpoint.polls.add(poll)
                        poll.add_done_callback(endpoint.polls.discard)
                        self._background.add(poll)
                        poll.add_done_callback(self._background.discard)
                    continue
                await self._execute(endpoint, operation)
        finally:
            endpoint.worker = None

    async def _execute(self, endpoint: Endpoint, operation: Operation) -> None:
        try:
            result = await operation.run()
        except BaseException as exc:
            if operation.abandon is not None:
                operation.abandon()
            if not isinstance(exc, Exception):  # cancelled: the broker is stopping
                raise
            self._failed(endpoint, operation, exc)
        else:
            if operation.answer is not None:
                operation.answer(result)
        finally:
            endpoint.pending -= 1

    def _failed(self, endpoint: Endpoint, operation: Operation, error: BaseException) -> None:
        """Fault ``operation``'s Command (and only it) for ``error``."""
        if isinstance(error, AsbpError):
            if not endpoint.closed:
                self._fault(
                    endpoint, error.code, error.message, operation.command_id, operation.name
                )
            return
        # Not an ASBP error: an engine bug or an unwrapped driver error. The sender
        # still gets an answer (never silence), and the log gets the traceback.
        self._log.error(
            "messaging.failed",
            extra={"endpoint": endpoint.key, "command": operation.name},
            exc_info=error,
        )
        if not endpoint.closed:
            self._fault(
                endpoint,
                FaultCode.ENGINE_UNAVAILABLE,
                "the engine failed; the operation may not have happened",
                operation.command_id,
                operation.name,
            )

    def _reply(self, endpoint: Endpoint, frame: bytes) -> None:
        if not endpoint.closed:
            endpoint.send(frame)

    def _published(
        self, endpoint: Endpoint, message_id: str, command_id: int | None, _: None
    ) -> None:
        """A publication's engine call succeeded: accept it, then release its notices."""
        if command_id is not None:
            self._reply(endpoint, published(command_id, message_id))
        held = self._held_notices.pop(message_id, None)
        if held:
            for notice_held in held:
                self._on_notice(notice_held)

    def _distinct(self) -> int:
        return len(self._topics) + len(self._queues)

    def _room_for(self, name: str, exists: bool) -> None:
        if not exists and self._distinct() >= self._limits.max_subscriptions:
            raise TooManySubscriptions(
                f"this broker holds {self._limits.max_subscriptions} distinct subscriptions; "
                f"{name!r} would be one more"
            )

    async def _subscribe(
        self,
        endpoint: Endpoint,
        access: AccessContext,
        destination: Destination,
        command_id: int | None,
    ) -> None:
        if endpoint.closed:
            return
        name = destination.name
        if destination.type is DestinationType.TOPIC:
            self._room_for(name, self._topics.get(name) is not None)
            if self._topics.add(endpoint, destination, access):
                subscription = self._topics.get(name)
                assert subscription is not None
                self.system.topic_count(name, len(subscription.members))
        else:
            self._room_for(name, name in self._queues)
            if destination.type is DestinationType.VIRTUAL_QUEUE:
                await self.engine.declare_virtual_queue(*destination.queue_parts)
                if _closed(endpoint):  # while the engine worked
                    return
                # The await let others in: the limit is checked again.
                self._room_for(name, name in self._queues)
            consumer = self._queues.get(name)
            if consumer is None:
                consumer = QueueConsumer(
                    self.engine,
                    name,
                    destination.type,
                    consumer=self._broker_id,
                    prefetch=self._limits.prefetch,
                    wait=FETCH_WAIT,
                    may_read=self._may_read,
                    watch=self._watch,
                    clock=self._clock,
                    log=self._log,
                )
                self._queues[name] = consumer
            new = endpoint not in consumer.members
            consumer.add(endpoint, access)
            if new:
                self.system.queue_count(name, len(consumer.members))
        if command_id is not None:
            self._reply(endpoint, accepted(builtin_commands.SUBSCRIBE, command_id))

    async def _unsubscribe(
        self, endpoint: Endpoint, destination: Destination, command_id: int | None
    ) -> None:
        self._leave(endpoint, destination.name)
        if command_id is not None:
            self._reply(endpoint, accepted(builtin_commands.UNSUBSCRIBE, command_id))

    def _leave(self, endpoint: Endpoint, name: str) -> None:
        subscription = self._topics.remove(endpoint, name)
        if subscription is not None:
            self.system.topic_count(name, len(subscription.members))
        consumer = endpoint.queues.get(name)
        if consumer is not None:
            consumer.remove(endpoint)
            if not consumer.members and self._queues.get(name) is consumer:
                del self._queues[name]
                if consumer.running:
                    self._orphans.add(consumer)
            self.system.queue_count(name, len(consumer.members))

    async def _poll(
        self,
        endpoint: Endpoint,
        access: AccessContext,
        destination: Destination,
        count: int,
        wait: float,
        command_id: int | None,
    ) -> None:
        queue = destination.name
        loop = asyncio.get_running_loop()
        end = loop.time() + wait
        # A poll never takes more messages than the outbox has room for: several
        # polls in flight would otherwise be handed more deliveries than it holds,
        # and the client cut off (2105) although it reads everything.
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
                deliveries = await self.engine.fetch(
                    queue,
                    f"{self._broker_id}/{endpoint.key}",
                    count=share,
                    wait=max(0.0, end - loop.time()),
                )
            finally:
                endpoint.end_poll_fetch(share)
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
            endpoint.send(frame)
            delivered += 1
        if unsent:
            self._spawn(self._release(queue, unsent))
        if unreadable:
            self._log.warning(
                "acl.denied",
                extra={"queue": queue, "discarded": len(unreadable), "privilege": "READ"},
            )
            await self.engine.ack(queue, unreadable)
        if command_id is not None:
            self._reply(endpoint, accepted(builtin_commands.POLL, command_id, count=delivered))

    def _acknowledged(
        self,
        endpoint: Endpoint,
        queue: str,
        receipts: tuple[str, ...],
        command_id: int | None,
        live: int,
    ) -> None:
        """An acknowledgement's engine call succeeded: forget the leases, make room, accept."""
        for receipt in receipts:
            endpoint.drop(receipt)
        consumer = self._queues.get(queue)
        if consumer is not None:
            consumer.wake()
        if command_id is not None:
            self._reply(endpoint, accepted(builtin_commands.ACK, command_id, count=live))

    # -- outboxes -----------------------------------------------------------------------

    def _watch(self, endpoint: Endpoint) -> None:
        """Wake ``endpoint``'s queue consumers once its outbox next drains."""
        outbox = self._outboxes.get(endpoint)
        if outbox is not None:
            outbox.when_drained(functools.partial(self._drained, endpoint))

    @staticmethod
    def _drained(endpoint: Endpoint) -> None:
        for consumer in endpoint.queues.values():
            consumer.wake()

    # -- closing ------------------------------------------------------------------------

    def _close(self, endpoint: Endpoint) -> None:
        if endpoint.closed:
            return
        endpoint.closed = True
        outbox = self._outboxes.pop(endpoint, None)
        if outbox is not None:
            outbox.when_drained(None)
        for name in [*endpoint.topics, *endpoint.queues]:
            self._leave(endpoint, name)
        for task in list(endpoint.polls):
            task.cancel()
        kept = [o for o in endpoint.operations if o.after_close]
        endpoint.pending -= len(endpoint.operations) - len(kept)
        endpoint.operations.clear()
        endpoint.operations.extend(kept)
        for queue, receipts in endpoint.leases_by_queue().items():
            for receipt in receipts:
                endpoint.drop(receipt)
            self._spawn(self._release(queue, receipts))

    async def _release(self, queue: str, receipts: list[str]) -> None:
        try:
            await self.engine.release(queue, receipts)
        except AsbpError as exc:
            # The leases run out by themselves; the messages are delivered again then.
            self._log.warning(
                "messaging.release_failed",
                extra={"queue": queue, "code": int(exc.code), "reason": exc.message},
            )
        consumer = self._queues.get(queue)
        if consumer is not None:
            consumer.wake()

    def _spawn(self, work: Awaitable[object]) -> None:
        async def run() -> object:
            return await work

        task: asyncio.Task[object] = asyncio.create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- from the engine ---------------------------------------------------------------

    def _on_topic(self, message: Message) -> None:
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
                endpoint.send(frame)

    def _on_notice(self, event: DeliveryNotice) -> None:
        held = self._held_notices.get(event.message_id)
        if held is not None:
            held.append(event)
            return
        address = event.notify
        if not address.startswith(self._notify_prefix):
            return
        key, _, raw_id = address[len(self._notify_prefix) :].rpartition("/")
        endpoint = self._endpoints.get(key)
        if endpoint is None or endpoint.closed:
            return
        command_id = int(raw_id) if raw_id.isdigit() else None
        endpoint.send(notice(event, command_id=command_id))

    # -- observation ------------------------------------------------------------------

    def topic_subscribers(self, name: str) -> int:
        """This broker's members of the topic subscription ``name`` (for tests, stats)."""
        subscription = self._topics.get(name)
        return 0 if subscription is None else len(subscription.members)

    def queue_consumers(self, name: str) -> int:
        """This broker's consumers of the queue ``name``."""
        consumer = self._queues.get(name)
        return 0 if consumer is None else len(consumer.members)


def message_id() -> str:
    """A new message id: a random (version 4) UUID's 32 hex digits.

    What ``uuid.uuid4().hex`` returns, for a fraction of its cost (one per
    publication; the UUID object is never needed). The random bits come from
    ``os.urandom`` as ``uuid4`` takes them, a few kilobytes per system call.
    """
    global _random_hex, _random_at
    at = _random_at
    if at >= len(_random_hex):
        _random_hex, at = os.urandom(_RANDOM_BYTES).hex(), 0
    _random_at = at + 32
    digits = _random_hex[at : at + 32]
    # The version nibble is 4; the variant's two top bits are 10 (RFC 4122).
    return f"{digits[:12]}4{digits[13:16]}{_VARIANT[digits[16]]}{digits[17:]}"


# Random hex digits, used 32 at a time. Module state, but only a pool of random
# bits: nothing observable depends on who drew which.
_RANDOM_BYTES: Final = 4096
_random_hex = ""
_random_at = 0
#: A hex digit with its top two bits set to the variant's 10.
_VARIANT: Final = {f"{d:x}": f"{8 | (d & 3):x}" for d in range(16)}


def _forget_random() -> None:
    """A forked child draws its own bits: two processes must never share ids."""
    global _random_hex, _random_at
    _random_hex, _random_at = "", 0


os.register_at_fork(after_in_child=_forget_random)


def _closed(endpoint: Endpoint) -> bool:
    """Whether ``endpoint`` is closed (a call, so the type checker reads it afresh)."""
    return endpoint.closed
