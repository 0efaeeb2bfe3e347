"""The router: where every Command goes (draft §2.4).

Theory of operation
-------------------
Transports hand the router whole frames together with where they came
from (a Channel or a Tube). The router decodes, decides and leaves encoded
Commands in outboxes; it never awaits, so one slow reader cannot hold up a
sender and routing needs no locks.

From a User-Agent (a Channel):
    1. ``c`` names a built-in (``asbp.*``): the broker answers itself.
    2. Otherwise the Tube with the fewest Commands in flight among those
       registered for ``c`` gets it, with ``i`` (the Channel) and ``b`` (this
       broker) added and any ``a`` removed: a User-Agent never speaks for an
       agent.
    3. No Respondent: fault 2101 to the sender.
   A Command that carries ``u`` is *in flight* until a Command from the same
   Application-Agent with ``d`` naming the Channel and the same ``u``
   answers it (for a stream: the one whose ``o`` reaches ``t``). If the
   agent's Tubes close first, or the Respondent timeout passes, the
   User-Agent gets fault 2102 or 2103 with that ``u``: never silence.

From an Application-Agent (a Tube):
    1. A built-in ``c`` without ``d`` or ``g``: the broker answers.
    2. ``d`` and/or ``g``: to those Channels, each once, with ``a`` set to the
       Tube's verified identity and ``d`` removed (Channel-Identifiers are
       the keys to HTTP mailboxes and never leak to other User-Agents).
    3. Otherwise ``c`` goes to another Tube that serves it, with ``a`` set.
    4. Nothing matched: fault 2101 to the agent.

Every fault carries the ``u`` of the Command it answers, when there is one.

The event log (gateway.eventlog) gets one row per Command from a Channel or a
Tube, recorded where the frame enters (``channel_frame``, ``channel_command``,
``tube_frame``, ``tube_command``) once routing returns. Routing never awaits,
so one Command is routed at a time and a few attributes describe it while it
is: ``_source`` (whose faults count as its outcome), ``_routed`` (where it was
handed on, set at each hand-off) and ``_fault_code``. Faults that come later
(a Respondent timeout, an engine that fails) belong to no routing and are not
in the log.

The router decides; its helpers each keep one concern: gateway.routing.management
answers the built-ins, gateway.routing.splice writes the frames handed on,
gateway.routing.inflight keeps the books of Commands in flight and gateway.routing.routelog
computes what the event log gets. The entry points (``channel_frame``,
``tube_frame``) stay mirrored rather than shared: they are the hot path, where
one more call per frame shows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

import asbp
from asbp import ChannelId, Command, FaultCode, ProtocolError
from gateway.acl import AccessContext, Acl, DestinationType, Privilege
from gateway.config.model import ChannelLimits, TubeLimits
from gateway.connections.channels import Channel, ChannelRegistry
from gateway.connections.tubes import RespondentTable, Tube
from gateway.eventlog.recorder import Recorder, Route
from gateway.eventlog.schema import SourceKind
from gateway.routing import builtin_commands
from gateway.routing.inflight import InFlight, InFlightTable
from gateway.routing.management import CHANNEL_BUILTINS, TUBE_BUILTINS, Management
from gateway.routing.routelog import builtin_route, record_routed, record_undecoded
from gateway.routing.routelog import clock_ns as _clock_ns
from gateway.routing.routelog import text as _text
from gateway.routing.splice import Splicer
from gateway.routing.subject_auth import Authenticator

__all__ = ["InFlight", "MessagingHooks", "Router"]


class MessagingHooks(Protocol):
    """What the router asks of topics and queues (gateway.messaging.Messaging)."""

    def channel_command(self, channel: Channel, command: Command, name: str) -> None:
        """A messaging built-in (builtin_commands.MESSAGING) from a User-Agent."""
        ...

    def tube_command(self, tube: Tube, command: Command, name: str) -> None:
        """A messaging built-in from an Application-Agent."""
        ...

    def channel_closed(self, channel: Channel) -> None:
        """A Channel closed: its subscriptions end, its leases are released."""
        ...

    def tube_closed(self, tube: Tube) -> None:
        """A Tube closed: likewise."""
        ...

    def fault_sent(
        self, code: FaultCode, message: str, *, cause: str | None, agent: str | None
    ) -> None:
        """The broker sent a fault (recorded on ``/system/faults/<broker>``)."""
        ...


class Router:
    """Routes Commands among Channels, Tubes and the broker's built-ins."""

    def __init__(
        self,
        *,
        broker_id: str,
        channels: ChannelRegistry,
        respondents: RespondentTable,
        limits: asbp.Limits,
        channel_limits: ChannelLimits,
        tube_limits: TubeLimits,
        log: logging.Logger,
        clock: Callable[[], float] = time.monotonic,
        on_slow_tube: Callable[[Tube], None] | None = None,
        authenticate_command: str | None = None,
        max_subjects: int = 16,
        acl: Acl | None = None,
        may_serve: Callable[[str, str], bool] | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.channels = channels
        self.respondents = respondents
        self._limits = limits
        self._channel_limits = channel_limits
        self._tube_limits = tube_limits
        self._log = log
        self._clock = clock
        self._on_slow_tube = on_slow_tube
        self._in_flight = InFlightTable(timeout=tube_limits.respondent_timeout, clock=clock)
        self._splicer = Splicer(broker_id, limits)
        self.acl = acl if acl is not None and acl.enabled else None
        self.auth = (
            Authenticator(
                self,
                command_name=authenticate_command,
                timeout=tube_limits.respondent_timeout,
                max_per_channel=max_subjects,
                clock=clock,
                log=log,
            )
            if authenticate_command is not None
            else None
        )
        self._management = Management(
            self,
            # Without an allow-list, any name but the Authenticate-Command, which
            # must be granted explicitly: credentials go only to trusted agents.
            may_serve=may_serve or (lambda agent, name: name != authenticate_command),
            log=log,
        )
        #: Topics and queues; the broker sets it once its engine exists.
        self.messaging: MessagingHooks | None = None
        #: The event log; the broker sets it unless it is off.
        self.recorder: Recorder | None = None
        # The Command being routed (see the module docstring).
        self._source: Channel | Tube | None = None
        self._routed: Route | None = None
        self._fault_code: int | None = None

    # -- delivery ------------------------------------------------------------

    def send(self, channel: Channel, command: Command) -> None:
        """Encode ``command`` and leave it for ``channel``."""
        self.deliver(channel, asbp.encode(command))

    def deliver(self, channel: Channel, frame: bytes) -> None:
        """Leave an encoded Command for ``channel``; a full outbox closes it."""
        if not channel.outbox.offer(frame) and not channel.closed:
            self._log.warning(
                "channel.slow_consumer",
                extra={"channel": channel.id, "code": int(FaultCode.SLOW_CONSUMER)},
            )
            channel.fault = FaultCode.SLOW_CONSUMER
            channel.outbox.abort()
            self.close_channel(channel)

    def send_tube(self, tube: Tube, command: Command) -> bool:
        """Encode ``command`` and leave it for ``tube``; False if it was too slow."""
        return self.send_tube_frame(tube, asbp.encode(command))

    def send_tube_frame(self, tube: Tube, frame: bytes) -> bool:
        """Leave an encoded Command for ``tube``; False if it was too slow."""
        if tube.outbox.offer(frame):
            return True
        if not tube.closed:
            self._log.warning(
                "tube.slow_consumer",
                extra={"tube": tube.id, "agent": tube.agent_id, "code": 2105},
            )
            tube.fault = FaultCode.SLOW_CONSUMER
            tube.outbox.abort()
            if self._on_slow_tube is not None:
                self._on_slow_tube(tube)
            self.close_tube(tube)
        return False

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
        if channel is self._source and self._fault_code is None:
            self._fault_code = int(code)
        if self.messaging is not None:
            self.messaging.fault_sent(code, message, cause=cause, agent=None)
        self.send(
            channel,
            builtin_commands.fault_command(code, message, command_id=command_id, cause=cause),
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
        if tube is self._source and self._fault_code is None:
            self._fault_code = int(code)
        if self.messaging is not None:
            self.messaging.fault_sent(code, message, cause=cause, agent=tube.agent_id)
        self.send_tube(
            tube, builtin_commands.fault_command(code, message, command_id=command_id, cause=cause)
        )

    # -- Channels ------------------------------------------------------------

    def channel_frame(self, channel: Channel, frame: bytes) -> None:
        """A frame arrived from a User-Agent."""
        recorder = self.recorder
        if recorder is None or channel.closed:
            try:
                command = asbp.decode(frame, limits=self._limits)
            except ProtocolError as exc:
                self.fault(
                    channel,
                    exc.code,
                    exc.message,
                    command_id=builtin_commands.sniff_command_id(frame),
                )
                return
            self._route_channel(channel, command, frame)
            return
        began = _clock_ns()
        # Reset too: a routing that raised must not leave its route to the next.
        self._source, self._routed, self._fault_code = channel, None, None
        try:
            command = asbp.decode(frame, limits=self._limits)
        except ProtocolError as exc:
            self.fault(
                channel, exc.code, exc.message, command_id=builtin_commands.sniff_command_id(frame)
            )
            self._record_undecoded(recorder, "channel", channel.id, None, frame, began)
            return
        self._route_channel(channel, command, frame)
        # The hot path, inline (see _record and routelog.record_routed for the same).
        self._source = None
        body_bytes = len(command.body)
        recorder.record(
            began,
            "channel",
            channel.id,
            None,
            _text(command, "c"),
            _text(command, "s"),
            len(frame) - body_bytes,
            body_bytes,
            self._routed,
            self._fault_code,
        )

    def channel_command(
        self, channel: Channel, command: Command, frame: bytes | None = None
    ) -> None:
        """Route a decoded Command from a User-Agent (``frame``: its bytes, if known)."""
        recorder = self.recorder
        if recorder is None or channel.closed:
            self._route_channel(channel, command, frame)
            return
        began = _clock_ns()
        self._source, self._routed, self._fault_code = channel, None, None
        self._route_channel(channel, command, frame)
        self._record(recorder, "channel", channel.id, None, command, frame, began)

    def _record(
        self,
        recorder: Recorder,
        source_kind: SourceKind,
        source: str,
        agent: str | None,
        command: Command,
        frame: bytes | None,
        began: int,
    ) -> None:
        """Record the Command just routed; ``agent``: the sender, if an agent."""
        # Only _source needs clearing: _routed and _fault_code are read only while
        # it is set, and reset with it when the next Command starts.
        self._source = None
        record_routed(
            recorder,
            source_kind,
            source,
            agent,
            command,
            frame,
            began,
            self._routed,
            self._fault_code,
            self._limits,
        )

    def _record_undecoded(
        self,
        recorder: Recorder,
        source_kind: SourceKind,
        source: str,
        agent: str | None,
        frame: bytes,
        began: int,
    ) -> None:
        """Record a frame that never decoded (and got a fault)."""
        self._source = None
        record_undecoded(recorder, source_kind, source, agent, frame, began, self._fault_code)

    def _route_channel(self, channel: Channel, command: Command, frame: bytes | None) -> None:
        if channel.closed:
            # The broker closed it (slow consumer) while its socket still reads:
            # nothing may start on its behalf that nobody can receive.
            return
        name = command.name
        command_id = command.command_id
        if name is None:
            self.fault(
                channel,
                FaultCode.INVALID_MESSAGE_FORMAT,
                "a Command from a User-Agent needs a Command-Name 'c'",
                command_id=command_id,
            )
            return
        if name in CHANNEL_BUILTINS or name in builtin_commands.MESSAGING:
            if self._source is not None:
                self._routed = builtin_route(command, name)
            self._management.answer(channel, command, name)
            return
        auth = self.auth
        if auth is not None and name == auth.command_name:
            if self._source is not None:
                # To every agent that serves it; they answer the broker.
                self._routed = ("agent", None, None)
            auth.authenticate(channel, command)
            return
        among = None
        access = channel.access
        if "s" in command:
            if auth is None:
                # Subjects are off, so no Subject-Identifier belongs to this Channel.
                self.fault(
                    channel,
                    FaultCode.ACCESS_DENIED,
                    "Subject-Identifier 's' does not belong to this Channel",
                    command_id=command_id,
                    cause=name,
                )
                return
            subject = auth.resolve(channel, command)
            if subject is None:
                return
            among = subject.authenticated_by
            access = subject.access
        if self.acl is not None and not self.permitted(
            channel.id, access, name, Privilege.WRITE, command_id
        ):
            self.fault(
                channel,
                FaultCode.ACCESS_DENIED,
                f"sending {name!r} is denied",
                command_id=command_id,
                cause=name,
            )
            return
        tube = self.respondents.pick(name, among=among)
        if tube is None:
            self.fault(
                channel,
                FaultCode.NO_RESPONDENT,
                f"no Command-Respondent serves {name!r}"
                + (" among the agents that authenticated this Subject" if among else ""),
                command_id=command_id,
                cause=name,
            )
            return
        if command_id is not None and (
            command_id not in channel.in_flight
            and len(channel.in_flight) >= self._channel_limits.max_in_flight
        ):
            self.fault(
                channel,
                FaultCode.TOO_MANY_IN_FLIGHT,
                f"{len(channel.in_flight)} Commands already await an answer on this Channel",
                command_id=command_id,
                cause=name,
            )
            return
        outbound = self._from_channel(channel, command, frame)
        if outbound is None:
            return
        if command_id is not None:
            self._in_flight.start(channel, command_id, tube, name)
        if self._log.isEnabledFor(logging.DEBUG):
            self._log.debug(
                "channel.command",
                extra={"channel": channel.id, "command": name, "tube": tube.id, "u": command_id},
            )
        if self._source is not None:
            self._routed = ("agent", tube.agent_id, tube.agent_id)
        self.send_tube_frame(tube, outbound)

    def _from_channel(
        self, channel: Channel, command: Command, frame: bytes | None
    ) -> bytes | None:
        """The frame a Respondent gets (see ``Splicer.from_channel``), or None
        after a fault to the sender when the header has no room for it."""
        try:
            return self._splicer.from_channel(channel.id, command, frame)
        except ProtocolError as exc:
            self.fault(
                channel,
                exc.code,
                f"no room for the broker's 'i' and 'b': {exc.message}",
                command_id=command.command_id,
                cause=command.name,
            )
            return None

    def permitted(
        self,
        who: str,
        access: AccessContext,
        name: str,
        privilege: Privilege,
        command_id: int | None,
    ) -> bool:
        """Whether the ACL lets ``access`` send (WRITE) or serve (READ) ``name``."""
        assert self.acl is not None
        decision = self.acl.check(access, DestinationType.COMMAND, name, privilege)
        if not decision.allowed:
            self._log.warning(
                "acl.denied",
                extra={
                    "who": who,
                    "command": name,
                    "privilege": privilege.value,
                    "u": command_id,
                    "reason": self.acl.describe(decision),
                },
            )
        return decision.allowed

    def close_channel(self, channel: Channel) -> None:
        """The Channel is gone: it leaves every group and its answers are dropped."""
        if not self.channels.close(channel):
            return
        if self.auth is not None:
            self.auth.channel_closed(channel)
        if self.messaging is not None:
            self.messaging.channel_closed(channel)
        self._in_flight.close_channel(channel)
        self._log.info(
            "channel.close",
            extra={
                "channel": channel.id,
                "code": int(channel.fault) if channel.fault is not None else None,
            },
        )

    def expire(self) -> int:
        """Fault every Command whose Respondent ran out of time; returns how many."""
        expired = 0
        for entry in self._in_flight.expired():
            expired += 1
            self.fault(
                entry.channel,
                FaultCode.RESPONDENT_TIMEOUT,
                f"no answer to {entry.name!r} within "
                f"{self._tube_limits.respondent_timeout:g} seconds",
                command_id=entry.command_id,
                cause=entry.name,
            )
        if self.auth is not None:
            expired += self.auth.expire()
        return expired

    @property
    def in_flight(self) -> int:
        """Commands awaiting an answer, broker-wide."""
        return len(self._in_flight)

    # -- Tubes ---------------------------------------------------------------

    def open_tube(self, tube: Tube) -> None:
        """A Tube finished its handshake: greet it with its verified identity."""
        self.respondents.attach(tube)
        self._log.info(
            "tube.open", extra={"tube": tube.id, "agent": tube.agent_id, "remote": tube.remote}
        )
        self.send_tube(
            tube,
            Command(
                {
                    "c": builtin_commands.TUBE,
                    "a": tube.agent_id,
                    "b": self.broker_id,
                    "tube": tube.id,
                }
            ),
        )

    def close_tube(self, tube: Tube) -> None:
        """The Tube is gone: its Respondents leave and its waiters get a fault."""
        if tube.closed:
            return
        tube.closed = True
        tube.outbox.close()
        self.respondents.detach(tube)
        if self.auth is not None:
            self.auth.tube_closed(tube)
        if self.messaging is not None:
            self.messaging.tube_closed(tube)
        stranded = self._in_flight.served_by(tube)
        for entry in stranded:
            self._in_flight.finish(entry)
            self.fault(
                entry.channel,
                FaultCode.RESPONDENT_LEFT,
                f"the Application-Agent serving {entry.name!r} left before answering",
                command_id=entry.command_id,
                cause=entry.name,
            )
        self._log.info(
            "tube.close",
            extra={"tube": tube.id, "agent": tube.agent_id, "stranded": len(stranded)},
        )

    def tube_frame(self, tube: Tube, frame: bytes) -> None:
        """A frame arrived from an Application-Agent."""
        recorder = self.recorder
        if recorder is None or tube.closed:
            try:
                command = asbp.decode(frame, limits=self._limits)
            except ProtocolError as exc:
                self.fault_tube(
                    tube, exc.code, exc.message, command_id=builtin_commands.sniff_command_id(frame)
                )
                return
            self._route_tube(tube, command, frame)
            return
        began = _clock_ns()
        self._source, self._routed, self._fault_code = tube, None, None
        agent = tube.agent_id
        try:
            command = asbp.decode(frame, limits=self._limits)
        except ProtocolError as exc:
            self.fault_tube(
                tube, exc.code, exc.message, command_id=builtin_commands.sniff_command_id(frame)
            )
            self._record_undecoded(recorder, "agent", agent, agent, frame, began)
            return
        self._route_tube(tube, command, frame)
        # The hot path, inline (see _record and routelog.record_routed for the same).
        self._source = None
        body_bytes = len(command.body)
        recorder.record(
            began,
            "agent",
            agent,
            agent,
            _text(command, "c"),
            _text(command, "s"),
            len(frame) - body_bytes,
            body_bytes,
            self._routed,
            self._fault_code,
        )

    def tube_command(self, tube: Tube, command: Command, frame: bytes | None = None) -> None:
        """Route a decoded Command from an Application-Agent (``frame``: its bytes)."""
        recorder = self.recorder
        if recorder is None or tube.closed:
            self._route_tube(tube, command, frame)
            return
        began = _clock_ns()
        self._source, self._routed, self._fault_code = tube, None, None
        self._route_tube(tube, command, frame)
        agent = tube.agent_id
        self._record(recorder, "agent", agent, agent, command, frame, began)

    def _route_tube(self, tube: Tube, command: Command, frame: bytes | None) -> None:
        if tube.closed:
            # The broker closed it (slow consumer) while its socket still reads: it
            # must not register again (and swallow Commands) or reach Channels.
            return
        name = command.name
        addressed = "d" in command or "g" in command
        if (name in TUBE_BUILTINS or name in builtin_commands.MESSAGING) and not addressed:
            if self._source is not None:
                self._routed = builtin_route(command, name)
            self._management.answer(tube, command, name)
            return
        if (
            self.acl is not None
            and name is not None
            and not self.permitted(tube.id, tube.access, name, Privilege.WRITE, None)
        ):
            self.fault_tube(
                tube,
                FaultCode.ACCESS_DENIED,
                f"sending {name!r} is denied",
                command_id=command.command_id,
                cause=name,
            )
            return
        if addressed:
            self._to_channels(tube, command, frame)
            return
        if name is None:
            self.fault_tube(
                tube,
                FaultCode.INVALID_MESSAGE_FORMAT,
                "a Command from an Application-Agent needs 'c', 'd' or 'g'",
                command_id=command.command_id,
            )
            return
        target = self.respondents.pick(name, exclude=tube)
        if target is None:
            self.fault_tube(
                tube,
                FaultCode.NO_RESPONDENT,
                f"no other Command-Respondent serves {name!r}",
                command_id=command.command_id,
                cause=name,
            )
            return
        try:
            outbound = asbp.encode(
                command.with_keys(a=tube.agent_id, b=self.broker_id), limits=self._limits
            )
        except ProtocolError as exc:
            self.fault_tube(
                tube,
                exc.code,
                f"no room for the broker's 'a' and 'b': {exc.message}",
                command_id=command.command_id,
                cause=name,
            )
            return
        if self._source is not None:
            self._routed = ("agent", target.agent_id, None)
        self.send_tube_frame(target, outbound)

    def _to_user_agents(self, tube: Tube, command: Command, frame: bytes | None) -> bytes | None:
        """The frame User-Agents get (see ``Splicer.to_user_agents``), or None
        after a fault to the agent when the header has no room for it."""
        try:
            return self._splicer.to_user_agents(tube.agent_id, command, frame)
        except ProtocolError as exc:
            self.fault_tube(
                tube,
                exc.code,
                f"no room for the broker's 'a': {exc.message}",
                command_id=command.command_id,
                cause=command.name,
            )
            return None

    def _to_channels(self, tube: Tube, command: Command, frame: bytes | None = None) -> None:
        command_id = command.command_id
        destinations = command.destinations
        outbound = self._to_user_agents(tube, command, frame)
        if outbound is None:
            return
        frame = outbound
        if self._source is not None:
            # Several destinations are joined with ","; with both, the Channels.
            if destinations:
                self._routed = ("channel", ",".join(destinations), None)
            else:
                self._routed = ("group", ",".join(command.groups), None)
        unknown: list[str] = []
        delivered: set[ChannelId] = set()
        get = self.channels.get
        for channel_id in destinations:
            channel = get(channel_id)
            if channel is None:
                unknown.append(channel_id)
                continue
            if channel_id in delivered:
                continue
            delivered.add(channel_id)
            self.deliver(channel, frame)
            if command_id is not None:
                self._in_flight.answered(tube, channel, command, command_id)
        groups = command.groups
        if groups:
            for channel in self.channels.members(groups):
                if channel.id not in delivered:
                    delivered.add(channel.id)
                    self.deliver(channel, frame)
        if self._log.isEnabledFor(logging.DEBUG):
            self._log.debug(
                "tube.command",
                extra={
                    "tube": tube.id,
                    "agent": tube.agent_id,
                    "command": command.name,
                    "delivered": len(delivered),
                },
            )
        if unknown:
            self.fault_tube(
                tube,
                FaultCode.UNKNOWN_CHANNEL,
                f"no Channel {', '.join(unknown)} at this broker",
                command_id=command_id,
                cause=command.name,
            )
