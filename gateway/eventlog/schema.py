"""The event record: its fields, their types, and its one serialisation.

Both stores hold the same bytes for an event: one JSON object, as a line of an
NDJSON file or as the ``e`` field of a Redis Stream entry, so a reader needs one
parser. Fields are never renamed or retyped; new ones may be added, and readers
ignore fields they do not know. The field table and the stores' names are
protocol vocabulary (:mod:`asbp.eventlog`), shared with the SDK's Spark reader.

An :class:`Event` is a ``msgspec.Struct``, and msgspec writes its JSON, one event
(:meth:`Event.to_json`) or lines of them (:func:`to_ndjson`) alike: the router
builds one per Command, so it must be cheap to build (a fifth of a dict's cost)
and to write (no dict, no JSON array to split into lines). The bytes are those
``orjson`` wrote before for every value an event holds (keys in field order, no
spaces, ``null``, UTF-8 unescaped, floats in their shortest round-trip form),
but for a float of magnitude 1e16 or more: ``1e16``, not ``1e+16``. No event
time comes near (that is the year 300 million), and JSON readers read both alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import msgspec
import orjson

# The vocabulary is the protocol core's, shared with the Spark reader (which must
# not import the broker); re-exported so the broker's modules keep one import.
from asbp.eventlog import (
    DESTINATION_KINDS,
    FIELDS,
    FILE_GLOB,
    FILES_DIRECTORY,
    OUTCOMES,
    SOURCE_KINDS,
    STREAM_FIELD,
    STREAM_KEY,
    DestinationKind,
    Outcome,
    SourceKind,
)

__all__ = [
    "DESTINATION_KINDS",
    "FIELDS",
    "FILES_DIRECTORY",
    "FILE_GLOB",
    "OUTCOMES",
    "SOURCE_KINDS",
    "STREAM_FIELD",
    "STREAM_KEY",
    "DestinationKind",
    "Event",
    "Outcome",
    "SourceKind",
    "to_ndjson",
]

# Holds no state between calls; building one per call would cost more than the
# smallest batch's encoding.
_ENCODER: Final = msgspec.json.Encoder()


# gc=False: an event holds only strings and numbers, so it can be in no cycle, and
# the collector need not track the tens of thousands buffered.
class Event(msgspec.Struct, frozen=True, gc=False):
    """One routed Command.

    Its fields are :data:`asbp.eventlog.EVENT_FIELDS`, in that order and with
    those types (tests/gateway/eventlog/test_eventlog.py holds the two together).

    Attributes:
        time: when the broker received the Command, Unix seconds (UTC).
        broker: the Broker-Identifier of the broker that routed it.
        source_kind: what sent it.
        source: the Channel-Identifier, the Application-Agent identity or the
            Course name.
        subject: the Subject-Identifier (``s``) it carried, if any.
        command: the Command name (``c``); ``None`` when the frame never decoded.
        header_bytes: the header's size, the terminating ``;`` included.
        body_bytes: the body's size.
        destination_kind: where it was routed; ``None`` when refused before routing.
        destination: the agent identity, Channel-Identifier, group, topic, queue or
            built-in name, if any.
        agent: the Application-Agent on either end: the identity that served a
            Channel's Command, or the one that sent from its Tube.
        outcome: ``delivered`` once handed on (to an outbox, the engine or a
            built-in), ``fault`` when answered with a fault.
        fault: the fault code when ``outcome`` is ``fault``.
        latency_us: microseconds from receipt to hand-off (or to the fault).
    """

    time: float
    broker: str
    source_kind: SourceKind
    source: str
    subject: str | None
    command: str | None
    header_bytes: int
    body_bytes: int
    destination_kind: DestinationKind | None
    destination: str | None
    agent: str | None
    outcome: Outcome
    fault: int | None
    latency_us: int

    def to_json(self) -> bytes:
        """The event's one serialisation: a JSON object, no trailing newline."""
        return _ENCODER.encode(self)

    @classmethod
    def from_json(cls, data: bytes | str) -> Event:
        """Read back what :meth:`to_json` wrote; fields this version does not know
        are ignored.

        Raises:
            orjson.JSONDecodeError: ``data`` is not JSON (a ``ValueError``).
            TypeError: it is not an object, or lacks one of :data:`FIELDS`.
        """
        value = orjson.loads(data)
        if not isinstance(value, dict):
            raise TypeError(f"an event is a JSON object, not {type(value).__name__}")
        missing = [name for name in FIELDS if name not in value]
        if missing:
            raise TypeError(f"an event needs {', '.join(missing)}")
        return cls(**{name: value[name] for name in FIELDS})


def to_ndjson(events: Sequence[Event]) -> bytes:
    """``events`` as NDJSON: the :meth:`~Event.to_json` of each, and a newline."""
    return _ENCODER.encode_lines(events)
