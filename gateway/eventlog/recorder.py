"""The recorder: takes one event per routed Command and hands batches to a store.

Theory of operation
-------------------
The router calls :meth:`Recorder.record` once per Command, on the routing path
(20-40 thousand times a second), with the event's fields; recording builds one
dict (a :class:`Row`) and appends it to a list: no
:class:`~gateway.eventlog.schema.Event`, no JSON, no I/O, no await. The list holds
at most ``capacity`` rows; past that a new event is dropped (before its dict is
built) and counted in :attr:`Recorder.dropped`, never the router kept waiting, so
the memory used stays bounded (a row is about 0.5 KiB) however slow the store is.

A flusher task wakes every ``interval`` seconds, or as soon as a batch is
waiting, takes up to ``batch_size`` rows, turns them into NDJSON and awaits the
store with them. One batch is in the store's hands at a time, so at most
``capacity + batch_size`` rows are held. A batch the store fails to take (a
disk full, Redis down) is counted in :attr:`Recorder.lost`; both counts are
logged as a warning at most every ``warn_interval`` seconds, and
:meth:`Recorder.stop` logs the totals.

Why dicts: a row's keys are :data:`~gateway.eventlog.schema.FIELDS` in order, so
``orjson.dumps`` of a row is exactly ``Event.to_json()``, and a whole batch is one
``orjson.dumps`` call, about 0.1 microsecond an event. A dict display costs the
router a few hundred nanoseconds more than a tuple would; turning tuples into
dicts later would cost the flusher, on the same thread, more than that (about
0.8 against 0.5 microseconds an event where we measured), and building Events
and calling ``to_json`` about 2 microseconds.

The JSON array of a batch is split into lines where one object ends and the next
begins (``},{"time":``): that sequence cannot occur inside a JSON string, whose
quotes are escaped, and every object starts with ``time``.

``stop`` lets the flusher write everything still buffered, waiting up to
``stop_timeout`` seconds for the store before giving up on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Final, Protocol, TypedDict

import orjson

from gateway.eventlog.schema import DestinationKind, Outcome, SourceKind

__all__ = ["BATCH_SIZE", "INTERVAL", "Recorder", "Route", "Row", "Store", "rows_to_ndjson"]


#: Where the router handed a Command: the destination's kind, the destination,
#: and the agent serving it (for a Command from a Channel).
Route = tuple[DestinationKind | None, str | None, str | None]


class Row(TypedDict):
    """One event as the router builds it: a plain dict, keys in the order of
    :data:`~gateway.eventlog.schema.FIELDS`, so ``Event(**row)`` is the event and
    ``orjson.dumps(row)`` is exactly its ``to_json()``."""

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


_ns: Final = time.perf_counter_ns

#: Rows written to the store at once, at most.
BATCH_SIZE: Final = 4096
#: Seconds between flushes when fewer than a batch are waiting.
INTERVAL: Final = 0.25
#: Seconds between two warnings about dropped or lost events, at least.
WARN_INTERVAL: Final = 10.0
#: Seconds ``stop`` waits for the store to take what is buffered.
STOP_TIMEOUT: Final = 5.0

# Where one object ends and the next begins in orjson's output for a list of
# rows; see the module docstring.
_BETWEEN: Final = b'},{"time":'
_BETWEEN_LINES: Final = b'}\n{"time":'


class Store(Protocol):
    """Where batches of events go: rotating files or a Redis Stream."""

    async def write(self, lines: bytes, count: int) -> None:
        """Store ``count`` events, ``lines`` of NDJSON (each line ends with ``\\n``).

        Raises:
            Exception: anything; the recorder counts the events as lost.
        """
        ...

    async def close(self) -> None:
        """Release files or connections (called once, after the last write)."""
        ...


def rows_to_ndjson(rows: list[Row]) -> bytes:
    """``rows`` as NDJSON: ``Event.to_json()`` of each, followed by a newline."""
    if not rows:
        return b""
    return orjson.dumps(rows)[1:-1].replace(_BETWEEN, _BETWEEN_LINES) + b"\n"


class Recorder:
    """Buffers events in memory and writes them to a store in batches.

    Args:
        store: where the batches go.
        broker_id: the ``broker`` of every event.
        log: where warnings about dropped and lost events go.
        capacity: rows buffered at most; more are dropped and counted.
        batch_size: rows handed to the store at once, at most.
        interval: seconds between flushes of a partial batch.
        warn_interval: seconds between two warnings, at least.
        stop_timeout: seconds ``stop`` waits for the store.
        clock: monotonic seconds, for the warnings' pace.
    """

    def __init__(
        self,
        store: Store,
        *,
        broker_id: str,
        log: logging.Logger,
        capacity: int = 65_536,
        batch_size: int = BATCH_SIZE,
        interval: float = INTERVAL,
        warn_interval: float = WARN_INTERVAL,
        stop_timeout: float = STOP_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity < 1 or batch_size < 1:
            raise ValueError("capacity and batch_size must be positive")
        self.store = store
        self.broker_id = broker_id
        self.capacity = capacity
        self._log = log
        self._batch_size = batch_size
        self._interval = interval
        self._warn_interval = warn_interval
        self._stop_timeout = stop_timeout
        self._clock = clock
        self._rows: list[Row] = []
        self._wake = asyncio.Event()
        # One batch in the store's hands at a time, in order, whether the flusher
        # or flush() writes it.
        self._writing = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        #: Events the store took.
        self.written = 0
        #: Events dropped because the buffer was full.
        self.dropped = 0
        #: Events in batches the store failed to take.
        self.lost = 0
        self._warned_at: float | None = None
        self._reported = 0  # dropped + lost at the last warning

    # -- the hot path --------------------------------------------------------

    def record(
        self,
        now: float,
        began: int,
        source_kind: SourceKind,
        source: str,
        agent: str | None,
        command: str | None,
        subject: str | None,
        header_bytes: int,
        body_bytes: int,
        route: Route | None,
        fault: int | None,
    ) -> None:
        """Buffer the event of one routed Command, or count it as dropped.

        Args:
            now: Unix seconds at receipt.
            began: ``time.perf_counter_ns()`` at receipt; the latency ends now.
            agent: the sending agent, for a Command from a Tube.
            route: where the Command was handed, None if it never was.
            fault: the fault code the sender got while it was routed.
        """
        rows = self._rows
        size = len(rows)
        if size >= self.capacity:
            self.dropped += 1
            return
        if route is None:
            kind = destination = None
        else:
            kind, destination, serving = route
            if agent is None:
                agent = serving
        # One dict display: the cheapest object orjson writes as a JSON object.
        rows.append(
            {
                "time": now,
                "broker": self.broker_id,
                "source_kind": source_kind,
                "source": source,
                "subject": subject,
                "command": command,
                "header_bytes": header_bytes,
                "body_bytes": body_bytes,
                "destination_kind": kind,
                "destination": destination,
                "agent": agent,
                "outcome": "delivered" if fault is None else "fault",
                "fault": fault,
                "latency_us": (_ns() - began) // 1000,
            }
        )
        if size == self._batch_size:
            self._wake.set()

    @property
    def buffered(self) -> int:
        """Events waiting for the flusher."""
        return len(self._rows)

    # -- life cycle ----------------------------------------------------------

    def start(self) -> None:
        """Start the flusher; call inside the serving event loop."""
        if self._task is None:
            self._task = asyncio.create_task(self._flush_forever(), name="asbp-eventlog")

    async def stop(self) -> None:
        """Write what is buffered (within ``stop_timeout``), then close the store.

        Rows recorded afterwards are dropped and counted. Idempotent.
        """
        if self._stopping:
            return
        self._stopping = True
        task = self._task
        if task is not None:
            self._wake.set()
            done, _ = await asyncio.wait({task}, timeout=self._stop_timeout)
            if not done:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            elif not task.cancelled():
                task.result()
        self.lost += len(self._rows)  # what the store did not take in time
        self._rows.clear()
        self.capacity = 0
        with contextlib.suppress(Exception):  # a store that fails to close holds nothing
            await self.store.close()
        self._log.info(
            "eventlog.stop",
            extra={"written": self.written, "dropped": self.dropped, "lost": self.lost},
        )

    async def flush(self) -> None:
        """Write everything recorded so far (the flusher keeps running)."""
        async with self._writing:
            while self._rows:
                await self._write_rows()

    # -- the flusher ---------------------------------------------------------

    async def _flush_forever(self) -> None:
        while True:
            if len(self._rows) < self._batch_size and not self._stopping:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._interval):
                        await self._wake.wait()
                self._wake.clear()
            if self._stopping and not self._rows:
                return
            await self._write_batch()
            self._warn()

    async def _write_batch(self) -> None:
        async with self._writing:
            await self._write_rows()

    async def _write_rows(self) -> None:
        rows = self._rows
        if not rows:
            return
        batch = rows[: self._batch_size]
        del rows[: self._batch_size]
        try:
            await self.store.write(rows_to_ndjson(batch), len(batch))
        except asyncio.CancelledError:
            self.lost += len(batch)
            raise
        except Exception as exc:
            # The log must never take routing down: whatever the store raised, the
            # batch is counted and the broker goes on. The error is in the warning.
            self.lost += len(batch)
            self._warn(exc)
        else:
            self.written += len(batch)

    def _warn(self, error: BaseException | None = None) -> None:
        missing = self.dropped + self.lost
        if missing == self._reported:
            return
        now = self._clock()
        if self._warned_at is not None and now - self._warned_at < self._warn_interval:
            return
        self._warned_at = now
        self._log.warning(
            "eventlog.missing",
            extra={
                "dropped": self.dropped,
                "lost": self.lost,
                "since": missing - self._reported,
                "error": None if error is None else f"{type(error).__name__}: {error}",
            },
        )
        self._reported = missing
