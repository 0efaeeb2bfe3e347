"""The Channel logs of brokers in one process: a deque per Channel, shared through the bus.

:class:`LogStore` holds every Channel's log for one
:class:`gateway.plane.memory.MemoryBus`; each broker's plane reads and writes
it through a :class:`MemoryChannelLog`. The semantics are those of
:class:`gateway.plane.base.ChannelLog`, the same as the Redis log's
(tests/conformance/plane/ runs one suite on both): numbers from 1, retention
applied at every append and read (the oldest go first; the newest Command is
kept even when alone it passes the byte bound), a gap recorded when an
unacknowledged Command is dropped, idle expiry against the bus's clock, and
readers waiting on any broker woken by an append at any other.

Futures come back already settled: nothing here does I/O, and the caller's
code is the same as on Redis.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from typing import TypeVar

from gateway.plane.base import LogRead, LogRetention

__all__ = ["LogStore", "MemoryChannelLog"]

T = TypeVar("T")


class _Log:
    """One Channel's log."""

    __slots__ = (
        "acked",
        "aside",
        "barrier",
        "digest",
        "frames",
        "holder",
        "idle",
        "kept",
        "last",
        "lost",
        "seen",
        "size",
        "waiters",
    )

    def __init__(self, digest: bytes, idle: float, now: float) -> None:
        self.digest = digest
        self.idle = idle
        self.seen = now
        #: ``(number, appended at, frame)``, oldest first.
        self.frames: deque[tuple[int, float, bytes]] = deque()
        self.size = 0
        self.last = 0
        self.acked = 0
        self.lost = 0
        #: Readers parked on this log, at any broker.
        self.waiters: set[asyncio.Future[None]] = set()
        #: The broker holding a resumable WebSocket Channel's log ('' none).
        self.holder = ""
        #: The record a resumable Channel takes with it (ChannelLog.keep).
        self.kept = b""
        #: The broker that released the log, until it has handled what was handed
        #: to it before ('' none; ChannelLog.pending).
        self.barrier = ""
        #: Frames other brokers routed to it while the barrier was up: they follow
        #: what its broker passes on (gateway.plane.redis.release_barriers).
        self.aside: list[bytes] = []

    def wake(self) -> None:
        for waiter in self.waiters:
            if not waiter.done():
                waiter.set_result(None)
        self.waiters.clear()

    def acknowledge(self, through: int) -> None:
        through = min(through, self.last)
        if through <= self.acked:
            return
        frames = self.frames
        while frames and frames[0][0] <= through:
            self.size -= len(frames.popleft()[2])
        self.acked = through

    def trim(self, retention: LogRetention, now: float) -> None:
        frames = self.frames
        oldest = now - retention.max_age
        while frames:
            seq, appended, frame = frames[0]
            over = len(frames) > retention.max_frames or (
                len(frames) > 1 and self.size > retention.max_bytes
            )
            if not over and appended > oldest:
                break
            frames.popleft()
            self.size -= len(frame)
            if seq > self.acked:
                self.lost = seq


