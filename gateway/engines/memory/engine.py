"""The embedded engine: topics, queues and virtual queues in this process's memory.

Zero set-up and one broker: nothing is shared with another process, and
**everything is lost when the process stops** (queued messages, leases,
virtual queues). Use the ``redis`` engine for durability or several brokers.

Theory of operation
-------------------
Each queue is a :class:`~gateway.engines.memory.queue.MemoryQueue`, a sans-I/O
core that takes the time and fills two outboxes (notices, and how many messages
became deliverable). This module is the asyncio shell around the cores:

- **Listeners are called with ``loop.call_soon``**, never from inside an engine
  method: a topic listener runs after ``publish`` has stored every virtual-queue
  copy, a QUEUED notice after ``enqueue`` has returned, in the order the events
  happened. A listener that raises cannot leave the engine half-updated; the
  loop's exception handler reports it.
- **Waiting consumers** (``fetch(..., wait=...)``) wait on a future in a FIFO
  per queue name (the queue need not exist yet). Whatever makes messages
  deliverable (enqueue, release, a lease running out, a delay ending) wakes
  as many waiters as there are deliverable messages; a woken waiter takes what
  it can and waits again if another consumer was faster. A waiter cancelled
  after being woken passes its wake-up on. No waiter ever polls.
- **Timers**: while a queue has waiters, one ``call_later`` timer per queue is
  armed for the earliest moment a message may become deliverable (the nearest
  ``not_before`` or lease deadline), so waiters are woken on time.
- **A periodic sweep** (``start()`` starts it, ``close()`` stops it) applies
  time to every queue: expired messages leave (EXPIRED notices), leases that
  ran out return, delayed messages fall due. ``fetch`` and ``depth`` do the same
  for their queue first, so the sweep only bounds how long an idle queue keeps
  expired messages.

Memory is bounded by ``max_queues`` queues of at most ``max_queue_depth``
messages each, and time bounds how long a message stays: its ``expiration``,
or ``default_ttl`` when it has none. Internal bookkeeping stays within about
twice what the live messages need (see :mod:`~gateway.engines.memory.queue`).

Costs: ``enqueue`` O(log n); ``fetch`` O(log n) per message leased; ``ack`` and
``release`` O(log n) per receipt; ``publish`` O(listeners + matching virtual
queues) once the topic name is cached (:class:`~gateway.engines.topic_patterns.TopicMatcher`);
the sweep O(queues + messages it removes).
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final, TypeAlias

from gateway.engines.base import (
    Delivery,
    EngineLimits,
    EngineUnavailable,
    Message,
    NoticeListener,
    QueuedMessage,
    QueueLimitReached,
    QueueStats,
    TopicListener,
)
from gateway.engines.memory.queue import MemoryQueue, stored_form
from gateway.engines.topic_patterns import TopicMatcher, virtual_queue
from gateway.tasks import cancel_and_wait

__all__ = ["DEFAULT_SWEEP_INTERVAL", "MemoryEngine"]

#: Seconds between two sweeps of every queue for expired messages and leases.
DEFAULT_SWEEP_INTERVAL: Final = 1.0

_DEFAULT_LIMITS: Final = EngineLimits()

_Waiters: TypeAlias = "OrderedDict[asyncio.Future[bool], None]"


class MemoryEngine:
    """Topics, queues and virtual queues in memory, for one broker; state is lost on restart.

    Args:
        limits: the bounds to enforce (see :class:`~gateway.engines.base.EngineLimits`).
        clock: wall-clock time in epoch seconds; tests inject a fake one.
        sweep_interval: seconds between sweeps for expired messages once started.
    """

    def __init__(
        self,
        *,
        limits: EngineLimits = _DEFAULT_LIMITS,
        clock: Callable[[], float] = time.time,
        sweep_interval: float = DEFAULT_SWEEP_INTERVAL,
    ) -> None:
        self._limits = limits
        self._clock = clock
        self._sweep_interval = sweep_interval
        self._queues: dict[str, MemoryQueue] = {}
        self._virtual = TopicMatcher()
        self._topic_listeners: list[TopicListener] = []
        self._notice_listeners: list[NoticeListener] = []
        self._waiters: dict[str, _Waiters] = {}
        self._timers: dict[str, tuple[float, asyncio.TimerHandle]] = {}
        self._seq = itertools.count()
        # Receipts are unique per lease and, thanks to the random prefix, across
        # restarts: a receipt kept from a previous process never matches a new lease.
        self._receipt_prefix = secrets.token_hex(6) + "."
        self._receipt_numbers = itertools.count(1)
        self._sweeper: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def limits(self) -> EngineLimits:
        """The bounds this engine enforces."""
        return self._limits

    async def start(self) -> None:
        """Start the periodic sweep (idempotent).

        Raises:
            EngineUnavailable: the engine was closed.
        """
        self._check_open()
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep_periodically(), name="memory sweep")

    async def close(self) -> None:
        """Stop the sweep and timers; fetches still waiting return what they have (nothing).

        Later calls raise EngineUnavailable. Queued messages are dropped with the
        engine (see the module docstring).
        """
        self._closed = True
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            await cancel_and_wait(sweeper)
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        for waiters in self._waiters.values():
            for future in waiters:
                if not future.done():
                    future.set_result(False)
        self._waiters.clear()

    # -- topics ----------------------------------------------------------

    def listen(self, listener: TopicListener) -> None:
        """Call ``listener(message)`` for every topic message (via ``call_soon``)."""
        self._topic_listeners.append(listener)

    async def publish(self, message: Message) -> None:
        """Store a copy in every matching virtual queue, then schedule the listeners."""
        self._check_open()
        names = self._virtual.match(message.destination)
        if names:
            stored = stored_form(message, self._limits)
            now = self._clock()
            for name in names:
                queue = self._queues[name]
                if not queue.full:  # a full virtual queue drops the copy (base.py)
                    queue.put(stored, next(self._seq), now)
                    self._flush(queue)
        if self._topic_listeners:
            loop = asyncio.get_running_loop()
            for listener in self._topic_listeners:
                loop.call_soon(listener, message)

    # -- queues ----------------------------------------------------------

    async def enqueue(self, message: Message) -> None:
        """Store ``message`` in the queue ``message.destination``, creating the queue.

        Raises:
            QueueLimitReached: the queue is new and there are max_queues already.
            QueueFull: the queue holds max_queue_depth messages.
            ValueError: the priority is outside 0-9.
        """
        self._check_open()
        stored = stored_form(message, self._limits)
        queue = self._queues.get(message.destination)
        if queue is None:
            queue = self._create(message.destination)
        queue.put(stored, next(self._seq), self._clock())
        self._flush(queue)

    def enqueue_many(self, messages: Sequence[Message]) -> list[Exception | None]:
        """:meth:`enqueue` for each of ``messages``, in order, done on return: for
        each, None once stored or the exception :meth:`enqueue` would have raised.

        Not part of :class:`~gateway.engines.base.Engine`: a Course's sender
        (courses.link) stores what one loop turn gave it in one call, where
        ``enqueue`` costs each message a coroutine, a future and a wake-up of the
        queue's waiters.

        Raises:
            EngineUnavailable: the engine is closed (nothing was stored).
        """
        self._check_open()
        outcomes: list[Exception | None] = []
        touched: dict[str, MemoryQueue] = {}
        now = self._clock()
        for message in messages:
            try:
                stored = stored_form(message, self._limits)
                queue = self._queues.get(message.destination)
                if queue is None:
                    queue = self._create(message.destination)
                queue.put(stored, next(self._seq), now)
            except (QueueLimitReached, ValueError) as exc:
                outcomes.append(exc)
                continue
            touched[message.destination] = queue
            outcomes.append(None)
        for queue in touched.values():
            self._flush(queue)
        return outcomes

    async def fetch(
        self, queue: str, consumer: str, *, count: int = 1, wait: float = 0.0
    ) -> list[Delivery]:
        """Lease up to ``count`` messages, waiting up to ``wait`` seconds for the first.

        ``wait`` runs on the event loop's monotonic clock, not on ``clock``.
        ``consumer`` is not recorded: the receipt alone identifies the lease.

        Raises:
            ValueError: ``count`` is less than 1.
        """
        self._check_open()
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        deliveries = self._take(queue, count)
        if deliveries or wait <= 0:
            return deliveries
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + wait
        while True:
            waiters = self._waiters.setdefault(queue, OrderedDict())
            future: asyncio.Future[bool] = loop.create_future()
            waiters[future] = None
            self._arm_timer(queue)
            timeout = loop.call_at(give_up_at, _resolve, future, False)
            try:
                await future
            except asyncio.CancelledError:
                if future.done() and not future.cancelled() and future.result():
                    self._wake(queue, 1)  # woken, then cancelled: pass the wake-up on
                raise
            finally:
                timeout.cancel()
                waiters.pop(future, None)
                if not waiters and self._waiters.get(queue) is waiters:
                    del self._waiters[queue]
                    self._disarm_timer(queue)
            if self._closed:
                return []
            deliveries = self._take(queue, count)
            if deliveries or loop.time() >= give_up_at:
                return deliveries

    async def ack(self, queue: str, receipts: Sequence[str]) -> int:
        """Remove the messages of live leases (CONSUMED); how many were live."""
        self._check_open()
        memory_queue = self._queues.get(queue)
        if memory_queue is None:
            return 0
        acknowledged = memory_queue.ack(receipts, self._clock())
        self._flush(memory_queue)
        return acknowledged

    async def release(self, queue: str, receipts: Sequence[str]) -> int:
        """Make the messages of live leases deliverable again at once; how many were live."""
        self._check_open()
        memory_queue = self._queues.get(queue)
        if memory_queue is None:
            return 0
        released = memory_queue.release(receipts, self._clock())
        self._flush(memory_queue)
        return released

    # -- virtual queues ----------------------------------------------------

    async def declare_virtual_queue(self, name: str, pattern: str) -> None:
        """Create ``name@pattern``, fed by every topic fully matching ``pattern`` (idempotent).

        Raises:
            InvalidVirtualQueue: a bad name or an invalid or unsafe pattern.
            QueueLimitReached: it is new and there are max_queues already.
        """
        self._check_open()
        declared = virtual_queue(name, pattern)
        full_name = declared.full_name
        if full_name in self._virtual:
            return
        if full_name not in self._queues:
            self._create(full_name)
        self._virtual.add(full_name, declared)

    # -- observation -------------------------------------------------------

    def on_notice(self, listener: NoticeListener) -> None:
        """Call ``listener(notice)`` for every delivery notice (via ``call_soon``)."""
        self._notice_listeners.append(listener)

    async def depth(self, queue: str) -> int:
        """Messages in ``queue``, leased and delayed ones included; 0 if there is none."""
        self._check_open()
        memory_queue = self._queues.get(queue)
        if memory_queue is None:
            return 0
        memory_queue.advance(self._clock())
        self._flush(memory_queue)
        return memory_queue.depth

    async def queues(self) -> list[str]:
        """Every queue and virtual queue (virtual ones as ``name@pattern``), oldest first."""
        self._check_open()
        return list(self._queues)

    async def depths(self) -> dict[str, int]:
        """Every queue's depth as of the last sweep: no queue is advanced, so a scrape
        of 100,000 queues is one pass over a dict."""
        self._check_open()
        return {name: queue.depth for name, queue in self._queues.items()}

    # -- inspection --------------------------------------------------------

    async def peek(self, queue: str, count: int) -> list[QueuedMessage]:
        """Up to ``count`` ready or leased messages of ``queue``, leasing none."""
        self._check_open()
        stored = self._queues.get(queue)
        if stored is None or count < 1:
            return []
        peeked = stored.peek(count, self._clock())
        self._flush(stored)  # what time did (expiries) is reported as usual
        return peeked

    async def queue_stats(self, queue: str) -> QueueStats:
        """``queue``'s depth, oldest message's age and dead letters."""
        self._check_open()
        stored = self._queues.get(queue)
        if stored is None:
            return QueueStats(depth=0, oldest_age=None, dead_letters=0)
        now = self._clock()
        oldest = stored.oldest(now)
        self._flush(stored)
        return QueueStats(
            depth=stored.depth,
            oldest_age=None if oldest is None else max(0.0, now - oldest),
            dead_letters=stored.dead_count,
        )

    async def dead_letters(self, queue: str, count: int) -> list[QueuedMessage]:
        """Up to ``count`` of ``queue``'s dead letters, oldest first."""
        self._check_open()
        stored = self._queues.get(queue)
        return [] if stored is None or count < 1 else stored.dead_letters(count)

    async def requeue_dead_letters(self, queue: str, count: int) -> int:
        """Move up to ``count`` dead letters back into ``queue``; how many moved."""
        self._check_open()
        stored = self._queues.get(queue)
        if stored is None or count < 1:
            return 0
        moved = stored.requeue_dead(count, self._seq.__next__, self._clock())
        self._flush(stored)
        return moved

    async def ping(self) -> None:
        """In memory: answers while open."""
        self._check_open()

    def sweep(self) -> None:
        """Apply time to every queue now (what the periodic sweep runs); call in the loop."""
        now = self._clock()
        for queue in self._queues.values():
            queue.advance(now)
            self._flush(queue)

    def retained(self, queue: str) -> int:
        """Internal entries ``queue`` holds, tombstones included (for tests and metrics)."""
        memory_queue = self._queues.get(queue)
        return 0 if memory_queue is None else memory_queue.retained()

    # -- internals ---------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise EngineUnavailable("the memory engine is closed")

    def _create(self, name: str) -> MemoryQueue:
        if len(self._queues) >= self._limits.max_queues:
            raise QueueLimitReached(
                f"cannot create queue {name!r}: there are {len(self._queues)} queues, "
                f"the limit (max_queues={self._limits.max_queues})"
            )
        queue = self._queues[name] = MemoryQueue(name, self._limits)
        return queue

    def _take(self, name: str, count: int) -> list[Delivery]:
        queue = self._queues.get(name)
        if queue is None:
            return []
        deliveries = queue.take(count, self._clock(), self._new_receipt)
        self._flush(queue)
        return deliveries

    def _new_receipt(self) -> str:
        return f"{self._receipt_prefix}{next(self._receipt_numbers)}"

    def _flush(self, queue: MemoryQueue) -> None:
        """Drain ``queue``'s outboxes: schedule notices, wake waiters, re-arm its timer."""
        if queue.notices:
            notices, queue.notices = queue.notices, []
            if self._notice_listeners:
                loop = asyncio.get_running_loop()
                for notice in notices:
                    for listener in self._notice_listeners:
                        loop.call_soon(listener, notice)
        woken, queue.woken = queue.woken, 0
        if queue.name in self._waiters:
            if woken:
                self._wake(queue.name, min(woken, queue.ready))
            self._arm_timer(queue.name)

    def _wake(self, name: str, count: int) -> None:
        waiters = self._waiters.get(name)
        while waiters and count > 0:
            future, _ = waiters.popitem(last=False)
            if not future.done():
                future.set_result(True)
                count -= 1

    def _arm_timer(self, name: str) -> None:
        """Make sure a timer fires when the next message of ``name`` may become deliverable."""
        queue = self._queues.get(name)
        at = None if queue is None else queue.next_change()
        if at is None:
            return
        armed = self._timers.get(name)
        if armed is not None:
            if armed[0] <= at:
                return
            armed[1].cancel()
        loop = asyncio.get_running_loop()
        handle = loop.call_later(max(0.0, at - self._clock()), self._on_timer, name)
        self._timers[name] = (at, handle)

    def _disarm_timer(self, name: str) -> None:
        armed = self._timers.pop(name, None)
        if armed is not None:
            armed[1].cancel()

    def _on_timer(self, name: str) -> None:
        del self._timers[name]
        queue = self._queues[name]
        queue.advance(self._clock())
        self._flush(queue)  # wakes waiters and re-arms while any remain

    async def _sweep_periodically(self) -> None:
        while True:
            await asyncio.sleep(self._sweep_interval)
            self.sweep()


def _resolve(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)


if TYPE_CHECKING:  # mypy checks that MemoryEngine implements the Engine protocol
    from gateway.engines.base import Engine

    _conforms: Engine = MemoryEngine()
