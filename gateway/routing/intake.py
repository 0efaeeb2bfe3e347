"""Where frames and decoded Commands from Channels and Tubes enter the router.

Each entry point decodes (faulting what does not decode), hands the Command to
the router's routing and, while the event log is on, records one row for it
(gateway.eventlog) once routing returns: when it began, who sent it, its
sizes, where it was handed on and the first fault it got.

Routing never awaits, so one Command is routed at a time, and three
attributes describe it while it is: :attr:`Intake.source` (whose faults count
as its outcome), :attr:`Intake.routed` (where it was handed on, set by the
router at each hand-off) and :attr:`Intake.fault_code` (set by the router as
a fault goes out). Faults that come later (a Respondent timeout, an engine
that fails) belong to no routing and are not in the log.

The Channel and Tube entry points stay mirrored rather than shared: they are
the hot path, where one more call per frame shows. The router hands its
entry points out under its own name (``router.channel_frame`` and so on).
"""

from __future__ import annotations

from collections.abc import Callable

import asbp
from asbp import Command, ProtocolError
from gateway.connections.channels import Channel
from gateway.connections.flow import PUBLISHER
from gateway.connections.tubes import Tube
from gateway.eventlog.recorder import Recorder, Route
from gateway.eventlog.schema import SourceKind
from gateway.routing.routelog import clock_ns as _clock_ns
from gateway.routing.routelog import record_routed, record_undecoded
from gateway.routing.routelog import text as _text
from gateway.routing.sniff import sniff_command_id
from gateway.types import Faults

__all__ = ["Intake"]

#: The router's routing of one decoded Command (``frame``: its bytes, if known).
RouteChannel = Callable[[Channel, Command, bytes | None], None]
#: The same for an Application-Agent's.
RouteTube = Callable[[Tube, Command, bytes | None], None]


