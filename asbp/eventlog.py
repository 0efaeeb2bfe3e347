"""The event log's vocabulary: each event's fields, their types and order, and
where the two stores keep events.

The broker writes the log (``gateway.eventlog``) and the Spark reader
(``agents.spark.events``) reads it; neither imports the other, so what they
must agree on is defined once, here, as plain data. The broker's record type
(``gateway.eventlog.schema.Event``) is checked against :data:`EVENT_FIELDS` by
a test, and the Spark schema is derived from the table, so the three cannot
drift apart. Fields are never renamed or retyped; new ones may be added, at
the end, and readers ignore fields they do not know (docs/spark.md, "The
event log").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "DESTINATION_KINDS",
    "EVENT_FIELDS",
    "FIELDS",
    "FILES_DIRECTORY",
    "FILE_GLOB",
    "OUTCOMES",
    "SOURCE_KINDS",
    "STREAM_FIELD",
    "STREAM_KEY",
    "DestinationKind",
    "EventField",
    "JsonType",
    "Outcome",
    "SourceKind",
]

SourceKind = Literal["channel", "agent", "course"]
#: ``broker``: a built-in Command the broker answers itself (``asbp.ping``,
#: ``asbp.subscribe``...); messaging built-ins record the topic or queue instead.
DestinationKind = Literal[
    "agent", "channel", "group", "topic", "queue", "virtual_queue", "broker", "course"
]
Outcome = Literal["delivered", "fault"]
#: How a field is written in an event's JSON: ``integer`` never has a fraction.
JsonType = Literal["string", "integer", "number"]

SOURCE_KINDS: Final[tuple[SourceKind, ...]] = ("channel", "agent", "course")
DESTINATION_KINDS: Final[tuple[DestinationKind, ...]] = (
    "agent",
    "channel",
    "group",
    "topic",
    "queue",
    "virtual_queue",
    "broker",
    "course",
)
OUTCOMES: Final[tuple[Outcome, ...]] = ("delivered", "fault")

#: The field of a Redis Stream entry that holds the event's JSON.
STREAM_FIELD: Final = b"e"
#: The Redis Stream the ``redis`` engine's brokers log to (all of them, one stream).
STREAM_KEY: Final = "asbp:events"
#: The ``memory`` engine's log: this directory under ``data_dir``...
FILES_DIRECTORY: Final = "events"
#: ...holding NDJSON files named ``events-<UTC time, to the microsecond>.ndjson``
#: (``events-20261121T091500123456Z.ndjson``), so sorting the names sorts by time.
FILE_GLOB: Final = "events-*.ndjson"


@dataclass(frozen=True, slots=True)
class EventField:
    """One field of an event.

    Attributes:
        name: the JSON key.
        type: its JSON type.
        nullable: whether it may be ``null``.
        values: the only strings it may hold, for an enumerated field; empty
            for any string (or a number).
    """

    name: str
    type: JsonType
    nullable: bool = False
    values: tuple[str, ...] = ()


#: Every field, in the order the broker writes them. What each one means is
#: documented on ``gateway.eventlog.schema.Event`` and in docs/spark.md.
EVENT_FIELDS: Final[tuple[EventField, ...]] = (
    EventField("time", "number"),
    EventField("broker", "string"),
    EventField("source_kind", "string", values=SOURCE_KINDS),
    EventField("source", "string"),
    EventField("subject", "string", nullable=True),
    EventField("command", "string", nullable=True),
    EventField("header_bytes", "integer"),
    EventField("body_bytes", "integer"),
    EventField("destination_kind", "string", nullable=True, values=DESTINATION_KINDS),
    EventField("destination", "string", nullable=True),
    EventField("agent", "string", nullable=True),
    EventField("outcome", "string", values=OUTCOMES),
    EventField("fault", "integer", nullable=True),
    EventField("latency_us", "integer"),
)
#: The field names in order, for documentation and for readers building a schema.
FIELDS: Final[tuple[str, ...]] = tuple(field.name for field in EVENT_FIELDS)
