"""What the router writes to the event log (gateway.eventlog) about each Command.

The router records one event per Command from a Channel or a Tube where the
frame enters, once routing returns (see "Theory of operation" in
gateway.routing.router). The common case, a frame that decoded, is recorded inline
there: it is the hot path. These are the rest, and what every recording needs:
the clock, the Command's ``c`` and ``s``, and where a built-in went.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, cast

import asbp
from asbp import Command, ProtocolError
from asbp.names import ACK, MESSAGING, POLL
from gateway.eventlog.recorder import CLOCK_NS, Recorder, Route
from gateway.eventlog.schema import DestinationKind, SourceKind

__all__ = ["builtin_route", "clock_ns", "record_routed", "record_undecoded", "text"]

#: The event log's name for each messaging ``type``.
_MESSAGING_KINDS: Final[dict[str, DestinationKind]] = {
    "TOPIC": "topic",
    "QUEUE": "queue",
    "VIRTUAL_QUEUE": "virtual_queue",
}
#: The event log's one clock: its events' time and their latency (see Recorder.record).
clock_ns: Final = CLOCK_NS
#: ``Command.get`` for ``c`` and ``s``, which always hold one value: the event log
#: takes them so (a third of the typed accessors' cost, and ``cast`` is a call).
text: Final = cast("Callable[[Command, str], str | None]", Command.get)


def builtin_route(command: Command, name: str) -> Route:
    """Where the event log says a built-in went: the topic or queue a messaging
    Command names (docs/protocol.md, "Topics and queues"), else the broker."""
    if name not in MESSAGING:
        return "broker", name, None
    destination = command.get("destination")
    if not isinstance(destination, str):
        return None, None, None  # none, or a list: refused on sight
    kind = command.get("type")
    if kind is None:
        if name in (POLL, ACK):
            return ("virtual_queue" if "@" in destination else "queue"), destination, None
        return "topic", destination, None
    return (_MESSAGING_KINDS.get(kind) if isinstance(kind, str) else None), destination, None


def _header_size(command: Command, limits: asbp.Limits) -> int:
    """The header's size when the frame is not at hand (the HTTP transport decoded it)."""
    try:
        return len(asbp.encode(command, limits=limits)) - len(command.body)
    except ProtocolError:  # a Command its sender got through cannot be written back
        return 0


def record_routed(
    recorder: Recorder,
    source_kind: SourceKind,
    source: str,
    agent: str | None,
    command: Command,
    frame: bytes | None,
    began: int,
    route: Route | None,
    fault: int | None,
    limits: asbp.Limits,
) -> None:
    """Record the Command just routed; ``agent``: the sender, if an agent;
    ``frame``: its bytes, if known (else its header is measured by encoding it
    within ``limits``)."""
    body_bytes = len(command.body)
    header_bytes = len(frame) - body_bytes if frame is not None else _header_size(command, limits)
    recorder.record(
        began,
        source_kind,
        source,
        agent,
        text(command, "c"),
        text(command, "s"),
        header_bytes,
        body_bytes,
        route,
        fault,
    )


def record_undecoded(
    recorder: Recorder,
    source_kind: SourceKind,
    source: str,
    agent: str | None,
    frame: bytes,
    began: int,
    fault: int | None,
) -> None:
    """Record a frame that never decoded (and got a fault)."""
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
