"""One in-memory queue: the sans-I/O core of the memory engine.

:class:`MemoryQueue` holds one queue's messages and leases and knows nothing of
asyncio: every method takes the time (``now``) and leaves what it caused in two
outboxes, :attr:`MemoryQueue.notices` (delivery notices to send) and
:attr:`MemoryQueue.woken` (how many messages became deliverable, so the shell
can wake that many waiting consumers). :mod:`gateway.engines.memory.engine` drains
both after each call.

Theory of operation
-------------------
Each message is one mutable ``_Entry`` that moves through states::

    put ──► DELAYED ──(not_before)──► READY ──take──► LEASED ──ack──► GONE (CONSUMED)
     │                                  ▲               │
     └──────────────────────────────────┘               ├─release / deadline─► READY
                                                        └─… after max_deliveries─► DEAD (DISCARDED)
    READY, DELAYED or a returning lease past its expiration ──► GONE (EXPIRED)
    DEAD ──requeue_dead──► put (a new entry, deliveries from zero)

A dead letter is GONE for every index below and kept, with its deliveries, in
``_dead``: a deque bounded at ``max_dead_letters`` that drops its oldest when
a newer one comes (gateway.engines.base, "Dead letters"), made with the first
dead letter (an empty deque weighs 600 bytes: 60 MB over 100,000 queues).

It is indexed by the structures below, each O(1) or O(log n) per operation;
nothing scans the queue:

- ``_ready``: ten deques, one per priority. ``take`` pops from the highest
  non-empty one (at most ten emptiness checks), so priority order and FIFO
  within a priority cost O(1). New and newly due messages join the tail: a
  delayed message is queued "as though it had been received from the sender
  at the specified time" (DCE, "Timed Dequeuing"), which is why ``put``
  promotes due delayed messages *before* appending its own. A message coming
  back from a lease (release, deadline) joins the *head*: it was the oldest
  when it was taken. Several coming back at once keep their original order.
- ``_delayed``: a heap of ``(not_before, seq, entry)``.
- ``_leases``: receipt → entry for live leases; ``_deadlines``: a heap of
  ``(deadline, receipt)``. Receipts are unique per lease, so a redelivered
  message has a new one and the old receipt finds nothing.
- ``_expiry``: a heap of ``(expiration, seq, entry)`` over every message, so
  expired messages are found without looking at the others (by ``advance``,
  which the engine calls on every fetch and from its periodic sweep).

Removal is lazy: an entry leaving by another road (an acknowledged message
still in ``_expiry``, an expired one still in a deque or in ``_delayed``, an
acknowledged lease still in ``_deadlines``) is marked GONE and skipped when it
surfaces. So that such tombstones cannot pile up (a queue with a 7-day TTL
would keep a week of acknowledged entries in ``_expiry``), each structure is
rebuilt without them once they outnumber the live entries it holds (plus
:data:`SLACK`): O(n) now and then, O(1) amortised, and memory stays within
about twice what the live messages need.
"""

from __future__ import annotations

import enum
import heapq
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from itertools import chain, islice
from operator import attrgetter
from typing import Final

from gateway.engines.base import (
    MAX_DEAD_LETTERS,
    Delivery,
    DeliveryNotice,
    EngineLimits,
    Message,
    NoticeEvent,
    QueuedMessage,
    QueueFull,
    new_delivery,
    new_message,
)

__all__ = ["DEQUEUED_EVENTS", "PRIORITIES", "SLACK", "MemoryQueue", "stored_form", "wants_notice"]

#: How many priority levels there are (0 to 9).
PRIORITIES: Final = 10
#: Tombstones a structure may hold beyond its live entries before it is rebuilt.
SLACK: Final = 64
#: The events that report a message leaving its queue (DCE "Dequeued").
DEQUEUED_EVENTS: Final = frozenset(
    {NoticeEvent.CONSUMED, NoticeEvent.EXPIRED, NoticeEvent.DISCARDED}
)


def wants_notice(message: Message, event: NoticeEvent) -> bool:
    """The rule in :class:`~gateway.engines.base.NoticeEvent`'s docstring."""
    if message.notify is None:
        return False
    if event is NoticeEvent.QUEUED:
        return NoticeEvent.QUEUED in message.notices
    return not message.notices.isdisjoint(DEQUEUED_EVENTS)


def stored_form(message: Message, limits: EngineLimits) -> Message:
    """``message`` as a queue stores it: with an expiration, ``default_ttl`` if none.

    Raises:
        ValueError: the priority is outside 0-9 (the broker validates it first).
    """
    if not 0 <= message.priority < PRIORITIES:
        raise ValueError(f"priority must be 0 to 9, got {message.priority}")
    if message.expiration is None:
        # new_message, not dataclasses.replace: a tenth of the cost, on every enqueue
        # that names no expiration (each crossing of a Course).
        return new_message(
            message.id,
            message.destination,
            message.payload,
            message.timestamp,
            message.timestamp + limits.default_ttl,
            message.priority,
            message.not_before,
            message.notify,
            message.notices,
            message.headers,
        )
    return message


