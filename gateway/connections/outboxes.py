"""Outboxes: the one path from the router to a Channel's or Tube's reader.

The router never awaits a reader. It calls ``Outbox.offer(frame)``, which
queues an encoded Command and returns at once; a transport drains the
outbox at the reader's pace. That keeps one slow reader from slowing anyone
else, and lets a fan-out to a thousand Channels cost a thousand appends
rather than a thousand awaited sends.

Every outbox is bounded in frames and in bytes. An ``offer`` that would pass
either bound fails: the reader has fallen behind, and the caller closes it
with fault 2105 (slow consumer). Nothing is dropped silently. ``room()`` says
how much more an outbox takes now, for callers that can size what they send
(a queue poll takes no more messages than that: gateway.messaging).
``when_drained(callback)`` asks for one call once frames next leave the
outbox, so such a caller can wait for room instead of looking again and again
(a queue consumer holding back a message that does not fit yet). It costs
the drain one attribute test while nobody asks.

Two implementations, one interface:

* ``StreamOutbox`` feeds a connection that stays open (a WebSocket): its
  writer task takes whole batches with ``take()`` and sends them in order;
  while it waits, frames go straight to the transport without waking it
  (``send_directly``).
* ``Mailbox`` feeds stateless HTTP long-polls: each frame gets a sequence
  number, and a frame stays until a later poll acknowledges it (``after``),
  so a response lost on the way costs a repeat, never a Command. A later
  issue moves mailboxes into Redis so that any broker can answer any poll;
  the router sees only ``Outbox``.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
from collections import deque
from collections.abc import Callable
from itertools import islice
from typing import Generic, Protocol, TypeVar

from gateway.connections.flow import PUBLISHER

__all__ = ["Mailbox", "Outbox", "StreamOutbox"]


class Outbox(Protocol):
    """Where the router leaves encoded Commands for one reader."""

    @property
    def closed(self) -> bool:
        """Whether the outbox takes no more frames."""
        ...

    def offer(self, frame: bytes) -> bool:
        """Queue ``frame``; False if the outbox is closed or full."""
        ...

    @property
    def queued_bytes(self) -> int:
        """Bytes waiting for the reader (the metrics' outbox gauge)."""
        ...

    def room(self) -> tuple[int, int]:
        """How many more frames, and bytes, ``offer`` takes now (0, 0 once closed).

        An empty outbox takes one frame of any size, so its bytes are unbounded
        for that first frame: ``sys.maxsize``.
        """
        ...

    def when_drained(self, callback: Callable[[], object] | None) -> None:
        """Call ``callback`` once, the next time frames leave the outbox or it closes.

        One callback at a time: a later one (or None) replaces the earlier.
        """
        ...

    def close(self) -> None:
        """Take no more frames; what is queued is still delivered."""
        ...

    def abort(self) -> None:
        """Take no more frames and drop what is queued (the reader is gone)."""
        ...

    def on_relief(self, callback: Callable[[], object]) -> None:
        """Call ``callback()`` once the outbox drains below its low-water mark or closes.

        Any number at a time (gateway.connections.flow: each blocked publisher).
        """
        ...

    def stalled(self) -> None:
        """A publisher waited too long for this outbox to drain: hold nobody back for
        it until it does (it fills and its reader is cut off, as without flow control)."""
        ...


#: What an outbox queues per frame: the frame, or (for a Mailbox) its number and it.
F = TypeVar("F")


class _Bounded(Generic[F]):
    """What both outboxes share: the bounds, ``room()`` and the drain hook."""

    __slots__ = (
        "_bytes",
        "_closed",
        "_drained",
        "_frames",
        "_given_up",
        "_high_bytes",
        "_high_frames",
        "_low_bytes",
        "_low_frames",
        "_max_bytes",
        "_max_frames",
        "_relief",
    )

    def __init__(self, max_frames: int, max_bytes: int) -> None:
        self._frames: deque[F] = deque()
        self._bytes = 0
        self._max_frames = max_frames
        self._max_bytes = max_bytes
        self._closed = False
        self._drained: Callable[[], object] | None = None
        # Flow control (gateway.connections.flow): above half the bounds, the
        # publisher being routed is held back until they are under a quarter.
        self._high_frames = max_frames // 2
        self._high_bytes = max_bytes // 2
        self._low_frames = max_frames // 4
        self._low_bytes = max_bytes // 4
        self._relief: list[Callable[[], object]] | None = None
        # A publisher waited too long for this outbox to drain: until it does,
        # publishers are not held back for it (it fills, and is cut, as before).
        self._given_up = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._frames)

    def room(self) -> tuple[int, int]:
        if self._closed:
            return 0, 0
        if not self._frames:
            return self._max_frames, sys.maxsize
        return (
            max(0, self._max_frames - len(self._frames)),
            max(0, self._max_bytes - self._bytes),
        )

    def when_drained(self, callback: Callable[[], object] | None) -> None:
        self._drained = callback

    def _emptied(self) -> None:
        drained = self._drained
        if drained is not None:
            self._drained = None
            drained()
        if (self._relief is not None or self._given_up) and (
            self._closed
            or (len(self._frames) <= self._low_frames and self._bytes <= self._low_bytes)
        ):
            self._given_up = False
            relief, self._relief = self._relief or [], None
            for callback in relief:
                callback()

    def _congested(self) -> None:
        """Above the high-water mark: hold back the publisher being routed, if any."""
        gate = PUBLISHER.gate
        if gate is not None and not self._given_up:
            gate.block_on(self)

    def on_relief(self, callback: Callable[[], object]) -> None:
        if self._closed:
            callback()
            return
        if self._relief is None:
            self._relief = []
        self._relief.append(callback)

    def stalled(self) -> None:
        self._given_up = True


