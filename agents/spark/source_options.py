"""The options of the ``asbp`` Data Source, read and checked once, with clear errors.

Spark hands a Data Source its options as strings (``.option("prefetch", 16)``
arrives as ``"16"``), case-insensitively. Everything is checked when the
reader or writer is built, on the driver, so a typo fails the query at start
rather than a task later.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, cast

from agents.messaging import DestinationType
from agents.spark.errors import SparkError

__all__ = [
    "DEFAULT_PREFETCH",
    "MAX_IN_FLIGHT",
    "SINK_COLUMNS",
    "OptionError",
    "SinkOptions",
    "SourceOptions",
    "source_schema",
]

#: The broker's default ``prefetch``, the most one ``asbp.poll`` takes.
DEFAULT_PREFETCH: Final = 16
#: Notifications all polls in flight may bring at once, at most: they land in the
#: Channel's outbound buffer together (1,024 Commands and 4 MiB by default).
MAX_IN_FLIGHT: Final = 512
_TYPES: Final = ("TOPIC", "QUEUE", "VIRTUAL_QUEUE")
#: The columns a DataFrame written to ``asbp`` may have; ``payload`` is required.
SINK_COLUMNS: Final = ("payload", "destination", "priority", "ttl")

PayloadFormat = Literal["binary", "string"]


class OptionError(SparkError, ValueError):
    """An option of the ``asbp`` Data Source is missing or wrong.

    Also a ``ValueError``, as it was before the SDK's errors joined one tree: a
    bad option is a bad argument, and callers (and PySpark's own habits) catch
    it as one.
    """


def source_schema(payload: PayloadFormat) -> str:
    """The rows a streaming read gives, as DDL."""
    return (
        "offset BIGINT, id STRING, destination STRING, subscription STRING, "
        "timestamp TIMESTAMP, expiration TIMESTAMP, priority INT, deliveries INT, "
        f"headers MAP<STRING, STRING>, payload {'STRING' if payload == 'string' else 'BINARY'}"
    )


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """``spark.readStream.format("asbp")``'s options (see docs/spark.md)."""

    url: str
    #: The queue polled: the destination, or ``spark-<subscriber>@<topic pattern>``.
    queue: str
    type: DestinationType
    wal_path: Path
    wal_fsync: bool
    prefetch: int
    parallel_polls: int
    poll_wait: float
    max_backlog: int
    max_backlog_bytes: int
    max_records_per_batch: int | None
    num_partitions: int
    payload: PayloadFormat
    timeout: float

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Read the options.

        Raises:
            OptionError: one is missing or out of range.
        """
        kind = _type(options, "TOPIC")
        destination = _required(options, "destination")
        if kind == "TOPIC":
            subscriber = _required(
                options, "subscriber", why="a topic is read through a durable virtual queue"
            )
            if "@" in subscriber:
                raise OptionError("option 'subscriber' must not contain '@'")
            queue = f"spark-{subscriber}@{destination}"
        else:
            queue = destination
        limit = options.get("maxRecordsPerBatch")
        prefetch = _integer(options, "prefetch", DEFAULT_PREFETCH, 1, 10_000)
        parallel_polls = _integer(options, "parallelPolls", 4, 1, 64)
        if prefetch * parallel_polls > MAX_IN_FLIGHT:
            raise OptionError(
                f"prefetch x parallelPolls must be at most {MAX_IN_FLIGHT}: the broker closes"
                " a Channel whose outbound buffer (1,024 Commands) overflows"
            )
        return cls(
            url=_required(options, "url"),
            queue=queue,
            type=kind,
            wal_path=Path(_required(options, "walPath", why="offsets must survive restarts")),
            wal_fsync=_boolean(options, "walFsync", True),
            prefetch=prefetch,
            parallel_polls=parallel_polls,
            poll_wait=_number(options, "pollWait", 0.1, 0.0, 25.0),
            max_backlog=_integer(options, "maxBacklog", 10_000, 1, 10_000_000),
            max_backlog_bytes=_integer(
                options, "maxBacklogBytes", 64 * 1024 * 1024, 1, 16 * 1024 * 1024 * 1024
            ),
            max_records_per_batch=None
            if limit is None
            else _integer(options, "maxRecordsPerBatch", 0, 1, 10_000_000),
            num_partitions=_integer(options, "numPartitions", 1, 1, 1024),
            payload=_payload(options),
            timeout=_number(options, "timeout", 30.0, 0.1, 3600.0),
        )


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """``df.write.format("asbp")``'s options (see docs/spark.md)."""

    url: str
    #: For rows without a ``destination`` column (or a null one).
    destination: str | None
    type: Literal["TOPIC", "QUEUE"]
    window: int
    media_type: str | None
    timeout: float

    @classmethod
    def parse(cls, options: Mapping[str, str], columns: tuple[str, ...]) -> SinkOptions:
        """Read the options and check the DataFrame's columns against them.

        Raises:
            OptionError: an option is missing or wrong, or a column is unknown.
        """
        unknown = [c for c in columns if c not in SINK_COLUMNS]
        if unknown or "payload" not in columns:
            raise OptionError(
                f"an asbp write takes the columns {', '.join(SINK_COLUMNS)} (payload required);"
                f" got {', '.join(columns)}"
            )
        destination = options.get("destination")
        if destination is None and "destination" not in columns:
            raise OptionError("option 'destination' is required without a destination column")
        kind = _type(options, "TOPIC")
        if kind == "VIRTUAL_QUEUE":
            raise OptionError("publish to a topic that the virtual queue's pattern matches")
        return cls(
            url=_required(options, "url"),
            destination=destination,
            type=kind,
            window=_integer(options, "window", 128, 1, 256),
            media_type=options.get("mediaType"),
            timeout=_number(options, "timeout", 30.0, 0.1, 3600.0),
        )


def _required(options: Mapping[str, str], name: str, *, why: str = "") -> str:
    value = options.get(name)
    if not value:
        raise OptionError(f"option {name!r} is required" + (f": {why}" if why else ""))
    return value


def _type(options: Mapping[str, str], default: str) -> DestinationType:
    value = options.get("type", default)
    if value in _TYPES:
        return cast(DestinationType, value)
    raise OptionError(f"option 'type' must be one of {', '.join(_TYPES)}, not {value!r}")


def _payload(options: Mapping[str, str]) -> PayloadFormat:
    value = options.get("payloadFormat", "binary")
    if value in ("binary", "string"):
        return cast(PayloadFormat, value)
    raise OptionError(f"option 'payloadFormat' must be binary or string, not {value!r}")


def _integer(options: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option {name!r} must be an integer, not {raw!r}") from None
    if not low <= value <= high:
        raise OptionError(f"option {name!r} must be {low} to {high}, not {value}")
    return value


def _number(
    options: Mapping[str, str], name: str, default: float, low: float, high: float
) -> float:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise OptionError(f"option {name!r} must be a number, not {raw!r}") from None
    if not low <= value <= high:
        raise OptionError(f"option {name!r} must be {low} to {high}, not {value}")
    return value


def _boolean(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    raise OptionError(f"option {name!r} must be true or false, not {raw!r}")
