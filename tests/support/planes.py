"""Brokers' routing planes on one bus, for tests/conformance/plane/.

:class:`Bus` builds planes of one kind (``memory``: one shared
:class:`gateway.plane.memory.MemoryBus`; ``redis``: one Redis under a key prefix
of the test's own; ``redis-cluster``: the same on a Redis Cluster) and closes
them; :class:`Broker` is one plane with what it received and which peers it lost.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.plane.base import Envelope, LogRetention, Plane
from gateway.plane.memory import MemoryBus, MemoryPlane

__all__ = ["PLANES", "Broker", "Bus"]

PLANES = ("memory", "redis", "redis-cluster")
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
        #: Seconds added to the Channel logs' clocks: tests move time on with it.
        self.skew = 0.0
        self._memory = MemoryBus(log_clock=self.log_clock)
        self._prefix = f"test{next(_prefixes)}:"
        self._brokers: list[Broker] = []

    def log_clock(self) -> float:
        """The Channel logs' clock: the wall clock, moved on by ``skew``."""
        return time.time() + self.skew

    async def join(
        self,
        broker_id: str,
        *,
        lease: float | None = None,
        retention: LogRetention | None = None,
        inbound: Callable[[Envelope], None] | None = None,
    ) -> Broker:
        """A broker's plane on the bus; ``inbound`` is called with each envelope it
        gets, before it is queued (as a router acts on it, in the reader's turn)."""
        lease = self._lease if lease is None else lease
        plane: MemoryPlane | Plane
        if self.kind == "memory":
            plane = MemoryPlane(broker_id, bus=self._memory, lease=lease, retention=retention)
        else:
            from gateway.plane.redis.plane import RedisPlane

            assert self._redis_url is not None
            plane = RedisPlane(
                self._redis_url,
                broker_id=broker_id,
                lease=lease,
                prefix=self._prefix,
                retention=retention,
                clock=self.log_clock,
            )
        broker = Broker(plane)
        queued = broker.inbound.put_nowait

        def received(envelope: Envelope) -> None:
            if inbound is not None:
                inbound(envelope)
            queued(envelope)

        await plane.start(received, broker.lost.put_nowait)
        self._brokers.append(broker)
        return broker

    async def close(self) -> None:
        for broker in self._brokers:
            await broker.plane.close()
