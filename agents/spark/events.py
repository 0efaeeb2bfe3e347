"""Read the broker's event log into a Spark DataFrame.

Theory of operation
-------------------
The event log has one record shape (:mod:`asbp.eventlog`, the vocabulary the
broker writes by) and two stores, and this module reads either into the same
DataFrame: one column per field of :data:`asbp.eventlog.EVENT_FIELDS`, typed by
an explicit schema derived from that table (so the two can never drift apart;
the broker's record type is tested against the same table), plus
``timestamp``, the event's ``time`` as a Spark timestamp. Nothing here imports
the broker: a Spark job runs where no broker is installed.

**NDJSON files** (the memory engine: ``<data_dir>/events/events-*.ndjson``) are
read by Spark's own JSON reader with the schema given, so there is no inference
pass and every file is split across the executors. A line that is not a JSON
object (the half-written last line of a file being appended to) is dropped
(``DROPMALFORMED``), and so is a record without ``time``.

**A Redis Stream** (the redis engine: ``asbp:events``, the JSON in field ``e``)
is read by a PySpark Python Data Source, :class:`EventStreamDataSource`
(format ``asbp-events``). Planning reads the first and last entry IDs and cuts
the span between their millisecond parts into ``partitions`` equal ID ranges;
each task reads its range with ``XRANGE ... COUNT chunk`` (exclusive ``(``
continuation, Redis 6.2+) and yields each chunk as one Arrow batch of raw JSON
strings, which the JVM parses with ``from_json`` against the same schema. So
no event passes through the driver, each range is read once, and memory per
task is one chunk. The last entry ID is fixed at planning time: the read is a
snapshot, and events appended meanwhile wait for the next run. Stream IDs are
append times, so an ID range is a time range and ranges hold similar numbers of
events when traffic is steady; a burst makes one range bigger, not wrong.

Reading through the driver instead (XRANGE, then ``createDataFrame`` from
Python rows) holds every event in the driver's memory and runs in one Python
process whatever the cluster; on two local cores it took 1.0 to 2.0 times as
long as this reader for a million events (``bench/analytics.py --redis --driver``).
"""

from __future__ import annotations

