"""The ``course.id`` values a receiving bus accepted: a second copy is dropped.

The sending bus resends every crossing it has no acknowledgement for, so one that
the receiver accepted but whose acknowledgement was lost (a link cut, a receiver
killed after accepting) arrives again. The receiver remembers each id for
``dedupe_window`` seconds and acknowledges a repeat without accepting it twice.

:class:`MemorySeen` is bounded in count (the oldest is forgotten first) and lost
with the process; :class:`RedisSeen` keeps one key per id with the window as its
expiry, so a restarted broker of the ``redis`` engine still knows them.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final, Protocol

import redis.asyncio

__all__ = ["MemorySeen", "RedisSeen", "Seen"]

#: Key prefix of :class:`RedisSeen`.
PREFIX: Final = "asbp:course:seen:"


class Seen(Protocol):
    """Which crossings a bus has accepted, per sending peer."""

    async def claim(self, peer: str, crossing_id: str) -> bool:
        """Note ``crossing_id`` from ``peer`` as accepted; False if it already was
        (within the window). One step, so two copies cannot both be claimed."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


class MemorySeen:
    """In this process, at most ``max_ids`` ids, each for ``window`` seconds."""

    def __init__(
        self,
        window: float,
        *,
        max_ids: int = 1_000_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._window = window
        self._max_ids = max_ids
        self._clock = clock
        self._ids: OrderedDict[tuple[str, str], float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._ids)

    async def claim(self, peer: str, crossing_id: str) -> bool:
        self._purge()
        key = (peer, crossing_id)
        if key in self._ids:
            return False
        self._ids[key] = self._clock() + self._window
        while len(self._ids) > self._max_ids:
            self._ids.popitem(last=False)
        return True

    def _purge(self) -> None:
        now = self._clock()
        ids = self._ids
        while ids:
            key, expires = next(iter(ids.items()))
            if expires > now:
                break
            del ids[key]

    async def close(self) -> None:
        self._ids.clear()


class RedisSeen:
    """In Redis: one key per id, expiring with the window; survives a restart."""

    def __init__(self, url: str, window: float) -> None:
        self._client: redis.asyncio.Redis = redis.asyncio.Redis.from_url(url)
        self._window_ms = max(1, int(window * 1000))

    async def claim(self, peer: str, crossing_id: str) -> bool:
        key = f"{PREFIX}{peer}:{crossing_id}"
        return bool(await self._client.set(key, b"1", px=self._window_ms, nx=True))

    async def close(self) -> None:
        await self._client.aclose()
