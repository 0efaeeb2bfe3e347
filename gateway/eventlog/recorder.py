"""The recorder: takes one event per routed Command and hands batches to a store.

Theory of operation
-------------------
The router calls :meth:`Recorder.record` once per Command, on the routing path
(20-40 thousand times a second), with the event's fields; recording builds one
:class:`~gateway.eventlog.schema.Event` and appends it to a short list: no I/O,
no await. Once the list holds :data:`CHUNK` events, the next Command's record
turns them into one chunk of NDJSON (:func:`~gateway.eventlog.schema.to_ndjson`,
under 0.1 millisecond) and starts a new list; only the chunks wait for the
store. The encoding is on the event loop either way: in slices this small it
never holds the loop for a whole batch (about a millisecond for 4,096 events),
the events are freed at once, a chunk is one object for the allocator and the
collector where 512 events were 512 and more, and a chunk is what a Redis
Stream store sends in one call.

Events held, in chunks and in the list, number at most ``capacity``; past that
a new event is dropped (before it is built) and counted in
:attr:`Recorder.dropped`, never the router kept waiting, so the memory used
stays bounded (a chunk holds about 0.3 KiB an event) however slow the store is.

A flusher task wakes every ``interval`` seconds, or as soon as a batch is
waiting, takes up to ``batch_size`` events' chunks (turning a partly filled
list into a chunk first) and awaits the store with them. One batch is in the
store's hands at a time, so at most ``capacity + batch_size`` events are held. A
batch the store fails to take (a disk full, Redis down) is counted in
:attr:`Recorder.lost`; both counts are logged as a warning at most every
``warn_interval`` seconds, and :meth:`Recorder.stop` logs the totals.

What the choices cost (bench/eventlog.py, on a busy 2-core machine): a dict
per event, which ``orjson`` can write, costs the router about 350 nanoseconds to
build, an Event (a ``msgspec.Struct``) 60-90, about what a tuple of its fields
would; formatting tuples later in Python would cost several times that. msgspec
writes an event in 0.12-0.15 microsecond, against 0.25 for ``orjson`` and the
split of its array into lines. Per event, the router's share is now about 0.4
microsecond at the call site, 0.4 in :meth:`Recorder.record` and 0.15-0.25 to
encode; the store's, 0.2 (a file) to 0.4 (Redis, not counting Redis's own CPU).

``stop`` lets the flusher write everything still buffered, waiting up to
``stop_timeout`` seconds for the store before giving up on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Final, Protocol

from gateway.eventlog.schema import DestinationKind, Event, SourceKind, to_ndjson
from gateway.tasks import cancel_and_wait

__all__ = ["BATCH_SIZE", "CHUNK", "CLOCK_NS", "INTERVAL", "Recorder", "Route", "Store"]


#: Where the router handed a Command: the destination's kind, the destination,
#: and the agent serving it (for a Command from a Channel).
Route = tuple[DestinationKind | None, str | None, str | None]

#: The clock of :meth:`Recorder.record`'s ``began``: an event's time and the end
#: of its latency.
CLOCK_NS: Final = time.time_ns

#: Events written to the store at once, at most.
BATCH_SIZE: Final = 4096
#: Lines of one NDJSON chunk, at most: the events written at once on the routing
#: path, and the entries one script call adds to a Redis Stream (which bounds how
#: long one call keeps Redis busy, about a millisecond).
CHUNK: Final = 512
#: Seconds between flushes when fewer than a batch are waiting.
INTERVAL: Final = 0.25
#: Seconds between two warnings about dropped or lost events, at least.
WARN_INTERVAL: Final = 10.0
#: Seconds ``stop`` waits for the store to take what is buffered.
STOP_TIMEOUT: Final = 5.0


class Store(Protocol):
    """Where batches of events go: rotating files or a Redis Stream."""

    async def write(self, chunks: Sequence[bytes], count: int) -> None:
        """Store ``count`` events, in order: NDJSON in ``chunks`` of at most
        :data:`CHUNK` whole lines (each line ends with ``\\n``).

        Raises:
            Exception: anything; the recorder counts the events as lost.
        """
        ...

    async def close(self) -> None:
        """Release files or connections (called once, after the last write)."""
        ...


class Recorder:
    """Buffers events in memory and writes them to a store in batches.

    Args:
        store: where the batches go.
        broker_id: the ``broker`` of every event.
        log: where warnings about dropped and lost events go.
        capacity: events buffered at most; more are dropped and counted.
        batch_size: events handed to the store at once, at most.
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
        # Events per chunk: a batch and the buffer hold whole chunks.
        self._chunk = min(CHUNK, capacity, batch_size)
        self._events: list[Event] = []  # not yet in a chunk, fewer than _chunk
        self._chunks: list[tuple[bytes, int]] = []  # NDJSON and its line count
        self._chunked = 0  # events in _chunks
        # Events _events may hold before new ones are dropped: _chunk, or less
        # when the buffer is nearly full. The one bound the hot path checks.
        self._room = self._chunk
        self._error: Exception | None = None  # the last failure, for the warning
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
        #: Events in batches the store failed to take (or that failed to encode).
        self.lost = 0
        self._warned_at: float | None = None
        self._reported = 0  # dropped + lost at the last warning

    # -- the hot path --------------------------------------------------------

    def record(
        self,
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
            began: :data:`CLOCK_NS` at receipt (Unix nanoseconds); the latency
                ends now. One wall clock for both saves the router a clock read
                per Command; a step of the clock while a Command is routed (a
                few microseconds) would skew that one latency, and a step back
                is recorded as 0.
            agent: the sending agent, for a Command from a Tube.
            route: where the Command was handed, None if it never was.
            fault: the fault code the sender got while it was routed.
        """
        events = self._events
        if len(events) >= self._room:
            # Rarely: a full chunk (a fresh list then) or a full buffer (dropped).
            if not self._make_room():
                self.dropped += 1
                return
            events = self._events
        if route is None:
            kind = destination = None
        else:
            kind, destination, serving = route
            if agent is None:
                agent = serving
        latency = (CLOCK_NS() - began) // 1000
        # Positional: a Struct's cheapest constructor call.
        events.append(
            Event(
                began / 1e9,  # what time.time() would have said
                self.broker_id,
                source_kind,
                source,
                subject,
                command,
                header_bytes,
                body_bytes,
                kind,
                destination,
                agent,
                "delivered" if fault is None else "fault",
                fault,
                latency if latency > 0 else 0,
            )
        )

    def _make_room(self) -> bool:
        """Seal a full chunk, if that is what is in the way; False if the buffer is."""
        if len(self._events) == self._chunk:
            self._seal()
        return len(self._events) < self._room

    def _seal(self) -> None:
        """Turn the events not yet in a chunk into one."""
        events = self._events
        if not events:
            return
        self._events = []
        try:
            lines = to_ndjson(events)
        except Exception as exc:
            # Cannot happen with the strings the router passes (decoded, so valid
            # UTF-8), and must not reach the router if it does: counted, warned.
            self.lost += len(events)
            self._error = exc
        else:
            self._chunks.append((lines, len(events)))
            self._chunked += len(events)
            if self._chunked >= self._batch_size:
                self._wake.set()
        self._room = min(self._chunk, self.capacity - self._chunked)

    @property
    def buffered(self) -> int:
        """Events waiting for the flusher."""
        return self._chunked + len(self._events)

    # -- life cycle ----------------------------------------------------------

    def start(self) -> None:
        """Start the flusher; call inside the serving event loop."""
        if self._task is None:
            self._task = asyncio.create_task(self._flush_forever(), name="asbp-eventlog")

    async def stop(self) -> None:
        """Write what is buffered (within ``stop_timeout``), then close the store.

        Events recorded afterwards are dropped and counted. Idempotent.
        """
        if self._stopping:
            return
        self._stopping = True
        task = self._task
        if task is not None:
            self._wake.set()
            done, _ = await asyncio.wait({task}, timeout=self._stop_timeout)
            if not done:
                await cancel_and_wait(task)
            elif not task.cancelled():
                task.result()
        self.lost += self.buffered  # what the store did not take in time
        self._events = []
        self._chunks.clear()
        self._chunked = 0
        self.capacity = self._room = 0
        with contextlib.suppress(Exception):  # a store that fails to close holds nothing
            await self.store.close()
        self._log.info(
            "eventlog.stop",
            extra={"written": self.written, "dropped": self.dropped, "lost": self.lost},
        )

    async def flush(self) -> None:
        """Write everything recorded so far (the flusher keeps running)."""
        async with self._writing:
            while self.buffered:
                await self._write_batch()

    # -- the flusher ---------------------------------------------------------

    async def _flush_forever(self) -> None:
        while True:
            if self._chunked < self._batch_size and not self._stopping:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._interval):
                        await self._wake.wait()
                self._wake.clear()
            if self._stopping and not self.buffered:
                return
            async with self._writing:
                await self._write_batch()
            self._warn()

    async def _write_batch(self) -> None:
        if self._chunked < self._batch_size:
            self._seal()  # the events of a partial batch: due now
        chunks = self._chunks
        if not chunks:
            return
        # Whole chunks, up to batch_size events (and at least one chunk).
        taken = count = 0
        for _, lines in chunks:
            if taken and count + lines > self._batch_size:
                break
            taken += 1
            count += lines
        batch = [data for data, _ in chunks[:taken]]
        del chunks[:taken]
        self._chunked -= count
        self._room = min(self._chunk, self.capacity - self._chunked)
        try:
            await self.store.write(batch, count)
        except asyncio.CancelledError:
            self.lost += count
            raise
        except Exception as exc:
            # The log must never take routing down: whatever the store raised, the
            # batch is counted and the broker goes on. The error is in the warning.
            self.lost += count
            self._error = exc
            self._warn()
        else:
            self.written += count

    def _warn(self) -> None:
        missing = self.dropped + self.lost
        if missing == self._reported:
            return
        now = self._clock()
        if self._warned_at is not None and now - self._warned_at < self._warn_interval:
            return
        self._warned_at = now
        error, self._error = self._error, None
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