class _State(enum.Enum):
    READY = enum.auto()
    DELAYED = enum.auto()
    LEASED = enum.auto()
    GONE = enum.auto()


_READY: Final = _State.READY
_DELAYED: Final = _State.DELAYED
_LEASED: Final = _State.LEASED
_GONE: Final = _State.GONE
_SEQ: Final = attrgetter("seq")


class _Entry:
    __slots__ = ("deadline", "deliveries", "expiration", "message", "receipt", "seq", "state")

    def __init__(self, message: Message, seq: int, expiration: float, state: _State) -> None:
        self.message = message
        #: Enqueue order, engine-wide: breaks heap ties and orders returning leases.
        self.seq = seq
        self.expiration = expiration
        self.state = state
        #: Deliveries so far (the current lease included).
        self.deliveries = 0
        #: The current lease's receipt and deadline, while LEASED.
        self.receipt = ""
        self.deadline = 0.0


class MemoryQueue:
    """One queue (or virtual queue) of the memory engine; see the module docstring.

    Args:
        name: the queue's name, as ``Delivery.queue`` and ``DeliveryNotice.queue``.
        limits: ``ack_timeout``, ``default_ttl``, ``max_deliveries`` and
            ``max_queue_depth`` apply here.
        max_dead_letters: dead letters kept at most (the oldest go first).
    """

    __slots__ = (
        "_dead",
        "_deadlines",
        "_delayed",
        "_delayed_live",
        "_expiry",
        "_leases",
        "_limits",
        "_max_dead",
        "_ready",
        "_ready_dead",
        "_ready_live",
        "depth",
        "name",
        "notices",
        "woken",
    )

    def __init__(
        self, name: str, limits: EngineLimits, *, max_dead_letters: int = MAX_DEAD_LETTERS
    ) -> None:
        self.name = name
        self._limits = limits
        #: Dead letters, oldest first: (message, deliveries); None until the first.
        self._dead: deque[tuple[Message, int]] | None = None
        self._max_dead = max_dead_letters
        #: Messages held: ready, delayed and leased.
        self.depth = 0
        #: Outbox: notices wanted by their publishers, oldest first.
        self.notices: list[DeliveryNotice] = []
        #: Outbox: how many messages became deliverable since the shell last looked.
        self.woken = 0
        self._ready: tuple[deque[_Entry], ...] = tuple(deque() for _ in range(PRIORITIES))
        self._ready_live = 0
        self._ready_dead = 0
        self._delayed: list[tuple[float, int, _Entry]] = []
        self._delayed_live = 0
        self._expiry: list[tuple[float, int, _Entry]] = []
        self._leases: dict[str, _Entry] = {}
        self._deadlines: list[tuple[float, str]] = []

    @property
    def full(self) -> bool:
        """Whether the queue holds ``max_queue_depth`` messages."""
        return self.depth >= self._limits.max_queue_depth

    @property
    def ready(self) -> int:
        """Messages deliverable now (as of the last ``advance``)."""
        return self._ready_live

    def put(self, message: Message, seq: int, now: float) -> None:
        """Store ``message`` (QUEUED notice if wanted).

        Args:
            message: as returned by :func:`stored_form`.
            seq: a number larger than any earlier message's, engine-wide.
            now: the time.

        Raises:
            QueueFull: the queue holds ``max_queue_depth`` messages.
        """
        if self.full:
            raise QueueFull(
                f"queue {self.name!r} holds {self.depth} messages, "
                f"the limit (max_queue_depth={self._limits.max_queue_depth})"
            )
        expiration = message.expiration
        assert expiration is not None, "put() takes stored_form(message)"
        if self._delayed:
            self._promote(now)  # due delayed messages were "received" before this one
        not_before = message.not_before
        delayed = not_before is not None and not_before > now
        entry = _Entry(message, seq, expiration, _DELAYED if delayed else _READY)
        heapq.heappush(self._expiry, (expiration, seq, entry))
        self.depth += 1
        if not_before is not None and delayed:
            heapq.heappush(self._delayed, (not_before, seq, entry))
            self._delayed_live += 1
        else:
            self._ready[message.priority].append(entry)
            self._ready_live += 1
            self.woken += 1
        if message.notify is not None:
            self._notice(message, NoticeEvent.QUEUED, now)

    def take(self, count: int, now: float, receipt: Callable[[], str]) -> list[Delivery]:
        """Lease up to ``count`` deliverable messages, highest priority first.

        Args:
            count: at most this many.
            now: the time; leases end at ``now + ack_timeout``.
            receipt: returns a new, never-used receipt per call.
        """
        self.advance(now)
        deliveries: list[Delivery] = []
        if not self._ready_live:
            return deliveries
        deadline = now + self._limits.ack_timeout
        for priority in range(PRIORITIES - 1, -1, -1):
            ready = self._ready[priority]
            while ready and len(deliveries) < count:
                entry = ready.popleft()
                if entry.state is not _READY:
                    self._ready_dead -= 1
                    continue
                self._ready_live -= 1
                if entry.expiration <= now:
                    self._remove(entry, NoticeEvent.EXPIRED, now)
                    continue
                entry.state = _LEASED
                entry.deliveries += 1
                entry.receipt = lease = receipt()
                entry.deadline = deadline
                self._leases[lease] = entry
                heapq.heappush(self._deadlines, (deadline, lease))
                deliveries.append(
                    new_delivery(entry.message, self.name, entry.deliveries, deadline, lease)
                )
            if len(deliveries) >= count or not self._ready_live:
                break
        return deliveries

    def ack(self, receipts: Iterable[str], now: float) -> int:
        """End live leases by removing their messages (CONSUMED); how many were live."""
        acknowledged = 0
        for receipt in receipts:
            entry = self._live_lease(receipt, now)
            if entry is not None:
                self._remove(entry, NoticeEvent.CONSUMED, now)
                acknowledged += 1
        if acknowledged:
            self._compact()
        return acknowledged

    def release(self, receipts: Iterable[str], now: float) -> int:
        """End live leases, making their messages deliverable again; how many were live."""
        released = [
            entry for receipt in receipts if (entry := self._live_lease(receipt, now)) is not None
        ]
        self._return(released, now)
        return len(released)

    def advance(self, now: float) -> None:
        """Apply what time did: leases past their deadline return, delayed
        messages fall due, expired messages leave (EXPIRED)."""
        deadlines = self._deadlines
        if deadlines and deadlines[0][0] <= now:
            ended: list[_Entry] = []
            while deadlines and deadlines[0][0] <= now:
                _, receipt = heapq.heappop(deadlines)
                entry = self._leases.pop(receipt, None)
                if entry is not None:
                    ended.append(entry)
            self._return(ended, now)
        self._promote(now)
        expiry = self._expiry
        while expiry and expiry[0][0] <= now:
            entry = heapq.heappop(expiry)[2]
            state = entry.state
            if state is _READY:
                self._ready_live -= 1
                self._ready_dead += 1
                self._remove(entry, NoticeEvent.EXPIRED, now)
                ready = self._ready[entry.message.priority]
                while ready and ready[0].state is not _READY:  # usually it was the head
                    ready.popleft()
                    self._ready_dead -= 1
            elif state is _DELAYED:
                self._delayed_live -= 1
                self._remove(entry, NoticeEvent.EXPIRED, now)
            # LEASED: the lease's end finds it expired. GONE: removed already.
        self._compact()

    def next_change(self) -> float | None:
        """When a message may next become deliverable (a delay or a lease ends)."""
        if self._delayed:
            if self._deadlines:
                return min(self._delayed[0][0], self._deadlines[0][0])
            return self._delayed[0][0]
        if self._deadlines:
            return self._deadlines[0][0]
        return None

    # -- inspection (the management API) -------------------------------------

    @property
    def dead_count(self) -> int:
        """Dead letters kept."""
        return 0 if self._dead is None else len(self._dead)

    def peek(self, count: int, now: float) -> list[QueuedMessage]:
        """Up to ``count`` ready or leased messages, highest priority first, then
        in the order they joined the queue; nothing changes but what time did.

        O(messages of the priorities it looks at): for an operator, not a hot path.
        """
        self.advance(now)
        leased = self._leased_by_priority()
        peeked: list[QueuedMessage] = []
        for priority in range(PRIORITIES - 1, -1, -1):
            room = count - len(peeked)
            if room <= 0:
                break
            live = (entry for entry in self._ready[priority] if entry.state is _READY)
            for entry in heapq.nsmallest(room, chain(live, leased.get(priority, ())), key=_SEQ):
                peeked.append(QueuedMessage(entry.message, entry.deliveries))
        return peeked

    def oldest(self, now: float) -> float | None:
        """The publication time of the oldest message at the head of a priority.

        A priority's head is its ready or leased message that joined first; a
        ready deque is in joining order (returning leases go back to its head),
        so its first live entry is its oldest ready one.
        """
        self.advance(now)
        heads: dict[int, _Entry] = {}
        for priority, ready in enumerate(self._ready):
            for entry in ready:
                if entry.state is _READY:
                    heads[priority] = entry
                    break
        for priority, entries in self._leased_by_priority().items():
            first = min(entries, key=_SEQ)
            head = heads.get(priority)
            if head is None or first.seq < head.seq:
                heads[priority] = first
        return min((entry.message.timestamp for entry in heads.values()), default=None)

    def dead_letters(self, count: int) -> list[QueuedMessage]:
        """Up to ``count`` dead letters, oldest first."""
        return [
            QueuedMessage(message, deliveries)
            for message, deliveries in islice(self._dead or (), count)
        ]

    def requeue_dead(self, count: int, seq: Callable[[], int], now: float) -> int:
        """Move up to ``count`` dead letters back, oldest first (see Engine); how many."""
        moved = 0
        dead = self._dead
        while dead and moved < count and not self.full:
            message, _ = dead.popleft()
            expiration = message.expiration
            if expiration is not None and expiration <= now:
                continue  # its DISCARDED notice went when it died
            self.put(message, seq(), now)
            moved += 1
        return moved

    def _leased_by_priority(self) -> dict[int, list[_Entry]]:
        leased: dict[int, list[_Entry]] = {}
        for entry in self._leases.values():
            leased.setdefault(entry.message.priority, []).append(entry)
        return leased

    def retained(self) -> int:
        """Entries held across every structure, tombstones included (for tests, metrics)."""
        return (
            sum(map(len, self._ready))
            + len(self._delayed)
            + len(self._expiry)
            + len(self._leases)
            + len(self._deadlines)
        )

    # -- internals ---------------------------------------------------------

    def _live_lease(self, receipt: str, now: float) -> _Entry | None:
        """Detach and return the entry leased under ``receipt``, if the lease is live.

        A lease past its deadline stays for ``advance`` to return: it ended.
        """
        entry = self._leases.get(receipt)
        if entry is None or entry.deadline <= now:
            return None
        del self._leases[receipt]
        return entry

    def _return(self, entries: Sequence[_Entry], now: float) -> None:
        """Entries whose lease ended unacknowledged: back to the head, or out."""
        if len(entries) > 1:  # the oldest must end up first
            entries = sorted(entries, key=lambda entry: entry.seq, reverse=True)
        buried: list[_Entry] = []
        for entry in entries:
            if entry.expiration <= now:
                self._remove(entry, NoticeEvent.EXPIRED, now)
            elif entry.deliveries >= self._limits.max_deliveries:
                self._remove(entry, NoticeEvent.DISCARDED, now)
                buried.append(entry)
            else:
                entry.state = _READY
                self._ready[entry.message.priority].appendleft(entry)
                self._ready_live += 1
                self.woken += 1
        # Dead letters in the order the messages joined the queue (entries ran newest first).
        if buried:
            if self._dead is None:
                self._dead = deque(maxlen=self._max_dead)
            self._dead.extend((entry.message, entry.deliveries) for entry in reversed(buried))

    def _promote(self, now: float) -> None:
        """Delayed messages whose ``not_before`` has come join their priority's tail."""
        delayed = self._delayed
        while delayed and delayed[0][0] <= now:
            entry = heapq.heappop(delayed)[2]
            if entry.state is not _DELAYED:  # expired while waiting
                continue
            self._delayed_live -= 1
            if entry.expiration <= now:
                self._remove(entry, NoticeEvent.EXPIRED, now)
                continue
            entry.state = _READY
            self._ready[entry.message.priority].append(entry)
            self._ready_live += 1
            self.woken += 1

    def _remove(self, entry: _Entry, event: NoticeEvent, now: float) -> None:
        """The message leaves the queue (the caller has unlinked it from its state's index)."""
        entry.state = _GONE
        self.depth -= 1
        self._notice(entry.message, event, now)

    def _notice(self, message: Message, event: NoticeEvent, now: float) -> None:
        if message.notify is not None and wants_notice(message, event):
            self.notices.append(DeliveryNotice(message.id, self.name, event, message.notify, now))

    def _compact(self) -> None:
        """Rebuild any structure whose tombstones outnumber its live entries (+ SLACK)."""
        if len(self._expiry) > 2 * self.depth + SLACK:
            self._expiry = [item for item in self._expiry if item[2].state is not _GONE]
            heapq.heapify(self._expiry)
        if len(self._deadlines) > 2 * len(self._leases) + SLACK:
            leases = self._leases
            self._deadlines = [item for item in self._deadlines if item[1] in leases]
            heapq.heapify(self._deadlines)
        if len(self._delayed) > 2 * self._delayed_live + SLACK:
            self._delayed = [item for item in self._delayed if item[2].state is _DELAYED]
            heapq.heapify(self._delayed)
        if self._ready_dead > self._ready_live + SLACK:
            for ready in self._ready:
                live = [entry for entry in ready if entry.state is _READY]
                ready.clear()
                ready.extend(live)
            self._ready_dead = 0