class StreamOutbox(_Bounded[bytes]):
    """A bounded FIFO of frames for one connection's writer task.

    Frames offered while the writer waits for them can be sent without waking
    it: see :meth:`send_directly`.

    Args:
        max_frames: frames queued at most.
        max_bytes: bytes queued at most (a single larger frame is still
            taken when the outbox is empty, so no frame is undeliverable).
    """

    __slots__ = (
        "_context",
        "_direct",
        "_flushing",
        "_loop",
        "_waiter",
    )

    def __init__(self, max_frames: int, max_bytes: int) -> None:
        super().__init__(max_frames, max_bytes)
        # The writer's wait in take(), while it waits: it is sending nothing then.
        self._waiter: asyncio.Future[None] | None = None
        self._direct: Callable[[bytes], bool] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._context: contextvars.Context | None = None
        # A _flush is scheduled.
        self._flushing = False

    def send_directly(self, write: Callable[[bytes], bool] | None) -> None:
        """Let ``write(frame)`` send frames while the writer waits (None: stop).

        Called by the writer task. While it waits in :meth:`take`, a frame
        offered does not wake it: the outbox schedules one callback (in the
        writer's context) that hands every frame queued by then to ``write``,
        in order. ``write`` sends a frame without waiting (True) or declines
        (False): then the writer wakes and sends that frame and the rest
        itself, as without ``write``. Frames offered while the writer is
        awake are always left to it, so no frame overtakes another.

        A fan-out to a thousand readers then costs a thousand plain callbacks
        instead of a thousand task wake-ups; and frames offered in the same
        turn of the event loop still go out together, as they would with a
        batch taken by the writer.
        """
        if write is None:
            self._direct = self._loop = self._context = None
        else:
            self._direct = write
            self._loop = asyncio.get_running_loop()
            self._context = contextvars.copy_context()

    def offer(self, frame: bytes) -> bool:
        if self._closed:
            return False
        frames = self._frames
        size = self._bytes + len(frame)
        if frames and (len(frames) >= self._max_frames or size > self._max_bytes):
            return False
        frames.append(frame)
        self._bytes = size
        if size > self._high_bytes or len(frames) > self._high_frames:
            self._congested()
        if self._waiter is not None:
            loop = self._loop
            if loop is None:
                self._wake()
            elif not self._flushing:
                self._flushing = True
                loop.call_soon(self._flush, context=self._context)
        return True

    def offer_delivery(self, frame: bytes) -> bool:
        """Offer a queue delivery (an ``asbp.notification`` carrying a ``receipt``).

        The same as :meth:`offer` here; a resumable Channel's outbox
        (gateway.connections.resume.HeldOutbox) leaves it out of the Channel's
        log, because the queue is its log (docs/protocol.md, "Resuming a Channel").
        """
        return self.offer(frame)

    def _flush(self) -> None:
        """Hand what is queued to ``write``, unless the writer is awake by now."""
        self._flushing = False
        write = self._direct
        if write is None or self._waiter is None:
            return  # the writer was woken (the outbox closed) or is gone
        frames = self._frames
        while frames:
            if not write(frames[0]):
                self._wake()
                break
            self._bytes -= len(frames.popleft())
        if self._drained is not None or self._relief is not None or self._given_up:
            self._emptied()

    def close(self) -> None:
        self._closed = True
        self._wake()
        if self._drained is not None or self._relief is not None or self._given_up:
            self._emptied()

    def abort(self) -> None:
        self._frames.clear()
        self._bytes = 0
        self.close()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def take(self) -> list[bytes]:
        """Wait for frames and take all of them; [] once closed and empty."""
        while not self._frames:
            if self._closed:
                return []
            waiter = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                if self._waiter is waiter:  # cancelled: nobody waits any more
                    self._waiter = None
        batch = list(self._frames)
        self._frames.clear()
        self._bytes = 0
        if self._drained is not None or self._relief is not None or self._given_up:
            self._emptied()
        return batch


