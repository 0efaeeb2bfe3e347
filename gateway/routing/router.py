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
Tube, recorded where the frame enters (gateway.routing.intake: ``channel_frame``,
``channel_command``, ``tube_frame``, ``tube_command``, which the router hands
out as its own) once routing returns. The router notes on the intake where
each Command was handed on (``routed``) while it is being recorded
(``source``), and the first fault it got.

The router decides; its helpers each keep one concern: gateway.routing.intake
decodes and records, gateway.routing.replies leaves Commands and faults in
outboxes, gateway.routing.management answers the built-ins,
gateway.routing.splice writes the frames handed on, gateway.routing.inflight
keeps the books of Commands in flight and gateway.routing.routelog computes
what the event log gets. Each is handed the narrow protocol it calls
(gateway.types), never the router.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Collection

import asbp
from asbp import ChannelId, Command, FaultCode, ProtocolError
from asbp.fault_commands import fault_command
from asbp.names import MESSAGING, NOTIFICATION, TUBE
from gateway.acl import AccessContext, Acl, DestinationType, Privilege
from gateway.config.model import ChannelLimits, TubeLimits
from gateway.connections.channels import Channel, ChannelRegistry
from gateway.connections.subjects import Subject, SubjectState
from gateway.connections.tubes import RespondentTable, Tube
from gateway.eventlog.recorder import Recorder
from gateway.metrics.counts import NO_NAME, RouterCounts
from gateway.plane.base import Envelope, EnvelopeKind, Plane
from gateway.routing.inflight import InFlight, InFlightTable
from gateway.routing.intake import Intake
from gateway.routing.management import CHANNEL_BUILTINS, TUBE_BUILTINS, Management
from gateway.routing.remote import Remote
from gateway.routing.remote_subjects import RemoteSubjects
from gateway.routing.replies import ReplySender
from gateway.routing.routelog import builtin_route
from gateway.routing.splice import Splicer
from gateway.routing.subject_auth import Authenticator
from gateway.types import AddressRoutes, MessagingHooks, Outlets

