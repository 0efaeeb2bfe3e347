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
from collections.abc import Callable, Sequence
from typing import Final, Protocol

from gateway.engines.redis.connection import Client, connect

__all__ = ["MemorySeen", "RedisSeen", "Seen"]

#: Key prefix of :class:`RedisSeen`.
PREFIX: Final = "asbp:course:seen:"
#: Seconds to connect to Redis, and to wait for a reply.
_TIMEOUT: Final = 5.0


class Seen(Protocol):
    """Which crossings a bus has accepted, per sending peer."""

    async def claim(self, peer: str, crossing_id: str) -> bool:
        """Note ``crossing_id`` from ``peer`` as accepted; False if it already was
        (within the window). One step, so two copies cannot both be claimed."""
        ...

    async def claim_many(self, peer: str, crossing_ids: Sequence[str]) -> list[bool]:
        """:meth:`claim` for each of ``crossing_ids``, in one step per batch (one
        Redis round trip); a True for each claimed now. An id twice in the batch is
        claimed by its first copy only."""
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
        return self._claim_many(peer, (crossing_id,))[0]

    async def claim_many(self, peer: str, crossing_ids: Sequence[str]) -> list[bool]:
        return self._claim_many(peer, crossing_ids)

    def _claim_many(self, peer: str, crossing_ids: Sequence[str]) -> list[bool]:
        self._purge()
        ids = self._ids
        expires = self._clock() + self._window
        claimed: list[bool] = []
        for crossing_id in crossing_ids:
            key = (peer, crossing_id)
            if key in ids:
                claimed.append(False)
                continue
            ids[key] = expires
            claimed.append(True)
        while len(ids) > self._max_ids:
            ids.popitem(last=False)
        return claimed

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
    """In Redis: one key per id, expiring with the window; survives a restart.

    One key per call, so a Redis Cluster (``redis+cluster://``) serves it as well
    as one Redis: the client comes from the one connection factory.
    """

    def __init__(self, url: str, window: float) -> None:
        self._client: Client = connect(url, connect_timeout=_TIMEOUT, command_timeout=_TIMEOUT)
        self._window_ms = max(1, int(window * 1000))

    async def claim(self, peer: str, crossing_id: str) -> bool:
        key = f"{PREFIX}{peer}:{crossing_id}"
        return bool(await self._client.set(key, b"1", px=self._window_ms, nx=True))

    async def claim_many(self, peer: str, crossing_ids: Sequence[str]) -> list[bool]:
        if len(crossing_ids) == 1:
            return [await self.claim(peer, crossing_ids[0])]
        # One SET NX per id, pipelined: one round trip for the batch. Not a
        # transaction: each SET is atomic on its own, which is all a claim needs, and
        # a pipeline also runs on a Redis Cluster, whose keys for one batch fall in
        # many slots. Redis runs them in order, so the first copy of a repeated id
        # wins.
        pipeline = self._client.pipeline(transaction=False)
        for crossing_id in crossing_ids:
            pipeline.set(f"{PREFIX}{peer}:{crossing_id}", b"1", px=self._window_ms, nx=True)
        return [bool(result) for result in await pipeline.execute()]

    async def close(self) -> None:
        await self._client.aclose()