class Mailbox(_Bounded[tuple[int, bytes]]):
    """A bounded, acknowledged mailbox for a stateless HTTP Channel.

    Frames are numbered from 1. ``poll(after=n)`` first forgets every frame
    numbered ``n`` or less (the client has them), then returns what is left,
    waiting up to ``timeout`` for something to arrive.
    """

    __slots__ = (
        "_next_seq",
        "_waiter",
    )

    def __init__(self, max_frames: int, max_bytes: int) -> None:
        super().__init__(max_frames, max_bytes)
        self._next_seq = 1
        # The parked poll, if any: resolved True when frames arrive or the
        # mailbox closes, False when a newer poll takes its place.
        self._waiter: asyncio.Future[bool] | None = None

    @property
    def last_seq(self) -> int:
        """The number of the newest frame ever queued (0 if none)."""
        return self._next_seq - 1

    def _wake(self, result: bool) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(result)

    def offer(self, frame: bytes) -> bool:
        if self._closed:
            return False
        frames = self._frames
        size = self._bytes + len(frame)
        if frames and (len(frames) >= self._max_frames or size > self._max_bytes):
            return False
        frames.append((self._next_seq, frame))
        self._next_seq += 1
        self._bytes = size
        if size > self._high_bytes or len(frames) > self._high_frames:
            self._congested()
        self._wake(True)
        return True

    def close(self) -> None:
        self._closed = True
        self._wake(True)
        self._emptied()

    def abort(self) -> None:
        self._frames.clear()
        self._bytes = 0
        self.close()

    def acknowledge(self, after: int) -> None:
        """Forget every frame numbered ``after`` or less."""
        frames = self._frames
        if frames and frames[0][0] <= after:
            while frames and frames[0][0] <= after:
                self._bytes -= len(frames.popleft()[1])
            self._emptied()

    async def poll(self, after: int, timeout: float, limit: int) -> list[tuple[int, bytes]]:
        """Acknowledge up to ``after``, then return up to ``limit`` frames.

        Waits up to ``timeout`` seconds when nothing is waiting. A newer poll
        on the same mailbox ends an older one early with an empty list, so a
        client that retries never has two requests parked on the broker.
        """
        self.acknowledge(after)
        if not self._frames and not self._closed:
            self._wake(False)
            waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            try:
                async with asyncio.timeout(timeout):
                    if not await waiter:
                        return []
            except TimeoutError:
                return []
            finally:
                if self._waiter is waiter:
                    self._waiter = None
        return list(islice(self._frames, limit))