import os
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from glob import has_magic
from pathlib import Path
from typing import TYPE_CHECKING, Final

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import (
    DataType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from agents.spark.errors import SparkError
from asbp.eventlog import EVENT_FIELDS, FILE_GLOB, STREAM_FIELD, STREAM_KEY, JsonType

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type hints

__all__ = [
    "DEFAULT_STREAM",
    "EVENT_SCHEMA",
    "FILE_PATTERN",
    "STREAM_FORMAT",
    "EventSource",
    "EventSourceError",
    "EventStreamDataSource",
    "NdjsonSource",
    "RedisStreamSource",
    "StreamRange",
    "event_schema",
    "id_ranges",
    "read_events",
]

#: The Redis Stream the redis engine appends events to.
DEFAULT_STREAM: Final = STREAM_KEY
#: The files of an NDJSON event directory.
FILE_PATTERN: Final = FILE_GLOB
#: The Data Source format name of :class:`EventStreamDataSource`.
STREAM_FORMAT: Final = "asbp-events"
#: Stream entries per XRANGE call, and so rows per Arrow batch.
DEFAULT_CHUNK: Final = 10_000
# The largest sequence part of a stream ID: "<ms>-<this>" ends a millisecond.
_MAX_SEQUENCE: Final = 2**64 - 1


class EventSourceError(SparkError):
    """The event log cannot be read: no such directory, an unusable stream option."""


#: The Spark type of each JSON type an event field may have: a JSON integer is a
#: 64-bit count (bytes, microseconds), a JSON number a double (Unix seconds).
_SPARK_TYPES: Final[dict[JsonType, DataType]] = {
    "string": StringType(),
    "integer": LongType(),
    "number": DoubleType(),
}


def event_schema() -> StructType:
    """The Spark schema of one event, field for field from :data:`asbp.eventlog.EVENT_FIELDS`."""
    return StructType(
        [
            StructField(field.name, _SPARK_TYPES[field.type], field.nullable)
            for field in EVENT_FIELDS
        ]
    )


#: The schema every reader applies (Spark's JSON reader makes every column nullable).
EVENT_SCHEMA: Final = event_schema()


@dataclass(frozen=True, slots=True)
class NdjsonSource:
    """NDJSON event files: a directory (its ``events-*.ndjson``), a file or a glob.

    Any path Spark reads works (``s3a://bucket/events/``, read as a directory
    when it ends with ``/``); only a local path is checked before Spark is asked.
    """

    path: str

    def location(self) -> tuple[str, str | None] | None:
        """What Spark should read: a path and a file-name glob to filter it by.

        None for a local directory with no event files yet (no events, no error).

        Raises:
            EventSourceError: a local path (or glob) that matches nothing.
        """
        path = self.path
        if "://" in path and not path.startswith("file:"):
            return (path, FILE_PATTERN) if path.endswith("/") else (path, None)
        local = Path(path.removeprefix("file:"))
        if has_magic(path):
            if not any(local.parent.glob(local.name)):
                raise EventSourceError(f"no event files match {path!r}")
            return path, None
        if local.is_dir():
            return (path, FILE_PATTERN) if any(local.glob(FILE_PATTERN)) else None
        if local.is_file():
            return path, None
        raise EventSourceError(f"no event log at {path!r}: not a directory or a file")


@dataclass(frozen=True, slots=True)
class RedisStreamSource:
    """A Redis Stream of events: ``redis://host:port/db`` and the stream's key.

    Args:
        url: a redis-py URL (``redis://``, ``rediss://``, ``unix://``).
        stream: the stream's key.
        partitions: ID ranges to read in parallel; None: Spark's default parallelism.
        chunk: entries per XRANGE call.
    """

    url: str
    stream: str = DEFAULT_STREAM
    partitions: int | None = None
    chunk: int = DEFAULT_CHUNK


EventSource = NdjsonSource | RedisStreamSource


def read_events(
    spark: SparkSession,
    source: EventSource | str | os.PathLike[str],
    *,
    since: datetime | float | None = None,
    until: datetime | float | None = None,
) -> DataFrame:
    """The events of ``source`` with ``since <= time < until``, as a DataFrame.

    Args:
        spark: the session.
        source: a :class:`RedisStreamSource`, an :class:`NdjsonSource`, or a path
            (read as NDJSON).
        since: keep events at or after this time (a datetime, or Unix seconds).
        until: keep events before this time.

    Returns:
        The :data:`EVENT_SCHEMA` columns, then ``timestamp``.

    Raises:
        EventSourceError: a local path that does not exist, or bad stream options.
    """
    if isinstance(source, str | os.PathLike):
        source = NdjsonSource(os.fspath(source))
    if isinstance(source, NdjsonSource):
        records = _read_ndjson(spark, source)
    else:
        records = _read_stream(spark, source)
    records = records.where(F.col("time").isNotNull())
    if since is not None:
        records = records.where(F.col("time") >= _seconds(since))
    if until is not None:
        records = records.where(F.col("time") < _seconds(until))
    return records.withColumn("timestamp", F.timestamp_seconds(F.col("time")))


def _seconds(moment: datetime | float) -> float:
    if isinstance(moment, datetime):
        if moment.tzinfo is None:
            raise EventSourceError(f"{moment.isoformat()} has no time zone; say +00:00 for UTC")
        return moment.timestamp()
    return float(moment)


def _read_ndjson(spark: SparkSession, source: NdjsonSource) -> DataFrame:
    location = source.location()
    if location is None:
        return spark.createDataFrame([], EVENT_SCHEMA)
    path, file_glob = location
    reader = spark.read.schema(EVENT_SCHEMA).option("mode", "DROPMALFORMED")
    if file_glob is not None:
        # A filter rather than a glob in the path: Spark then lists one
        # directory instead of looking for a metadata directory named by a glob.
        reader = reader.option("pathGlobFilter", file_glob)
    return reader.json(path)


def _read_stream(spark: SparkSession, source: RedisStreamSource) -> DataFrame:
    if source.chunk < 1:
        raise EventSourceError(f"chunk must be at least 1, not {source.chunk}")
    partitions = source.partitions or spark.sparkContext.defaultParallelism
    if partitions < 1:
        raise EventSourceError(f"partitions must be at least 1, not {partitions}")
    spark.dataSource.register(EventStreamDataSource)
    raw = (
        spark.read.format(STREAM_FORMAT)
        .option("url", source.url)
        .option("stream", source.stream)
        .option("partitions", str(partitions))
        .option("chunk", str(source.chunk))
        .load()
    )
    parsed: Column = F.from_json(F.col("e"), EVENT_SCHEMA, {"mode": "PERMISSIVE"})
    return raw.select(parsed.alias("event")).select("event.*")


# --------------------------------------------------------------------------
# The Redis Stream Data Source. Instances are pickled to the Python workers,
# so they hold only plain values and open their Redis connections there.
# --------------------------------------------------------------------------


class StreamRange(InputPartition):
    """Stream IDs ``start`` to ``end``, both inclusive, as XRANGE takes them."""

    def __init__(self, start: str, end: str) -> None:
        super().__init__((start, end))
        self.start = start
        self.end = end


class EventStreamDataSource(DataSource):
    """``spark.read.format("asbp-events")``: a Redis Stream's entries as raw JSON.

    Options: ``url`` (required), ``stream`` (default ``asbp:events``),
    ``partitions`` (ID ranges; default 2), ``chunk`` (entries per XRANGE).
    Columns: ``id`` (the entry ID) and ``e`` (the event's JSON; null when the
    entry has no ``e`` field).
    """

    @classmethod
    def name(cls) -> str:
        return STREAM_FORMAT

    def schema(self) -> str:
        return "id string, e string"

    def reader(self, schema: StructType) -> DataSourceReader:
        options = self.options
        if "url" not in options:
            raise EventSourceError(f"the {STREAM_FORMAT} source needs a url option")
        return _StreamReader(
            options["url"],
            options.get("stream", DEFAULT_STREAM),
            int(options.get("partitions", "2")),
            int(options.get("chunk", str(DEFAULT_CHUNK))),
        )


class _StreamReader(DataSourceReader):
    def __init__(self, url: str, stream: str, partitions: int, chunk: int) -> None:
        self.url = url
        self.stream = stream
        self.count = partitions
        self.chunk = chunk

    def partitions(self) -> Sequence[InputPartition]:
        import redis

        client = redis.Redis.from_url(self.url)
        try:
            first = _entries(client.xrange(self.stream, count=1))
            last = _entries(client.xrevrange(self.stream, count=1))
        finally:
            client.close()
        if not first or not last:
            return [StreamRange("1-0", "0-0")]  # an empty range: nothing to read
        return id_ranges(first[0][0].decode(), last[0][0].decode(), self.count)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        import redis

        assert isinstance(partition, StreamRange), partition
        client = redis.Redis.from_url(self.url)
        try:
            start = partition.start
            while True:
                entries = _entries(
                    client.xrange(self.stream, start, partition.end, count=self.chunk)
                )
                if not entries:
                    return
                ids = [entry_id for entry_id, _ in entries]
                bodies = [fields.get(STREAM_FIELD) for _, fields in entries]
                yield pa.RecordBatch.from_arrays(
                    [pa.array(ids, pa.binary()).cast(pa.string()), _strings(bodies)],
                    names=["id", "e"],
                )
                if len(entries) < self.chunk:
                    return
                start = "(" + ids[-1].decode()
        finally:
            client.close()


def _entries(reply: object) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """An XRANGE reply as redis-py gives it without ``decode_responses``."""
    return typing.cast("list[tuple[bytes, dict[bytes, bytes]]]", reply)


def _strings(values: list[bytes | None]) -> pa.Array:
    import pyarrow as pa

    binary = pa.array(values, pa.binary())
    try:
        return binary.cast(pa.string())
    except pa.ArrowInvalid:
        # Not UTF-8 somewhere: null those entries (they cannot be events)
        # rather than failing the whole batch.
        return pa.array(
            [_utf8(value) for value in values],
            pa.string(),
        )


def _utf8(value: bytes | None) -> str | None:
    if value is None:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


def id_ranges(first: str, last: str, count: int) -> list[StreamRange]:
    """Cut the stream IDs from ``first`` to ``last`` into at most ``count`` ranges.

    The cut is on the millisecond part, so each range but the last ends at
    ``<ms>-<max sequence>``, the next begins at ``<ms + 1>-0``, and every ID
    between ``first`` and ``last`` falls in exactly one range.
    """
    first_ms = int(first.partition("-")[0])
    last_ms = int(last.partition("-")[0])
    span = last_ms - first_ms + 1
    count = max(1, min(count, span))
    ranges: list[StreamRange] = []
    start = first
    for index in range(1, count):
        boundary = first_ms + span * index // count  # the first ms of the next range
        ranges.append(StreamRange(start, f"{boundary - 1}-{_MAX_SEQUENCE}"))
        start = f"{boundary}-0"
    ranges.append(StreamRange(start, last))
    return ranges