class LogStore:
    """Every Channel's log on one bus.

    Args:
        clock: seconds (the bus's clock: retention by age and idle expiry).
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._logs: dict[str, _Log] = {}

    def open(self, channel_id: str, digest: bytes, idle: float) -> None:
        previous = self._logs.pop(channel_id, None)
        if previous is not None:
            previous.wake()
        self._logs[channel_id] = _Log(digest, idle, self.clock())

    def live(self, channel_id: str) -> _Log | None:
        """The log, touched, or None (never opened, dropped, or idle too long: then dropped)."""
        log = self._logs.get(channel_id)
        if log is None:
            return None
        now = self.clock()
        if log.seen + log.idle <= now:
            self.drop(channel_id)
            return None
        log.seen = now
        return log

    def drop(self, channel_id: str) -> None:
        log = self._logs.pop(channel_id, None)
        if log is not None:
            log.wake()  # its readers find it gone


class MemoryChannelLog:
    """One broker's access to a :class:`LogStore`; see the module docstring.

    Args:
        store: the bus's logs.
        retention: what each log keeps at most.
        broker_id: the broker this access is for (the holder of what it holds).
    """

    def __init__(self, store: LogStore, retention: LogRetention, broker_id: str = "") -> None:
        self._store = store
        self._retention = retention
        self._broker_id = broker_id

    @property
    def retention(self) -> LogRetention:
        return self._retention

    def open(self, channel_id: str, *, digest: bytes, idle: float) -> asyncio.Future[None]:
        self._store.open(channel_id, digest, idle)
        return _done(None)

    def append(self, channel_id: str, frame: bytes) -> asyncio.Future[int]:
        log = self._store.live(channel_id)
        if log is None or log.holder:
            return _done(0)
        if log.barrier and log.barrier != self._broker_id:
            log.aside.append(frame)
            if len(log.aside) >= self._retention.max_frames:
                self._lift(log)
            return _done(log.last + len(log.aside))
        return _done(self._append(log, frame))

    def _lift(self, log: _Log) -> None:
        log.barrier = ""
        aside, log.aside = log.aside, []
        for frame in aside:
            self._append(log, frame)

    def _append(self, log: _Log, frame: bytes) -> int:
        log.last += 1
        log.frames.append((log.last, self._store.clock(), frame))
        log.size += len(frame)
        log.trim(self._retention, self._store.clock())
        log.wake()
        return log.last

    def hold(self, channel_id: str) -> asyncio.Future[tuple[str, int] | None]:
        log = self._store.live(channel_id)
        if log is None:
            return _done(None)
        previous, log.holder = log.holder, self._broker_id
        self._lift(log)
        return _done((previous, log.last))

    async def holder(self, channel_id: str) -> str:
        log = self._store.live(channel_id)
        return "" if log is None else log.holder

    async def pending(self, channel_id: str) -> str:
        log = self._store.live(channel_id)
        if log is None:
            return ""
        return log.holder or log.barrier

    def held_append(self, channel_id: str, frames: Sequence[bytes]) -> asyncio.Future[int]:
        log = self._store.live(channel_id)
        if log is None:
            return _done(0)
        if log.holder != self._broker_id:
            return _done(-1)
        last = log.last
        for frame in frames:
            last = self._append(log, frame)
        return _done(last)

    def release(self, channel_id: str) -> asyncio.Future[None]:
        log = self._store.live(channel_id)
        if log is not None and log.holder == self._broker_id:
            log.holder = ""
            # What other brokers handed this one (gateway.plane.memory: call_soon)
            # before now is handled before this callback runs, in the order handed.
            log.barrier = self._broker_id
            asyncio.get_running_loop().call_soon(self._settled, log)
        return _done(None)

    def _settled(self, log: _Log) -> None:
        if log.barrier == self._broker_id:
            self._lift(log)

    def keep(self, channel_id: str, record: bytes) -> asyncio.Future[None]:
        log = self._store.live(channel_id)
        if log is not None:
            log.kept = record
        return _done(None)

    async def kept(self, channel_id: str) -> bytes:
        log = self._store.live(channel_id)
        return b"" if log is None else log.kept

    def acknowledge(self, channel_id: str, through: int) -> asyncio.Future[None]:
        log = self._store.live(channel_id)
        if log is not None:
            log.acknowledge(through)
        return _done(None)

    def drop(self, channel_id: str) -> asyncio.Future[None]:
        self._store.drop(channel_id)
        return _done(None)

    async def digest(self, channel_id: str) -> bytes | None:
        log = self._store.live(channel_id)
        return None if log is None else log.digest

    async def read(self, channel_id: str, after: int, limit: int, wait: float) -> LogRead | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            log = self._store.live(channel_id)
            if log is None:
                return None
            log.acknowledge(after)
            log.trim(self._retention, self._store.clock())
            frames = tuple(
                (seq, frame) for seq, _, frame in _islice_after(log.frames, after, limit)
            )
            remaining = deadline - loop.time()
            if frames or remaining <= 0:
                return LogRead(frames, log.last, log.lost)
            waiter: asyncio.Future[None] = loop.create_future()
            log.waiters.add(waiter)
            try:
                async with asyncio.timeout(remaining):
                    await waiter
            except TimeoutError:
                return LogRead((), log.last, log.lost)
            finally:
                log.waiters.discard(waiter)
                waiter.cancel()


def _islice_after(
    frames: deque[tuple[int, float, bytes]], after: int, limit: int
) -> list[tuple[int, float, bytes]]:
    out: list[tuple[int, float, bytes]] = []
    for entry in frames:
        if entry[0] > after:
            out.append(entry)
            if len(out) >= limit:
                break
    return out


def _done(result: T) -> asyncio.Future[T]:
    future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    future.set_result(result)
    return future