class Intake:
    """Decodes, routes and records each Command from a Channel or a Tube.

    Args:
        route_channel: routes a decoded Command from a User-Agent.
        route_tube: routes a decoded Command from an Application-Agent.
        faults: where a frame that does not decode is answered.
        limits: the codec limits.
        recorder: the event log; None when it is off.
    """

    __slots__ = (
        "_fault",
        "_fault_tube",
        "_limits",
        "_outcome_later",
        "_route_channel",
        "_route_tube",
        "deferred",
        "fault_code",
        "recorder",
        "routed",
        "source",
    )

    def __init__(
        self,
        *,
        route_channel: RouteChannel,
        route_tube: RouteTube,
        faults: Faults,
        limits: asbp.Limits,
        recorder: Recorder | None,
        outcome_later: Callable[[Callable[[int | None], object]], None] | None = None,
    ) -> None:
        self._route_channel = route_channel
        self._route_tube = route_tube
        self._fault = faults.fault
        self._fault_tube = faults.fault_tube
        self._limits = limits
        #: The event log; None when it is off.
        self.recorder = recorder
        #: The sender of the Command being recorded; None between Commands.
        self.source: Channel | Tube | None = None
        #: Where that Command was handed on.
        self.routed: Route | None = None
        #: The first fault it got.
        self.fault_code: int | None = None
        #: Set by the router when it handed the Command to another broker of the bus:
        #: its outcome (placed, or fault 2101) is known only later, so its record waits
        #: for it (``outcome_later`` takes the record to finish with the fault, if any).
        self.deferred = False
        self._outcome_later = outcome_later

    def channel_frame(self, channel: Channel, frame: bytes) -> None:
        """A frame arrived from a User-Agent."""
        # Flow control: an outbox this fills past its high-water mark holds the
        # Channel back (gateway.connections.flow).
        previous, PUBLISHER.gate = PUBLISHER.gate, channel.gate
        try:
            self._channel_frame(channel, frame)
        finally:
            PUBLISHER.gate = previous

    def _channel_frame(self, channel: Channel, frame: bytes) -> None:
        recorder = self.recorder
        if recorder is None or channel.closed:
            try:
                command = asbp.decode(frame, limits=self._limits)
            except ProtocolError as exc:
                self._fault(
                    channel,
                    exc.code,
                    exc.message,
                    command_id=sniff_command_id(frame),
                )
                return
            self._route_channel(channel, command, frame)
            return
        began = _clock_ns()
        # Reset too: a routing that raised must not leave its route to the next.
        self.source, self.routed, self.fault_code = channel, None, None
        try:
            command = asbp.decode(frame, limits=self._limits)
        except ProtocolError as exc:
            self._fault(channel, exc.code, exc.message, command_id=sniff_command_id(frame))
            self._record_undecoded(recorder, "channel", channel.id, None, frame, began)
            return
        self._route_channel(channel, command, frame)
        if self.deferred:
            self._record_later(recorder, "channel", channel.id, None, command, frame, began)
            return
        # The hot path, inline (see _record and routelog.record_routed for the same).
        self.source = None
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
            self.routed,
            self.fault_code,
        )

    def channel_command(
        self, channel: Channel, command: Command, frame: bytes | None = None
    ) -> None:
        """Route a decoded Command from a User-Agent (``frame``: its bytes, if known)."""
        previous, PUBLISHER.gate = PUBLISHER.gate, channel.gate
        try:
            self._channel_command(channel, command, frame)
        finally:
            PUBLISHER.gate = previous

    def _channel_command(
        self, channel: Channel, command: Command, frame: bytes | None = None
    ) -> None:
        recorder = self.recorder
        if recorder is None or channel.closed:
            self._route_channel(channel, command, frame)
            return
        began = _clock_ns()
        self.source, self.routed, self.fault_code = channel, None, None
        self._route_channel(channel, command, frame)
        if self.deferred:
            self._record_later(recorder, "channel", channel.id, None, command, frame, began)
            return
        self._record(recorder, "channel", channel.id, None, command, frame, began)

    def _record_later(
        self,
        recorder: Recorder,
        source_kind: SourceKind,
        source: str,
        agent: str | None,
        command: Command,
        frame: bytes | None,
        began: int,
    ) -> None:
        """Record a Command handed to the bus once the bus says what became of it."""
        self.source, self.deferred = None, False
        routed, limits = self.routed, self._limits

        def record(fault: int | None) -> None:
            route = None if fault is not None else routed
            record_routed(
                recorder, source_kind, source, agent, command, frame, began, route, fault, limits
            )

        if self._outcome_later is None:
            record(self.fault_code)
        else:
            self._outcome_later(record)

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
        # Only source needs clearing: routed and fault_code are read only while
        # it is set, and reset with it when the next Command starts.
        self.source = None
        record_routed(
            recorder,
            source_kind,
            source,
            agent,
            command,
            frame,
            began,
            self.routed,
            self.fault_code,
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
        self.source = None
        record_undecoded(recorder, source_kind, source, agent, frame, began, self.fault_code)

    def tube_frame(self, tube: Tube, frame: bytes) -> None:
        """A frame arrived from an Application-Agent."""
        previous, PUBLISHER.gate = PUBLISHER.gate, tube.gate
        try:
            self._tube_frame(tube, frame)
        finally:
            PUBLISHER.gate = previous

    def _tube_frame(self, tube: Tube, frame: bytes) -> None:
        recorder = self.recorder
        if recorder is None or tube.closed:
            try:
                command = asbp.decode(frame, limits=self._limits)
            except ProtocolError as exc:
                self._fault_tube(tube, exc.code, exc.message, command_id=sniff_command_id(frame))
                return
            self._route_tube(tube, command, frame)
            return
        began = _clock_ns()
        self.source, self.routed, self.fault_code = tube, None, None
        agent = tube.agent_id
        try:
            command = asbp.decode(frame, limits=self._limits)
        except ProtocolError as exc:
            self._fault_tube(tube, exc.code, exc.message, command_id=sniff_command_id(frame))
            self._record_undecoded(recorder, "agent", agent, agent, frame, began)
            return
        self._route_tube(tube, command, frame)
        # The hot path, inline (see _record and routelog.record_routed for the same).
        self.source = None
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
            self.routed,
            self.fault_code,
        )

    def tube_command(self, tube: Tube, command: Command, frame: bytes | None = None) -> None:
        """Route a decoded Command from an Application-Agent (``frame``: its bytes)."""
        recorder = self.recorder
        if recorder is None or tube.closed:
            self._route_tube(tube, command, frame)
            return
        began = _clock_ns()
        self.source, self.routed, self.fault_code = tube, None, None
        self._route_tube(tube, command, frame)
        agent = tube.agent_id
        self._record(recorder, "agent", agent, agent, command, frame, began)
