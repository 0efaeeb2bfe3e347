"""Flow control toward publishers: stop reading a publisher whose destinations fill up.

Theory of operation
-------------------
The router never waits for a reader (gateway/connections/outboxes.py): what a
publisher sends faster than its readers drain piles up in their outboxes, and
a reader whose outbox is full is cut off (2105). With one fast publisher and
readers that keep up but not quite as fast, that cut every reader. So the
excess is pushed back to where it comes from, the publisher:

* Every Channel's and Tube's outbox has a **high-water mark**, half its
  bounds (frames or bytes). An ``offer`` that leaves an outbox above it looks
  at :data:`PUBLISHER`, the :class:`FlowGate` of the connection whose Command is
  being routed right now (the intake sets it around each frame; a topic
  delivery sets it to the gate of the local publisher the message came from,
  see :class:`TopicOrigins`), and blocks that gate on the outbox.
* A blocked gate opens again once every outbox it waits on has drained below
  its **low-water mark** (a quarter of its bounds) or closed.
* The transports read no further from a connection whose gate is blocked: a
  WebSocket's next message is held before it is routed (so TCP pushes back on
  the sender once the server's own small buffers fill), and an HTTP POST gets
  ``429`` with ``Retry-After`` and fault 2105 without being routed.
* A reader that truly stops reading would now hold its publishers forever, so
  a gate blocked for ``stall_timeout`` seconds gives up on the outboxes that
  have not drained (``Outbox.stalled``) and opens: nobody is held back for
  such an outbox again until it drains, so it fills and its reader is cut off
  with 2105 as before flow control. Readers that keep up are never cut: their
  outboxes drain, and the publisher goes only as fast as they read.

A full outbox still cuts its reader at once, as before: publishers that are
not attributed (another broker's, through a shared engine) are not held back.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Final, Protocol

__all__ = ["MAX_PENDING", "ORIGINS_KEPT", "PUBLISHER", "Drains", "FlowGate", "TopicOrigins"]


class _Publisher(threading.local):
    """The gate of the publisher whose Command is being routed right now, if any.

    Routing never awaits, so this is set and restored around it synchronously.
    Per thread (tests run brokers in threads), and not a context variable: a
    task started while routing (a consumer, a sequencer) must not inherit it.
    """

    gate: FlowGate | None = None


#: Where the intake and topic delivery say who is publishing (see _Publisher).
PUBLISHER: Final = _Publisher()
#: Topic messages whose local publisher is remembered until delivery, at most
#: (per broker: see TopicOrigins).
ORIGINS_KEPT: Final = 65_536


class TopicOrigins:
    """Which local publisher each topic message in transit came from (one per broker).

    A topic message goes out through the engine and comes back to be delivered
    a few loop turns (a Redis round trip) later; until then it counts as
    pending on its publisher's gate (:attr:`FlowGate.pending`), so a publisher
    read on meanwhile does not overshoot its subscribers' outboxes. Owned by the
    broker's messaging (gateway.messaging.service) and handed to the dispatcher
    that remembers and the subscribers that deliver, as the narrow protocols
    gateway.types.RemembersOrigins and gateway.types.TakesOrigins: two brokers
    in one process keep separate books.

    Args:
        kept: messages remembered at most; past it the oldest is forgotten and
            counts as delivered (a message another broker's engine dropped, or
            one published to a topic nobody hears back from, never ties up a
            publisher or memory for good).
    """

    __slots__ = ("_gates", "_kept")

    def __init__(self, kept: int = ORIGINS_KEPT) -> None:
        self._kept = kept
        self._gates: OrderedDict[str, FlowGate] = OrderedDict()

    def __len__(self) -> int:
        return len(self._gates)

    def remember(self, message_id: str, gate: FlowGate) -> None:
        """Remember that ``gate``'s connection published ``message_id`` (a topic message)."""
        self._gates[message_id] = gate
        gate.pending += 1
        if len(self._gates) > self._kept:
            _, forgotten = self._gates.popitem(last=False)
            forgotten.delivered()

    def take(self, message_id: str) -> FlowGate | None:
        """The gate of the local publisher of ``message_id``, forgotten once asked."""
        gate = self._gates.pop(message_id, None)
        if gate is not None:
            gate.delivered()
        return gate


#: Topic messages a publisher may have routed but not yet delivered before it is
#: held back (see TopicOrigins).
MAX_PENDING: Final = 4


class Drains(Protocol):
    """What a gate waits on: an outbox (gateway.connections.outboxes)."""

    def on_relief(self, callback: Callable[[], object]) -> None: ...

    def stalled(self) -> None: ...


class FlowGate:
    """Whether one connection may be read from now (see the module doc)."""

    __slots__ = ("_opened", "_waiting", "own", "pending", "since")

    def __init__(self) -> None:
        #: The outboxes it waits on to drain; made on first need (most gates never
        #: block, and an empty set per idle Channel is a fifth of a KiB).
        self._waiting: set[Drains] | None = None
        self._opened: asyncio.Event | None = None
        #: Loop time when it last blocked on an outbox.
        self.since = 0.0
        #: Its topic messages routed and not yet delivered.
        self.pending = 0
        #: The connection's own outbox: filling it with answers to itself holds
        #: nothing back (a connection that does not read them is cut off when
        #: it is full, as before).
        self.own: object = None

    @property
    def blocked(self) -> bool:
        """Whether an outbox it filled has yet to drain."""
        return bool(self._waiting)

    @property
    def held(self) -> bool:
        """Whether the connection must not be read from now."""
        return bool(self._waiting) or self.pending > MAX_PENDING

    def block_on(self, outbox: Drains) -> None:
        """Stay blocked until ``outbox`` drains below its low-water mark."""
        waiting = self._waiting
        if waiting is None:
            waiting = self._waiting = set()
        if outbox is self.own or outbox in waiting:
            return
        if not waiting:
            self.since = asyncio.get_running_loop().time()
        waiting.add(outbox)
        outbox.on_relief(functools.partial(self._relieved, outbox))

    def delivered(self) -> None:
        """One of its topic messages was delivered (or forgotten)."""
        if self.pending:
            self.pending -= 1
        self._maybe_open()

    def _relieved(self, outbox: Drains) -> None:
        if self._waiting is not None:
            self._waiting.discard(outbox)
        self._maybe_open()

    def _maybe_open(self) -> None:
        if self._opened is not None and not self.held:
            self._opened.set()

    async def wait(self, stall_timeout: float) -> None:
        """Return once open; after ``stall_timeout`` s, give up on what did not drain."""
        loop = asyncio.get_running_loop()
        deadline = (self.since if self._waiting else loop.time()) + stall_timeout
        while self.held:
            if self._opened is None:
                self._opened = asyncio.Event()
            self._opened.clear()
            try:
                async with asyncio.timeout_at(deadline):
                    await self._opened.wait()
            except TimeoutError:
                self.give_up()

    def retry_after(self, stall_timeout: float) -> float:
        """Seconds until the gate gives up on what holds it, at most (``Retry-After``)."""
        return max(0.0, self.since + stall_timeout - asyncio.get_running_loop().time())

    def give_up(self) -> None:
        """Open, giving up on every outbox still waited on (see the module doc)."""
        waiting = self._waiting
        if waiting is not None:
            for outbox in list(waiting):
                outbox.stalled()
                waiting.discard(outbox)
        self.pending = 0
