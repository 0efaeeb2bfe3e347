"""The messaging built-ins on sight: each Command read, checked and made an operation.

The first of a Command's three steps (gateway.messaging.service), inside the
router's call: the Command is read into a request (gateway.messaging.requests:
faults 2001, 2002, 1203), a publication's size is checked (1101: every
notification of it must fit the frame limit, :class:`MessageTooLarge`), the
access-control lists are asked (3201, gateway.messaging.acl_gate), and the
sender's count of unanswered Commands too (2106). A Command refused here is
answered at once. An accepted one becomes an
:class:`~gateway.messaging.subscriptions.Operation`, bound to the work it does
and to how it is answered, and goes to the sender's sequence
(gateway.messaging.sequencing).

This is the hot path of every publication and acknowledgement: the
collaborators' methods it calls are bound once, in the constructor.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import asbp
from asbp import AsbpError, Command, FaultCode
from asbp.names import ACK, POLL, PUBLISH, SUBSCRIBE, UNSUBSCRIBE
from gateway.acl import AccessContext, DestinationType, Privilege
from gateway.config.model import MessagingLimits
from gateway.connections.flow import PUBLISHER
from gateway.engines.base import DEFAULT_PRIORITY, Engine, new_message
from gateway.errors import GatewayError
from gateway.messaging.acl_gate import AclGate
from gateway.messaging.delivery_notices import DeliveryNotices
from gateway.messaging.message_ids import MessageIdPool
from gateway.messaging.notifications import accepted, notification_size, published
from gateway.messaging.polling import Poller
from gateway.messaging.requests import read_ack, read_poll, read_publish, read_subscription
from gateway.messaging.sequencing import Sequencer, TooManyPending
from gateway.messaging.subscribers import Subscribers
from gateway.messaging.subscriptions import Endpoint, Operation
from gateway.metrics.counts import MessagingCounts
from gateway.types import RemembersOrigins

__all__ = ["CommandDispatcher", "MessageTooLarge"]


class MessageTooLarge(GatewayError):
    """Sapo 1101: a notification of this message would not fit the frame limit."""

    code = FaultCode.INVALID_MESSAGE_SIZE


class CommandDispatcher:
    """Turns messaging Commands into operations of their sender's sequence.

    Args:
        engine: where publications and acknowledgements go.
        limits: ``max_pending``, and ``prefetch`` and ``max_poll_wait`` for polls.
        frame_limits: the codec limits every notification must fit.
        gate: the access-control lists.
        ids: where message ids come from.
        notices: delivery notices, held until their publication is accepted.
        subscribers: subscriptions, queue consumers and their leases.
        poller: carries out polls.
        sequencer: starts and answers operations in order.
        origins: where each topic message's local publisher is noted until it
            is delivered (flow control: gateway.connections.flow).
        clock: wall-clock seconds, as the engine uses.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        limits: MessagingLimits,
        frame_limits: asbp.Limits,
        gate: AclGate,
        ids: MessageIdPool,
        notices: DeliveryNotices,
        subscribers: Subscribers,
        poller: Poller,
        sequencer: Sequencer,
        origins: RemembersOrigins,
        clock: Callable[[], float],
        counts: MessagingCounts | None = None,
    ) -> None:
        self._engine = engine
        self._origins = origins
        self._counts = counts if counts is not None else MessagingCounts()
        self._limits = limits
        self._max_pending = limits.max_pending
        self._frame_limits = frame_limits
        self._require = gate.require
        self._next_id = ids.next
        self._notices = notices
        self._subscribers = subscribers
        self._poller = poller
        self._submit = sequencer.submit
        self._clock = clock

    def command(
        self, endpoint: Endpoint, access: AccessContext, command: Command, name: str
    ) -> None:
        """Accept ``command`` into ``endpoint``'s sequence, or fault it now."""
        command_id = command.command_id
        try:
            if endpoint.pending >= self._max_pending:
                raise TooManyPending(
                    f"{endpoint.pending} messaging Commands already wait for the engine "
                    "on this connection"
                )
            operation = self._operation(endpoint, access, command, name, command_id)
        except AsbpError as exc:
            endpoint.fault(exc.code, exc.message, command_id=command_id, cause=name)
            return
        self._submit(endpoint, operation)

    def _operation(
        self,
        endpoint: Endpoint,
        access: AccessContext,
        command: Command,
        name: str,
        command_id: int | None,
    ) -> Operation:
        """Read, check and prepare one Command (the "on sight" step)."""
        if name == PUBLISH:
            return self._publish_operation(endpoint, access, command, command_id)
        if name in (SUBSCRIBE, UNSUBSCRIBE):
            return self._subscription_operation(endpoint, access, command, name)
        if name == POLL:
            poll = read_poll(
                command, max_count=self._limits.prefetch, max_wait=self._limits.max_poll_wait
            )
            self._require(access, poll.destination, Privilege.READ)
            run = functools.partial(
                self._poller.poll, endpoint, access, poll.destination, poll.count, poll.wait,
                command_id,
            )  # fmt: skip
            return Operation(name, command_id, run, detached=True)
        if name == ACK:
            ack = read_ack(command)
            self._require(access, ack.destination, Privilege.READ)
            queue = ack.destination.name
            return Operation(
                name,
                command_id,
                functools.partial(self._engine.ack, queue, ack.receipts),
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
            notify = self._notices.address(endpoint, command_id)
        message = new_message(
            self._next_id(),
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
        if not queued:
            # Its delivery, later, holds this publisher back if it fills a
            # subscriber's outbox (gateway.connections.flow).
            gate = PUBLISHER.gate
            if gate is not None:
                self._origins.remember(message.id, gate)
        engine = self._engine
        run = functools.partial(engine.enqueue if queued else engine.publish, message)
        if queued:
            self._counts.publications += 1
        abandon = None
        if notify is not None:
            # Notices that arrive before the acceptance wait for it (DeliveryNotices).
            self._notices.hold(message.id)
            abandon = functools.partial(self._notices.abandon, message.id)
        return Operation(
            PUBLISH,
            command_id,
            run,
            answer=functools.partial(
                self._published, endpoint, message.id, command_id, notify is not None
            ),
            abandon=abandon,
            pipelined=queued,
            after_close=True,
        )

    def _subscription_operation(
        self, endpoint: Endpoint, access: AccessContext, command: Command, name: str
    ) -> Operation:
        command_id = command.command_id
        destination = read_subscription(command).destination
        if name == UNSUBSCRIBE:
            run = functools.partial(
                self._subscribers.unsubscribe, endpoint, destination, command_id
            )
            return Operation(name, command_id, run)
        if destination.type is not DestinationType.TOPIC or destination.exact:
            # A topic pattern is checked per topic delivered instead: its text is not a
            # name the policy could judge.
            self._require(access, destination, Privilege.READ)
        run = functools.partial(
            self._subscribers.subscribe, endpoint, access, destination, command_id
        )
        return Operation(name, command_id, run)

    def _check_size(self, destination: str, payload: bytes, headers: Mapping[str, str]) -> None:
        header = notification_size(destination, payload, headers)
        limits = self._frame_limits
        if header > limits.max_header_bytes or header + len(payload) > limits.max_frame_bytes:
            room = max(0, limits.max_frame_bytes - header)
            raise MessageTooLarge(
                f"a notification of this message would pass the frame limit of "
                f"{limits.max_frame_bytes} bytes; its payload may be {room} bytes at most"
            )

    def _published(
        self,
        endpoint: Endpoint,
        message_id: str,
        command_id: int | None,
        noticed: bool,
        _: None,
    ) -> None:
        """A publication's engine call succeeded: accept it, then release its notices."""
        if command_id is not None:
            endpoint.reply(published(command_id, message_id))
        if noticed:
            self._notices.accepted(message_id)

    def _acknowledged(
        self,
        endpoint: Endpoint,
        queue: str,
        receipts: tuple[str, ...],
        command_id: int | None,
        live: int,
    ) -> None:
        """An acknowledgement's engine call succeeded: forget the leases, make room, accept."""
        self._counts.acks += live
        for receipt in receipts:
            endpoint.drop(receipt)
        self._subscribers.wake(queue)
        if command_id is not None:
            endpoint.reply(accepted(ACK, command_id, count=live))
