"""The ``asbp`` streaming source: a queue read as a replayable stream.

Theory of operation
-------------------
Spark's micro-batch engine asks a source for offsets, plans a batch as a
range of them, writes the range to its checkpoint, runs it, writes the commit,
and only then tells the source (docs/spark.md has the whole story). The bus
has no offsets, so this reader makes them with a write-ahead log
(:mod:`agents.spark.source_wal`), driven from Spark's calls on the driver:

``latestOffset(start, limit)``
    Spark calls it only once the batch ending at ``start`` is in its commit
    log, so the messages below ``start`` are acknowledged first (this is also
    how a restarted query acknowledges the last batch of the run before it).
    Then the queue is drained with pipelined ``asbp.poll`` Commands (``wait``
    0, so "drained" means the queue looked empty), every message is appended
    to the log, the log is fsynced, and its end is the new offset.
``partitions(start, end)``
    The log's entries in that range become columns carried inside the
    partitions, so executors need no access to the driver's disk.
``commit(end)``
    Acknowledges the messages below ``end`` and drops them from the log.

Nothing is acknowledged before Spark committed it, so a crash loses nothing:
the broker takes the leases back when this Channel closes and delivers the
messages again, and the log recognises them by id (same offset, same row).

The driver-side methods run in one long-lived Python worker per query; the
reader keeps its Channel open between calls on an event loop in a daemon
thread, because the Channel must answer the broker's pings while Spark is
busy, and the leases it holds live as long as it does. When the query stops,
Spark ends that worker (without always calling ``stop()`` first), and the
Channel closes with the process. The same class is built (and pickled) to run
:meth:`AsbpStreamReader.read` on executors, so it connects lazily, on the first
driver-side call, and never in ``__init__``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator, Sequence
from typing import Any, TypeVar

import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type stubs
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from agents.messaging import Message, MessagingClient
from agents.spark.source_options import SourceOptions
from agents.spark.source_wal import Entry, WriteAheadLog

__all__ = ["AsbpStreamReader", "ColumnsPartition", "to_columns"]

_T = TypeVar("_T")


class ColumnsPartition(InputPartition):
    """A slice of one micro-batch: its columns, built on the driver from the log.

    Plain lists pickle small and fast; :meth:`AsbpStreamReader.read` turns them
    into one Arrow record batch on the executor, which Spark takes as it is
    instead of converting and checking row by row.
    """

    def __init__(self, columns: list[list[Any]]) -> None:
        super().__init__(len(columns[0]))
        self.columns = columns


def to_columns(entries: Sequence[Entry], payload: str) -> list[list[Any]]:
    """The entries as columns, in the order of :func:`source_schema`.

    Times go as epoch microseconds (Spark's timestamps), headers as key-value pairs.
    """
    messages = [entry.message for entry in entries]
    bodies: list[Any] = [m.payload for m in messages]
    if payload == "string":
        bodies = [body.decode("utf-8", "replace") for body in bodies]
    return [
        [entry.seq for entry in entries],
        [m.id for m in messages],
        [m.destination for m in messages],
        [m.subscription for m in messages],
        [m.timestamp * 1000 for m in messages],
        [None if m.expiration is None else m.expiration * 1000 for m in messages],
        [m.priority for m in messages],
        [m.deliveries for m in messages],
        [list(m.keys.items()) for m in messages],
        bodies,
    ]


class _LoopThread:
    """An event loop in a daemon thread, for blocking callers (Spark's API is synchronous)."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="asbp-source", daemon=True
        )
        self._thread.start()

    def run(self, work: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result()

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


class _Session:
    """The driver side's state: the log, the Channel and its loop."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.wal = WriteAheadLog(options.wal_path, fsync=options.wal_fsync)
        self.loop = _LoopThread()
        self.client = MessagingClient.websocket(options.url, timeout=options.timeout)
        try:
            self.loop.run(self._open())
        except BaseException:
            self.loop.stop()
            self.wal.close()
            raise
        #: Under Trigger.AvailableNow: the queue looked empty once, so stop polling.
        self.available_now = False
        self.exhausted = False

    async def _open(self) -> None:
        await self.client.connect()
        if self.options.type != "QUEUE":
            # The first subscription declares the virtual queue, durably, and it keeps
            # copying topic messages after the unsubscription; the reader then polls it.
            # Messages pushed meanwhile are leased to this Channel and taken in drain().
            await self.client.subscribe(self.options.queue, type="VIRTUAL_QUEUE")
            await self.client.unsubscribe(self.options.queue, type="VIRTUAL_QUEUE")

    def close(self) -> None:
        try:
            self.loop.run(self.client.close())
        finally:
            self.loop.stop()
            self.wal.close()

    # -- committing --------------------------------------------------------------

    def commit(self, end: int) -> None:
        wal = self.wal
        if end <= wal.base:
            return
        entries = wal.entries(wal.base, min(end, wal.end))
        receipts = [e.receipt for e in entries if e.receipt is not None]
        live = self.loop.run(self.client.ack(self.options.queue, receipts)) if receipts else 0
        # A dead receipt (its lease ran out) leaves the message in the queue; which one
        # died is not told, so every id of a short count waits as a tombstone.
        unconfirmed = [e.message.id for e in entries if e.receipt is None or live < len(receipts)]
        wal.commit(end, unconfirmed)

    # -- draining ----------------------------------------------------------------

    def drain(self, wanted: int, first_wait: float) -> None:
        """Append up to about ``wanted`` new messages (a round of polls more at most)."""
        if self.exhausted or wanted <= 0:
            return
        # The log is only touched from the loop while this thread waits: never at once.
        empty = self.loop.run(self._drain(wanted, first_wait))
        self.wal.sync()
        if empty and self.available_now:
            self.exhausted = True

    async def _drain(self, wanted: int, first_wait: float) -> bool:
        """Poll until ``wanted`` new entries were logged or the queue looked empty.

        Redeliveries do not count: after a restart the queue gives back what the
        last run held, and those are in the log already (or committed).
        """
        client, queue, count = self.client, self.options.queue, self.options.prefetch
        goal = self.wal.end + wanted
        limit = self.options.max_backlog_bytes
        await self._take(client.pushed())
        if first_wait > 0 and self.wal.end < goal and self.wal.payload_bytes < limit:
            # Nothing is waiting for Spark: let one poll wait, so an idle query does
            # not spin on the broker; its first message ends the wait.
            first = await client.poll(queue, count=count, wait=first_wait)
            await self._take(first)
            if len(first) < count:
                return True
        while self.wal.end < goal and self.wal.payload_bytes < limit:
            polls = min(self.options.parallel_polls, -(-(goal - self.wal.end) // count))
            rounds = await asyncio.gather(*(client.poll(queue, count=count) for _ in range(polls)))
            for messages in rounds:
                await self._take(messages)
            if any(len(messages) < count for messages in rounds):
                return True
        return False

    async def _take(self, messages: list[Message]) -> None:
        """Log new messages; acknowledge redeliveries of committed ones at once."""
        again = self.wal.add(messages)
        receipts = [m.receipt for m in again if m.receipt is not None]
        if receipts and await self.client.ack(self.options.queue, receipts) == len(receipts):
            self.wal.forget(m.id for m in again)


class AsbpStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("asbp")``: see the module docstring and docs/spark.md."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self._options = options
        self._schema = schema
        self._session: _Session | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Executors get the reader for read() only: never the driver's Channel.
        return {**self.__dict__, "_session": None}

    def _open(self) -> _Session:
        if self._session is None:
            self._session = _Session(self._options)
        return self._session

    # -- the driver side ---------------------------------------------------------------

    def initialOffset(self) -> dict[str, int]:
        return {"seq": self._open().wal.base}

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self._options.max_records_per_batch
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._open().available_now = True

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        session = self._open()
        begin = int(start["seq"])
        # Spark asks for the next batch only after committing the one ending at begin.
        session.commit(begin)
        wal = session.wal
        backlog = wal.end - max(begin, wal.base)
        room = self._options.max_backlog - backlog
        if isinstance(limit, ReadMaxRows):
            room = min(room, begin + limit.max_rows - wal.end)
        session.drain(room, self._options.poll_wait if backlog == 0 else 0.0)
        end = max(begin, wal.end)
        if isinstance(limit, ReadMaxRows):
            end = min(end, begin + limit.max_rows)
        return {"seq": end}

    def reportLatestOffset(self) -> dict[str, int] | None:
        session = self._session
        return None if session is None else {"seq": session.wal.end}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        wal = self._open().wal
        entries = wal.entries(int(start["seq"]), int(end["seq"]))
        if not entries:
            return []
        parts = min(self._options.num_partitions, len(entries))
        size = -(-len(entries) // parts)
        return [
            ColumnsPartition(to_columns(entries[i : i + size], self._options.payload))
            for i in range(0, len(entries), size)
        ]

    def commit(self, end: dict[str, int]) -> None:
        self._open().commit(int(end["seq"]))

    def stop(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.close()

    # -- the executor side -------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, ColumnsPartition):
            raise TypeError(f"an asbp partition was expected, not {type(partition).__name__}")
        # Spark checks the batch against exactly this Arrow schema.
        schema = to_arrow_schema(self._schema, timezone="UTC")
        arrays = [
            pa.array(column, type=field.type)
            for column, field in zip(partition.columns, schema, strict=True)
        ]
        return iter([pa.RecordBatch.from_arrays(arrays, schema=schema)])
