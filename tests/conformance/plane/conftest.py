"""The ``planes`` fixture: every plane conformance test runs on ``memory`` and ``redis``.

``memory`` planes share one :class:`gateway.plane.memory.MemoryBus`; ``redis``
planes share the session's private ``redis-server`` (tests/conformance/conftest.py)
under a key prefix of the test's own. A missing Redis is an error, never a skip.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from gateway.plane.base import Envelope, Plane
from gateway.plane.memory import MemoryBus, MemoryPlane
from tests.support import RedisServer

PLANES = ("memory", "redis")
_prefixes = itertools.count()


@dataclass(eq=False)
class Broker:
    """One plane, joined, with what it received and which peers it lost."""

    plane: MemoryPlane | Plane
    inbound: asyncio.Queue[Envelope] = field(default_factory=asyncio.Queue)
    lost: asyncio.Queue[str] = field(default_factory=asyncio.Queue)

    async def abandon(self) -> None:
        """Stop renewing and reading without leaving: a crash."""
        await self.plane.abandon()  # type: ignore[union-attr]  # both implementations have it


class Bus:
    """Builds brokers' planes on one bus; closes them at the end."""

    def __init__(self, kind: str, redis_url: str | None, lease: float) -> None:
        self.kind = kind
        self._redis_url = redis_url
        self._lease = lease
        self._memory = MemoryBus()
        self._prefix = f"test{next(_prefixes)}:"
        self._brokers: list[Broker] = []

    async def join(self, broker_id: str, *, lease: float | None = None) -> Broker:
        lease = self._lease if lease is None else lease
        plane: MemoryPlane | Plane
        if self.kind == "memory":
            plane = MemoryPlane(broker_id, bus=self._memory, lease=lease)
        else:
            from gateway.plane.redis.plane import RedisPlane

            assert self._redis_url is not None
            plane = RedisPlane(
                self._redis_url, broker_id=broker_id, lease=lease, prefix=self._prefix
            )
        broker = Broker(plane)
        await plane.start(broker.inbound.put_nowait, broker.lost.put_nowait)
        self._brokers.append(broker)
        return broker

    async def close(self) -> None:
        for broker in self._brokers:
            await broker.plane.close()


@pytest.fixture(params=PLANES)
async def bus(request: pytest.FixtureRequest) -> AsyncIterator[Bus]:
    kind: str = request.param
    url = None
    if kind == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        url = server.url
    built = Bus(kind, url, lease=1.2)
    try:
        yield built
    finally:
        await built.close()
