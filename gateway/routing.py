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
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol, cast

import orjson

import asbp
from asbp import ChannelId, Command, FaultCode, ProtocolError
from asbp.grammar import is_bare
from gateway import builtins
from gateway.acl import AccessContext, Acl, DestinationType, Privilege
from gateway.authentication import Authenticator
from gateway.channels import Channel, ChannelRegistry
from gateway.config import ChannelLimits, TubeLimits
from gateway.eventlog.recorder import CLOCK_NS, Recorder, Route
from gateway.eventlog.schema import DestinationKind, SourceKind
from gateway.tubes import RespondentTable, Tube

__all__ = ["InFlight", "MessagingHooks", "Router"]

_CHANNEL_BUILTINS: Final = frozenset({builtins.PING, builtins.COMMANDS, builtins.LOGOUT})
#: The messaging built-ins a sender may use (notifications and notices only
#: ever come from the broker).
_MESSAGING_REQUESTS: Final = builtins.MESSAGING - {builtins.NOTIFICATION, builtins.NOTICE}
#: Built-ins that exist only while Subjects are on.
_SUBJECT_BUILTINS: Final = frozenset({builtins.LOGOUT, builtins.AUTHENTICATED, builtins.REFUSED})
#: The event log's name for each messaging ``type``.
_MESSAGING_KINDS: Final[dict[str, DestinationKind]] = {
    "TOPIC": "topic",
    "QUEUE": "queue",
    "VIRTUAL_QUEUE": "virtual_queue",
}
# The event log's one clock: its events' time and their latency (see Recorder.record).
_clock_ns: Final = CLOCK_NS
#: ``Command.get`` for ``c`` and ``s``, which always hold one value: the event log
#: takes them so (a third of the typed accessors' cost, and ``cast`` is a call).
_text: Final = cast("Callable[[Command, str], str | None]", Command.get)
_TUBE_BUILTINS: Final = frozenset(
    {
        builtins.PING,
        builtins.COMMANDS,
        builtins.REGISTER,
        builtins.UNREGISTER,
        builtins.JOIN,
        builtins.LEAVE,
        builtins.AUTHENTICATED,
        builtins.REFUSED,
    }
)


def _without_pair(header: bytes, key: bytes) -> bytes | None:
    """``header`` (which holds no quotes) without the pair for ``key``."""
    if header.startswith(key + b"="):
        start = 0
    else:
        start = header.find(b"," + key + b"=")
        if start == -1:
            return None
    value = header.find(b"=", start) + 1
    if header[value : value + 1] == b"[":
        stop = header.find(b"]", value) + 1
    else:
        stop = header.find(b",", value)
        if stop == -1:
            stop = len(header)
    if start == 0:
        return header[stop + 1 :]  # and the comma after it, if any
    return header[:start] + header[stop:]


def _builtin_route(command: Command, name: str) -> tuple[DestinationKind | None, str | None]:
    """Where the event log says a built-in went: the topic or queue a messaging
    Command names (docs/protocol.md, "Topics and queues"), else the broker."""
    if name not in builtins.MESSAGING:
        return "broker", name
    destination = command.get("destination")
    if not isinstance(destination, str):
        return None, None  # none, or a list: refused on sight
    kind = command.get("type")
    if kind is None:
        if name in (builtins.POLL, builtins.ACK):
            return ("virtual_queue" if "@" in destination else "queue"), destination
        return "topic", destination
    return (_MESSAGING_KINDS.get(kind) if isinstance(kind, str) else None), destination


def _header_size(command: Command, limits: asbp.Limits) -> int:
    """The header's size when the frame is not at hand (the HTTP transport decoded it)."""
    try:
        return len(asbp.encode(command, limits=limits)) - len(command.body)
    except ProtocolError:  # a Command its sender got through cannot be written back
        return 0


class MessagingHooks(Protocol):
    """What the router asks of topics and queues (gateway.messaging.Messaging)."""

    def channel_command(self, channel: Channel, command: Command, name: str) -> None:
        """A messaging built-in (builtins.MESSAGING) from a User-Agent."""
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