__all__ = ["InFlight", "MessagingHooks", "Router"]


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
        messaging: Callable[[Outlets], MessagingHooks] | None = None,
        recorder: Recorder | None = None,
        counts: RouterCounts | None = None,
        plane: Plane | None = None,
    ) -> None:
        """Build the router and the helpers it owns, each handed what it calls.

        Args:
            messaging: builds topics and queues (gateway.messaging.Messaging) on the
                router's :attr:`replies`; None: the messaging built-ins get 2101.
            recorder: the event log; None when it is off.
            counts: the metrics' counters (gateway.metrics); None when metrics are off.
            plane: the bus-wide routing plane; None, or one where this broker is
                alone, and every target is local (gateway.routing.remote).
        """
        self.broker_id = broker_id
        self.channels = channels
        self.respondents = respondents
        self._limits = limits
        self._channel_limits = channel_limits
        self._tube_limits = tube_limits
        self._log = log
        self._clock = clock
        #: The metrics' counters; None when metrics are off.
        self.counts = counts
        self._in_flight = InFlightTable(
            timeout=tube_limits.respondent_timeout,
            clock=clock,
            latency=counts,
        )
        self._splicer = Splicer(broker_id, limits)
        self.acl = acl if acl is not None and acl.enabled else None
        #: Where every Command and fault the broker sends goes.
        self.replies = ReplySender(
            log=log,
            close_channel=self.close_channel,
            close_tube=self.close_tube,
            on_fault=self._fault_sent,
            on_slow_tube=on_slow_tube,
        )
        # Its methods, under the router's name too: the transports send through the
        # router, and the routing below calls them without a second lookup.
        self.send = self.replies.send
        self.deliver = self.replies.deliver
        self.send_tube = self.replies.send_tube
        self.send_tube_frame = self.replies.send_tube_frame
        self.fault = self.replies.fault
        self.fault_tube = self.replies.fault_tube
        self.auth = (
            Authenticator(
                self.replies,
                respondents=respondents,
                broker_id=broker_id,
                command_name=authenticate_command,
                timeout=tube_limits.respondent_timeout,
                max_per_channel=max_subjects,
                clock=clock,
                log=log,
            )
            if authenticate_command is not None
            else None
        )
        #: Topics and queues; None when the broker has none.
        self.messaging = messaging(self.replies) if messaging is not None else None
        self._management = Management(
            self.replies,
            channels=channels,
            respondents=respondents,
            auth=self.auth,
            messaging=self.messaging,
            permitted=self.permitted if self.acl is not None else None,
            # Without an allow-list, any name but the Authenticate-Command, which
            # must be granted explicitly: credentials go only to trusted agents.
            may_serve=may_serve or (lambda agent, name: name != authenticate_command),
            log=log,
            directory_written=plane.written if plane is not None and plane.spans_brokers else None,
            elsewhere=self._membership_elsewhere
            if plane is not None and plane.spans_brokers
            else None,
        )
        #: On a lone broker, puts a frame for a Channel that is not here into its
        #: log if it is a resumable Channel away (gateway.connections.resume); True
        #: if it did. None: no such Channels.
        self.away: Callable[[str, bytes], bool] | None = None
        #: On a bus, takes a Command another broker handed on for an HTTP Channel
        #: whose home is here (gateway.routing.http_bus); None: no such Channels.
        self.http_home: Callable[[Envelope], object] | None = None
        #: The broker is stopping on a bus (gateway.drain): its Channels' new
        #: Commands go to other brokers' Respondents, not to its own Tubes.
        self.draining = False
        #: Routes to other brokers; None when this broker is alone on its bus.
        self.remote = (
            Remote(
                plane,
                channels=channels,
                respondents=respondents,
                replies=self.replies,
                in_flight=self._in_flight,
                limits=limits,
                timeout=tube_limits.respondent_timeout,
                log=log,
                clock=clock,
                close_channel=self.close_channel,
            )
            if plane is not None and plane.spans_brokers
            else None
        )
        if self.remote is not None and self.auth is not None:
            subjects = RemoteSubjects(
                self.remote.plane,
                respondents=respondents,
                replies=self.replies,
                limits=limits,
                log=log,
            )
            subjects.attach(self.auth)
            self.remote.subjects = subjects
            # Which brokers hold each Conversation-Address (courses/, ``r``).
            self.auth.subjects.directory = self.remote.plane
            self.auth.directory_written = self.remote.plane.written
        self._intake = intake = Intake(
            route_channel=self._route_channel,
            route_tube=self._route_tube,
            faults=self.replies,
            limits=limits,
            recorder=recorder,
            outcome_later=None if self.remote is None else self.remote.outcome_later,
        )
        # Where frames and Commands enter, under the router's name (the transports'
        # call sites), bound once: the hot path pays no extra call for the split.
        #: Commands addressed by ``r`` (courses.service.Courses); None: 2101 as any
        #: other Command without a Respondent. Set once the Courses are built.
        self.courses: AddressRoutes | None = None
        self.channel_frame = intake.channel_frame
        self.channel_command = intake.channel_command
        self.tube_frame = intake.tube_frame
        self.tube_command = intake.tube_command

    def _fault_sent(
        self,
        to: Channel | Tube,
        code: FaultCode,
        message: str,
        cause: str | None,
        agent: str | None,
    ) -> None:
        """A fault is about to go to ``to``: the outcome of the Command being routed,
        if it is the sender's first, and a row of ``/system/faults/<broker>``."""
        if self.counts is not None:
            self.counts.fault(int(code))
        intake = self._intake
        if to is intake.source and intake.fault_code is None:
            intake.fault_code = int(code)
        if self.messaging is not None:
            self.messaging.fault_sent(code, message, cause=cause, agent=agent)

    # -- Channels ------------------------------------------------------------

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
        counts = self.counts
        if counts is not None:
            # An int add per Command (see gateway.metrics.counts); a new name misses once.
            try:
                counts.channel_commands[name] += 1
            except KeyError:
                counts.count_new(counts.channel_commands, name)
        if name in CHANNEL_BUILTINS or name in MESSAGING:
            intake = self._intake
            if intake.source is not None:
                intake.routed = builtin_route(command, name)
            self._management.answer(channel, command, name)
            return
        auth = self.auth
        if auth is not None and name == auth.command_name:
            intake = self._intake
            if intake.source is not None:
                # To every agent that serves it; they answer the broker.
                intake.routed = ("agent", None, None)
            auth.authenticate(channel, command)
            return
        among = None
        served_at: set[str] | None = None
        access = channel.access
        subject = None
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
            served_at = subject.serving_brokers
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
        if self.courses is not None and "r" in command:
            intake = self._intake
            if intake.source is not None:
                intake.routed = ("course", ",".join(command.recipients), None)
            self.courses.route(channel, subject, command, frame)
            return
        # A draining broker (gateway.drain) sends new work to the rest of the bus.
        draining = self.draining and self.remote is not None
        tube = None if draining else self.respondents.pick(name, among=among)
        if tube is None:
            if self.remote is not None:
                # A Subject's Command: to a broker whose agents signed it in.
                prefer = tuple(sorted(served_at)) if served_at else ()
                self._route_remote(channel, command, frame, name, among, prefer)
                return
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
        intake = self._intake
        if intake.source is not None:
            intake.routed = ("agent", tube.agent_id, tube.agent_id)
        self.send_tube_frame(tube, outbound)

    def _route_for_subject(self, tube: Tube, command: Command) -> None:
        """An agent's Command with ``r``: sent for the Subject ``s`` it signed in here.

        Only an agent that authenticated the Subject may speak for it, so knowing
        ``s`` is not enough (docs/courses.md, "From Application-Agents").
        """
        assert self.courses is not None
        intake = self._intake
        if intake.source is not None:
            intake.routed = ("course", ",".join(command.recipients), None)
        subject_id = command.subject_id
        broker = command.get("b")
        remote = self.remote
        if (
            subject_id is not None
            and remote is not None
            and isinstance(broker, str)
            and broker != self.broker_id
        ):
            # The Subject is at another broker of the bus (``b`` of its
            # Authenticate-Command): that broker checks the agent signed it in.
            self._for_subject_elsewhere(tube, command, broker)
            return

        def refuse(code: FaultCode, message: str) -> None:
            self.fault_tube(tube, code, message, command_id=command.command_id, cause=command.name)

        subject = self._subject_of_agent(subject_id, tube.agent_id, refuse)
        if subject is not None or subject_id is None:
            self.courses.route_for_agent(tube, subject, command)

    def _subject_of_agent(
        self,
        subject_id: str | None,
        agent_id: str,
        refuse: Callable[[FaultCode, str], None],
    ) -> Subject | None:
        """The Subject ``subject_id`` here if ``agent_id`` signed it in; else a fault."""
        if subject_id is None:
            return None
        auth = self.auth
        subject = auth.subjects.get(subject_id) if auth is not None else None
        if (
            subject is None
            or subject.state is not SubjectState.AUTHENTICATED
            or agent_id not in subject.authenticated_by
        ):
            refuse(
                FaultCode.ACCESS_DENIED,
                "'s' names no Subject this agent signed in at this broker",
            )
            return None
        return subject

    def _for_subject_elsewhere(self, tube: Tube, command: Command, broker: str) -> None:
        """An agent's Command with ``r`` for a Subject at ``broker``: sent there, with
        ``a`` set to the agent's verified identity (the only identity trusted there)."""
        remote = self.remote
        assert remote is not None
        name = command.name
        try:
            frame = asbp.encode(command.with_keys(a=tube.agent_id), limits=self._limits)
        except ProtocolError as exc:
            self.fault_tube(tube, exc.code, exc.message, command_id=command.command_id, cause=name)
            return
        envelope = Envelope(EnvelopeKind.FOR_SUBJECT, self.broker_id, tube.id, frame)
        sent = remote.plane.send_to(broker, envelope)

        def done(future: asyncio.Future[bool]) -> None:
            if future.cancelled():
                return
            if future.exception() is not None or not future.result():
                self.fault_tube(
                    tube,
                    FaultCode.ACCESS_DENIED,
                    f"'s' names no Subject this agent signed in: broker {broker!r} is gone",
                    command_id=command.command_id,
                    cause=name,
                )

        sent.add_done_callback(done)

    def _from_agent_elsewhere(self, envelope: Envelope) -> None:
        """A FOR_SUBJECT envelope: the agent's Command for a Subject here."""
        courses = self.courses
        remote = self.remote
        assert remote is not None
        try:
            command = asbp.decode(envelope.frame, limits=self._limits)
        except ProtocolError as exc:  # pragma: no cover - a broker of this bus encoded it
            self._log.warning("plane.bad_envelope", extra={"error": exc.message})
            return
        agent_id = command.agent_id
        origin, tube_id = envelope.origin, envelope.channel

        def refuse(code: FaultCode, message: str) -> None:
            fault = fault_command(code, message, command_id=command.command_id, cause=command.name)
            frame = asbp.encode(fault, limits=self._limits)
            remote.plane.send_to(
                origin, Envelope(EnvelopeKind.TUBE, self.broker_id, tube_id, frame)
            )

        if courses is None or agent_id is None:  # pragma: no cover - the sender checked both
            return
        subject = self._subject_of_agent(command.subject_id, agent_id, refuse)
        if subject is not None:
            courses.route_for(subject, command, refuse)

    def _route_remote(
        self,
        channel: Channel,
        command: Command,
        frame: bytes | None,
        name: str,
        among: Collection[str] | None,
        prefer: tuple[str, ...] = (),
    ) -> None:
        """No Tube here serves ``name``: the bus may (gateway.routing.remote)."""
        assert self.remote is not None
        command_id = command.command_id
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
        intake = self._intake
        if intake.source is not None:
            intake.routed = ("agent", None, None)
            intake.deferred = True  # placed on another broker, or 2101: known later
        self.remote.request(channel, command, outbound, tuple(sorted(among or ())), prefer)

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
        if self.remote is not None:
            self.remote.channel_closed(channel)
        self._log.info(
            "channel.close",
            extra={
                "channel": channel.id,
                "code": int(channel.fault) if channel.fault is not None else None,
            },
        )

    def _membership_elsewhere(
        self, tube: Tube, name: str, groups: list[str], channel_ids: list[str], acceptance: Command
    ) -> None:
        """``asbp.join`` or ``asbp.leave`` for Channels at other brokers."""
        assert self.remote is not None
        self.remote.membership(tube, name, groups, channel_ids, acceptance)

    def channel_opened(self, channel: Channel) -> None:
        """A Channel opened here: the bus learns where it is."""
        if self.remote is not None:
            self.remote.channel_opened(channel)

    def inbound(self, envelope: Envelope) -> None:
        """An envelope another broker forwarded to this one (the plane calls it)."""
        if envelope.kind is EnvelopeKind.ADDRESSED:
            # For the Subjects here holding its addresses (courses.service).
            if self.courses is not None:
                self.courses.forwarded(envelope)
            return
        if envelope.kind is EnvelopeKind.FOR_SUBJECT:
            if self.remote is not None:
                self._from_agent_elsewhere(envelope)
            return
        if envelope.kind is EnvelopeKind.HTTP_COMMAND:
            # For an HTTP Channel whose home is this broker (gateway.routing.http_bus).
            if self.http_home is not None:
                self.http_home(envelope)
            return
        if self.remote is not None:
            self.remote.inbound(envelope)

    def broker_lost(self, broker_id: str) -> None:
        """A broker this one forwarded to is gone (the plane calls it)."""
        if self.remote is not None:
            self.remote.lost(broker_id)

    def expire(self) -> int:
        """Fault every Command whose Respondent ran out of time; returns how many."""
        expired = 0
        entries = self._in_flight.expired()
        if self.remote is not None:
            entries = itertools.chain(entries, self.remote.expired())
            self.remote.report_loads()
        for entry in entries:
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
        greeting = Command(
            {
                "c": TUBE,
                "a": tube.agent_id,
                "b": self.broker_id,
                "tube": tube.id,
            }
        )
        if self.remote is not None:
            # One Tube per bus reaches all of it (gateway.plane.base, bus_id).
            greeting = greeting.with_keys(bus=self.remote.plane.bus_id)
        self.send_tube(tube, greeting)

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

    def _refuse_queue_delivery(self, tube: Tube, command: Command) -> None:
        """An ``asbp.notification`` with a ``receipt`` is a queue delivery, which only
        the broker sends: a client that does not count queue deliveries (``count=2``)
        would not count one an agent relayed, though the Channel's log numbered it,
        and on resume would miss as many logged frames (docs/protocol.md, "Resuming
        a Channel")."""
        self.fault_tube(
            tube,
            FaultCode.ACCESS_DENIED,
            f"an {NOTIFICATION} carrying a 'receipt' is a queue delivery, which only"
            " the broker sends: relay it without the receipt (or under another key)",
            command_id=command.command_id,
            cause=NOTIFICATION,
        )

    def _route_tube(self, tube: Tube, command: Command, frame: bytes | None) -> None:
        if tube.closed:
            # The broker closed it (slow consumer) while its socket still reads: it
            # must not register again (and swallow Commands) or reach Channels.
            return
        name = command.name
        counts = self.counts
        if counts is not None:
            label = name if name is not None else NO_NAME
            try:
                counts.agent_commands[label] += 1
            except KeyError:
                counts.count_new(counts.agent_commands, label)
        if name == NOTIFICATION and "receipt" in command:
            self._refuse_queue_delivery(tube, command)
            return
        addressed = "d" in command or "g" in command
        if (name in TUBE_BUILTINS or name in MESSAGING) and not addressed:
            intake = self._intake
            if intake.source is not None:
                intake.routed = builtin_route(command, name)
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
        if self.courses is not None and "r" in command:
            self._route_for_subject(tube, command)
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
        remote = self.remote
        via = command.get("b") if remote is not None else None
        if isinstance(via, str) and via != self.broker_id:
            # Addressed to another broker of the bus (an answer to an agent-to-agent
            # request, for the Tube there that asked): there, not to a Tube here.
            target = None
        else:
            via = None
            target = self.respondents.pick(name, exclude=tube)
        if target is None and remote is None:
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
        intake = self._intake
        if target is None:
            assert self.remote is not None
            # Another broker of the bus may serve it (gateway.routing.remote).
            if intake.source is not None:
                intake.routed = ("agent", None, None)
            self.remote.to_agent(tube, outbound, command, via)
            return
        if intake.source is not None:
            intake.routed = ("agent", target.agent_id, None)
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
        intake = self._intake
        if intake.source is not None:
            # Several destinations are joined with ","; with both, the Channels.
            if destinations:
                intake.routed = ("channel", ",".join(destinations), None)
            else:
                intake.routed = ("group", ",".join(command.groups), None)
        unknown: list[str] = []
        delivered: set[ChannelId] = set()
        get = self.channels.get
        remote = self.remote
        for channel_id in destinations:
            channel = get(channel_id)
            proxied = False
            if channel is None:
                if remote is not None:
                    channel = remote.proxy(channel_id)
                    proxied = True
                if channel is None:
                    unknown.append(channel_id)
                    continue
            if channel_id in delivered:
                continue
            delivered.add(channel_id)
            if proxied and remote is not None:
                # A whole answer's ``u`` rides beside it to the Channel's broker.
                remote.deliver(channel, frame, command, command_id)
            else:
                self.deliver(channel, frame)
            if command_id is not None:
                self._in_flight.answered(tube, channel, command, command_id)
        groups = command.groups
        if groups:
            for channel in self.channels.members(groups):
                if channel.id not in delivered:
                    delivered.add(channel.id)
                    self.deliver(channel, frame)
            if remote is not None:
                remote.to_groups(frame, command)
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
        if unknown and remote is None and self.away is not None:
            away = self.away
            unknown = [missing for missing in unknown if not away(missing, frame)]
        if unknown and remote is not None:
            for missing in dict.fromkeys(unknown):
                remote.to_channel(tube, missing, frame, command)
        elif unknown:
            self.fault_tube(
                tube,
                FaultCode.UNKNOWN_CHANNEL,
                f"no Channel {', '.join(unknown)} at this broker",
                command_id=command_id,
                cause=command.name,
            )
