"""How the broker leaves Commands and faults for Channels and Tubes.

Every frame the broker sends goes through a :class:`ReplySender`: the
router's own routing, the built-in answers (gateway.routing.management),
Subject authentication (gateway.routing.subject_auth) and the messaging
built-ins (gateway.messaging), each through the narrow protocol it needs
(gateway.types: Replies, Outlets, SubjectReplies).

Nothing here blocks. An outbox that has no room is a client that does not
read: fault 2105, its outbox aborted and the Channel or Tube closed (the
router's ``close_channel`` / ``close_tube``), rather than the broker
buffering without bound. Every fault is logged and reported to ``on_fault``
(the router counts it as the outcome of the Command being routed, and the
messaging built-ins publish it on ``/system/faults/<broker>``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import asbp
from asbp import Command, FaultCode
from asbp.fault_commands import fault_command
from gateway.connections.channels import UNCOUNTED_DELIVERIES, Channel
from gateway.connections.outboxes import StreamOutbox
from gateway.connections.tubes import Tube

__all__ = ["FaultListener", "ReplySender"]

#: Told of every fault sent: ``(to, code, message, cause, agent)``, where ``agent``
#: is the Tube's agent identity, or None for a Channel.
FaultListener = Callable[[Channel | Tube, FaultCode, str, str | None, str | None], None]


class ReplySender:
    """Leaves frames in outboxes; closes the clients too slow to take them.

    Args:
        log: the broker's logger.
        close_channel: closes a Channel whose outbox overflowed.
        close_tube: closes a Tube whose outbox overflowed.
        on_fault: told of every fault, before it is sent.
        on_slow_tube: told of a Tube closed for being slow, before it closes.
    """

    __slots__ = (
        "_close_channel",
        "_close_tube",
        "_log",
        "_on_fault",
        "_on_slow_tube",
        "slow_channels",
        "slow_tubes",
    )

    def __init__(
        self,
        *,
        log: logging.Logger,
        close_channel: Callable[[Channel], None],
        close_tube: Callable[[Tube], None],
        on_fault: FaultListener,
        on_slow_tube: Callable[[Tube], None] | None = None,
    ) -> None:
        self._log = log
        self._close_channel = close_channel
        self._close_tube = close_tube
        self._on_fault = on_fault
        self._on_slow_tube = on_slow_tube
        #: Channels and Tubes closed for not reading (fault 2105), since the start.
        self.slow_channels = 0
        self.slow_tubes = 0

    def send(self, channel: Channel, command: Command) -> None:
        """Encode ``command`` and leave it for ``channel``."""
        self.deliver(channel, asbp.encode(command))

    def deliver(self, channel: Channel, frame: bytes) -> None:
        """Leave an encoded Command for ``channel``; a full outbox closes it."""
        if not channel.outbox.offer(frame) and not channel.closed:
            self.cut_channel(channel)

    def deliver_delivery(self, channel: Channel, frame: bytes) -> None:
        """Leave a queue delivery for ``channel``; a full outbox closes it.

        Not logged for resume (the queue is its log) when its client does not count
        queue deliveries (``count=2``); logged as any frame for a client that counts
        every frame (no ``count``: an older client), whose count must agree with the
        log's numbers (docs/protocol.md, "Resuming a Channel")."""
        outbox = channel.outbox
        offer = (
            outbox.offer_delivery
            if channel.count == UNCOUNTED_DELIVERIES and isinstance(outbox, StreamOutbox)
            else outbox.offer
        )
        if not offer(frame) and not channel.closed:
            self.cut_channel(channel)

    def cut_channel(self, channel: Channel) -> None:
        """Close ``channel`` as too slow (2105), dropping what is queued for it."""
        if channel.closed:
            return
        self._log.warning(
            "channel.slow_consumer",
            extra={"channel": channel.id, "code": int(FaultCode.SLOW_CONSUMER)},
        )
        channel.fault = FaultCode.SLOW_CONSUMER
        self.slow_channels += 1
        channel.outbox.abort()
        self._close_channel(channel)

    def send_tube(self, tube: Tube, command: Command) -> bool:
        """Encode ``command`` and leave it for ``tube``; False if it was too slow."""
        return self.send_tube_frame(tube, asbp.encode(command))

    def send_tube_frame(self, tube: Tube, frame: bytes) -> bool:
        """Leave an encoded Command for ``tube``; False if it was too slow."""
        if tube.outbox.offer(frame):
            return True
        self.cut_tube(tube)
        return False

    def cut_tube(self, tube: Tube) -> None:
        """Close ``tube`` as too slow (2105), dropping what is queued for it."""
        if tube.closed:
            return
        self._log.warning(
            "tube.slow_consumer",
            extra={"tube": tube.id, "agent": tube.agent_id, "code": 2105},
        )
        tube.fault = FaultCode.SLOW_CONSUMER
        self.slow_tubes += 1
        tube.outbox.abort()
        if self._on_slow_tube is not None:
            self._on_slow_tube(tube)
        self._close_tube(tube)

    def fault(
        self,
        channel: Channel,
        code: FaultCode,
        message: str,
        *,
        command_id: int | None = None,
        cause: str | None = None,
    ) -> None:
        """Send ``channel`` a fault."""
        self._log.info(
            "channel.fault",
            extra={"channel": channel.id, "code": int(code), "command": cause, "reason": message},
        )
        self._on_fault(channel, code, message, cause, None)
        self.send(
            channel,
            fault_command(code, message, command_id=command_id, cause=cause),
        )

    def fault_tube(
        self,
        tube: Tube,
        code: FaultCode,
        message: str,
        *,
        command_id: int | None = None,
        cause: str | None = None,
    ) -> None:
        """Send ``tube`` a fault."""
        self._log.info(
            "tube.fault",
            extra={
                "tube": tube.id,
                "agent": tube.agent_id,
                "code": int(code),
                "command": cause,
                "reason": message,
            },
        )
        self._on_fault(tube, code, message, cause, tube.agent_id)
        self.send_tube(tube, fault_command(code, message, command_id=command_id, cause=cause))