@dataclass(eq=False, slots=True)
class InFlight:
    """A User-Agent Command with ``u`` that a Respondent has not answered yet."""

    channel: Channel
    command_id: int
    tube: Tube
    name: str
    deadline: float
    #: ``t`` of the answer stream, once an answer announced it.
    total: int | None = None
    done: bool = False


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
        self._in_flight: dict[tuple[ChannelId, int], InFlight] = {}
        # (deadline, entry) in arrival order. Every deadline is "now + the one
        # Respondent timeout", so arrival order is deadline order and a deque
        # needs no heap. A refreshed deadline appends the entry again; items
        # whose deadline no longer matches the entry's are skipped.
        self._deadlines: deque[tuple[float, InFlight]] = deque()
        #: ",b=<broker>", and how many bytes a splice adds to a header.
        self._broker_pair = b",b=" + broker_id.encode("ascii")
        self._splice_size = len(b",i=") + 32 + len(self._broker_pair)
        self._agent_pairs: dict[str, bytes | None] = {}
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
        # Without an allow-list, any name but the Authenticate-Command, which
        # must be granted explicitly: credentials go only to trusted agents.
        self._may_serve = may_serve or (lambda agent, name: name != authenticate_command)
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
            channel, builtins.fault_command(code, message, command_id=command_id, cause=cause)
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
            tube, builtins.fault_command(code, message, command_id=command_id, cause=cause)
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
                    channel, exc.code, exc.message, command_id=builtins.sniff_command_id(frame)
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
            self.fault(channel, exc.code, exc.message, command_id=builtins.sniff_command_id(frame))
            self._record_undecoded(recorder, "channel", channel.id, None, frame, began)
            return
        self._route_channel(channel, command, frame)
        # The hot path, inline (see _record for the same with comments).
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
        body_bytes = len(command.body)
        if frame is not None:
            header_bytes = len(frame) - body_bytes
        else:
            header_bytes = _header_size(command, self._limits)
        recorder.record(
            began,
            source_kind,
            source,
            agent,
            _text(command, "c"),
            _text(command, "s"),
            header_bytes,
            body_bytes,
            self._routed,
            self._fault_code,
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
        fault = self._fault_code
        self._source = None
        # The header as far as the first ";", if there is one.
        header_bytes = frame.find(b";") + 1 or len(frame)
        recorder.record(
            began,
            source_kind,
            source,
            agent,
            None,
            None,
            header_bytes,
            len(frame) - header_bytes,
            None,
            fault,
        )

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
        if name in _CHANNEL_BUILTINS or name in builtins.MESSAGING:
            self._channel_builtin(channel, command, name)
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
        if self.acl is not None and not self._permitted(
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
            self._start(channel, command_id, tube, name)
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
        """The frame a Respondent gets: ``i`` and ``b`` added, any ``a`` removed.

        When the User-Agent's frame holds none of ``a``, ``i`` and ``b``, the
        two pairs are spliced in before its terminator: the broker minted both
        values, they are bare tokens, and decoding the result gives exactly
        ``command.with_keys(i=…, b=…)``, at a tenth of the cost of building
        and encoding that Command. Otherwise, or when the header would pass
        its limit, the Command is rebuilt, and a header too large for the
        additions becomes a fault to the sender.
        """
        if frame is not None and "a" not in command and "i" not in command and "b" not in command:
            end = len(frame) - len(command.body) - 1
            if end + self._splice_size <= self._limits.max_header_bytes:
                return b"".join(
                    (
                        frame[:end],
                        b",i=",
                        channel.id.encode("ascii"),
                        self._broker_pair,
                        frame[end:],
                    )
                )
        outbound = command.with_keys(i=channel.id, b=self.broker_id)
        if "a" in outbound:
            outbound = outbound.without_keys("a")
        try:
            return asbp.encode(outbound, limits=self._limits)
        except ProtocolError as exc:
            self.fault(
                channel,
                exc.code,
                f"no room for the broker's 'i' and 'b': {exc.message}",
                command_id=command.command_id,
                cause=command.name,
            )
            return None

    def _permitted(
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

    def _channel_builtin(self, channel: Channel, command: Command, name: str) -> None:
        command_id = command.command_id
        if self._source is not None:
            self._routed = (*_builtin_route(command, name), None)
        if name in builtins.MESSAGING:
            if self.messaging is None:
                self.fault(
                    channel,
                    FaultCode.NO_RESPONDENT,
                    "topics and queues are not enabled at this broker",
                    command_id=command_id,
                    cause=name,
                )
            else:
                self.messaging.channel_command(channel, command, name)
            return
        if name == builtins.LOGOUT:
            if self.auth is None:
                self.fault(
                    channel,
                    FaultCode.NO_RESPONDENT,
                    "Subjects are not enabled at this broker",
                    command_id=command_id,
                    cause=name,
                )
            else:
                self.auth.logout(channel, command)
            return
        if name == builtins.PING:
            reply = Command({"c": builtins.PONG}, command.body)
        else:
            usable = _CHANNEL_BUILTINS if self.auth else _CHANNEL_BUILTINS - _SUBJECT_BUILTINS
            if self.messaging is not None:
                usable = usable | _MESSAGING_REQUESTS
            names = sorted(usable) + self.respondents.names()
            reply = Command({"c": builtins.COMMANDS, "m": "application/json"}, orjson.dumps(names))
        if command_id is not None:
            reply = reply.with_keys(u=command_id)
        self.send(channel, reply)

    def close_channel(self, channel: Channel) -> None:
        """The Channel is gone: it leaves every group and its answers are dropped."""
        if not self.channels.close(channel):
            return
        if self.auth is not None:
            self.auth.channel_closed(channel)
        if self.messaging is not None:
            self.messaging.channel_closed(channel)
        for command_id in list(channel.in_flight):
            entry = self._in_flight.get((channel.id, command_id))
            if entry is not None:
                self._finish(entry)
        self._log.info(
            "channel.close",
            extra={
                "channel": channel.id,
                "code": int(channel.fault) if channel.fault is not None else None,
            },
        )

    # -- in-flight bookkeeping ---------------------------------------------

    def _start(self, channel: Channel, command_id: int, tube: Tube, name: str) -> None:
        key = (channel.id, command_id)
        previous = self._in_flight.get(key)
        if previous is not None:
            # The User-Agent reused a ``u`` that is still in flight (it wraps
            # at 65535): the older Command can no longer be told apart.
            self._finish(previous)
        entry = InFlight(
            channel, command_id, tube, name, self._clock() + self._tube_limits.respondent_timeout
        )
        self._in_flight[key] = entry
        channel.in_flight.add(command_id)
        tube.in_flight += 1
        deadlines = self._deadlines
        # Answered entries wait at the head until their deadline; drop them
        # now, so the queue holds roughly what is in flight, not 60 s of
        # history (amortised O(1): each item is removed once).
        while deadlines and deadlines[0][1].done:
            deadlines.popleft()
        deadlines.append((entry.deadline, entry))

    def _finish(self, entry: InFlight) -> None:
        entry.done = True
        self._in_flight.pop((entry.channel.id, entry.command_id), None)
        entry.channel.in_flight.discard(entry.command_id)
        entry.tube.in_flight -= 1

    def _answered(self, tube: Tube, channel: Channel, command: Command, command_id: int) -> None:
        entry = self._in_flight.get((channel.id, command_id))
        if entry is None or entry.tube.agent_id != tube.agent_id:
            return
        total = command.total
        if total is not None:
            entry.total = total
        of_total = command.of_total
        position = of_total if of_total is not None else (1 if total is not None else None)
        if position is not None and entry.total is not None and position < entry.total:
            # A stream in progress: each part earns the Respondent more time.
            entry.deadline = self._clock() + self._tube_limits.respondent_timeout
            self._deadlines.append((entry.deadline, entry))
            return
        self._finish(entry)

    def expire(self) -> int:
        """Fault every Command whose Respondent ran out of time; returns how many."""
        now = self._clock()
        deadlines = self._deadlines
        expired = 0
        while deadlines and deadlines[0][0] <= now:
            deadline, entry = deadlines.popleft()
            if entry.done or entry.deadline != deadline:
                continue
            expired += 1
            self._finish(entry)
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
            Command({"c": builtins.TUBE, "a": tube.agent_id, "b": self.broker_id, "tube": tube.id}),
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
        stranded = [e for e in self._in_flight.values() if e.tube is tube]
        for entry in stranded:
            self._finish(entry)
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
                    tube, exc.code, exc.message, command_id=builtins.sniff_command_id(frame)
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
                tube, exc.code, exc.message, command_id=builtins.sniff_command_id(frame)
            )
            self._record_undecoded(recorder, "agent", agent, agent, frame, began)
            return
        self._route_tube(tube, command, frame)
        # The hot path, inline (see _record for the same with comments).
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
        if (name in _TUBE_BUILTINS or name in builtins.MESSAGING) and not addressed:
            self._tube_builtin(tube, command, name)
            return
        if (
            self.acl is not None
            and name is not None
            and not self._permitted(tube.id, tube.access, name, Privilege.WRITE, None)
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

    def _agent_pair(self, agent_id: str) -> bytes | None:
        """``,a=<agent_id>`` when the identity is a bare token, else None."""
        pair = self._agent_pairs.get(agent_id)
        if pair is None and agent_id not in self._agent_pairs:
            # ASCII too: the header it joins may lack the "+" UTF-8 marker.
            pair = b",a=" + agent_id.encode() if is_bare(agent_id) and agent_id.isascii() else None
            if len(self._agent_pairs) < 4096:  # identities are configured: few
                self._agent_pairs[agent_id] = pair
        return pair

    def _to_user_agents(self, tube: Tube, command: Command, frame: bytes | None) -> bytes | None:
        """The frame User-Agents get: ``d`` removed, ``a`` set to the verified agent.

        Like ``_from_channel``, a splice when it is safe: the header holds no
        quotes (so every ``,d=`` is a real pair), no ``a``, and no UTF-8 marker,
        and the identity is a bare token. Otherwise the Command is rebuilt.
        """
        if frame is not None and "a" not in command:
            end = len(frame) - len(command.body) - 1
            pair = self._agent_pair(tube.agent_id)
            header: bytes | None = frame[:end]
            if pair is not None and frame.find(b"'", 0, end) == -1 and frame[0] != 0x2B:  # "+"
                if "d" in command:
                    header = _without_pair(frame[:end], b"d")
                if header is not None and len(header) + len(pair) <= self._limits.max_header_bytes:
                    return b"".join((header, pair if header else pair[1:], frame[end:]))
        # Add before removing: a Command of only "d" must not be left keyless.
        outbound = command.with_keys(a=tube.agent_id)
        if "d" in outbound:
            outbound = outbound.without_keys("d")
        try:
            return asbp.encode(outbound, limits=self._limits)
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
                self._answered(tube, channel, command, command_id)
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

    def _tube_builtin(self, tube: Tube, command: Command, name: str) -> None:
        command_id = command.command_id
        if self._source is not None:
            self._routed = (*_builtin_route(command, name), None)
        reply: Command
        if name in builtins.MESSAGING:
            if self.messaging is None:
                self.fault_tube(
                    tube,
                    FaultCode.NO_RESPONDENT,
                    "topics and queues are not enabled at this broker",
                    command_id=command_id,
                    cause=name,
                )
            else:
                self.messaging.tube_command(tube, command, name)
            return
        if name in (builtins.AUTHENTICATED, builtins.REFUSED):
            if self.auth is None:
                self.fault_tube(
                    tube,
                    FaultCode.NO_RESPONDENT,
                    "Subjects are not enabled at this broker",
                    command_id=command_id,
                    cause=name,
                )
            else:
                self.auth.answer(tube, command, name)
            return
        if name == builtins.PING:
            reply = Command({"c": builtins.PONG}, command.body)
        elif name == builtins.COMMANDS:
            usable = _TUBE_BUILTINS if self.auth else _TUBE_BUILTINS - _SUBJECT_BUILTINS
            if self.messaging is not None:
                usable = usable | _MESSAGING_REQUESTS
            names = sorted(usable) + self.respondents.names()
            reply = Command({"c": builtins.COMMANDS, "m": "application/json"}, orjson.dumps(names))
        elif name in (builtins.REGISTER, builtins.UNREGISTER):
            names_value = command.get("names")
            if not names_value:
                self.fault_tube(
                    tube,
                    FaultCode.INVALID_HEADER_VALUE,
                    f"{name} needs the Command-Names in 'names'",
                    command_id=command_id,
                    cause=name,
                )
                return
            names = [names_value] if isinstance(names_value, str) else list(names_value)
            reserved = [n for n in names if n.startswith(builtins.PREFIX)]
            if reserved:
                self.fault_tube(
                    tube,
                    FaultCode.ACCESS_DENIED,
                    f"Command-Names starting with {builtins.PREFIX!r} belong to the broker: "
                    f"{', '.join(reserved)}",
                    command_id=command_id,
                    cause=name,
                )
                return
            if name == builtins.REGISTER:
                forbidden = [
                    n
                    for n in names
                    if not self._may_serve(tube.agent_id, n)
                    or (
                        self.acl is not None
                        and not self._permitted(tube.id, tube.access, n, Privilege.READ, command_id)
                    )
                ]
                if forbidden:
                    # Nothing is registered: an agent that asks for a name it may
                    # not serve is misconfigured or spoofing, and must not get the
                    # rest by accident either.
                    self._log.warning(
                        "tube.register_refused",
                        extra={"tube": tube.id, "agent": tube.agent_id, "names": forbidden},
                    )
                    self.fault_tube(
                        tube,
                        FaultCode.ACCESS_DENIED,
                        f"this Application-Agent may not serve {', '.join(forbidden)}",
                        command_id=command_id,
                        cause=name,
                    )
                    return
                self.respondents.register(tube, names)
            else:
                self.respondents.unregister(tube, names)
            self._log.info(
                "tube." + name.removeprefix(builtins.PREFIX),
                extra={"tube": tube.id, "agent": tube.agent_id, "names": names},
            )
            reply = Command({"c": builtins.ACCEPTED, "cause": name, "names": names})
        else:
            reply_or_none = self._membership(tube, command, name)
            if reply_or_none is None:
                return
            reply = reply_or_none
        if command_id is not None:
            reply = reply.with_keys(u=command_id)
        self.send_tube(tube, reply)

    def _membership(self, tube: Tube, command: Command, name: str) -> Command | None:
        """JOIN or LEAVE: which Channels (``d``) belong to which groups."""
        command_id = command.command_id
        groups = command.get("groups")
        group_names = [groups] if isinstance(groups, str) else list(groups or ())
        channel_ids = command.get("channels")
        ids = [channel_ids] if isinstance(channel_ids, str) else list(channel_ids or ())
        if not group_names or not ids:
            self.fault_tube(
                tube,
                FaultCode.INVALID_HEADER_VALUE,
                f"{name} needs group names in 'groups' and Channel-Identifiers in 'channels'",
                command_id=command_id,
                cause=name,
            )
            return None
        found = [self.channels.get(i) for i in ids]
        channels = [c for c in found if c is not None]
        if name == builtins.JOIN:
            missing = [i for i, c in zip(ids, found, strict=True) if c is None]
            if missing:
                self.fault_tube(
                    tube,
                    FaultCode.UNKNOWN_CHANNEL,
                    f"no Channel {', '.join(missing)} at this broker; nothing joined",
                    command_id=command_id,
                    cause=name,
                )
                return None
            for group in group_names:
                self.channels.join(group, channels)
        else:
            for group in group_names:
                self.channels.leave(group, channels)
        return Command({"c": builtins.ACCEPTED, "cause": name})
