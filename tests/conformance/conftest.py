"""The ``engines`` fixture: every conformance test runs once per engine.

``memory`` builds :class:`gateway.engines.memory.engine.MemoryEngine`. ``redis`` builds
``gateway.engines.redis.engine.RedisEngine`` on one private ``redis-server`` per
session (:class:`tests.support.RedisServer`), emptied with FLUSHALL before each
test. A missing Redis engine or ``redis-server`` is an error, never a skip: a
suite that skips half its engines reports green while testing half the broker.

"Two brokers" are two engine instances on one Redis. The memory engine serves
exactly one broker, so for ``memory`` both names refer to the same instance:
what one broker publishes, enqueues or acknowledges, "the other" sees because
it *is* the other, which is the whole cloud in that deployment.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Final

import pytest
import redis

from gateway.engines.base import Engine, EngineLimits
from gateway.engines.memory.engine import MemoryEngine
from tests.support import RedisServer

#: Every engine the suite runs on; each test id ends in one of these.
ENGINES: Final = ("memory", "redis")

_DEFAULT_LIMITS: Final = EngineLimits()


#: Builds an engine: (limits, clock, broker_id) -> a new, unstarted engine.
Build = Callable[[EngineLimits, Callable[[], float], str], Engine]


class Engines:
    """Builds started engines of one kind, and closes them when the test ends."""

    def __init__(self, kind: str, build: Build) -> None:
        self.kind = kind
        self._build = build
        self._started: list[Engine] = []

    async def one(
        self,
        *,
        limits: EngineLimits = _DEFAULT_LIMITS,
        clock: Callable[[], float] = time.time,
        broker_id: str = "broker-a",
    ) -> Engine:
        """A started engine for the broker ``broker_id``."""
        engine = self._build(limits, clock, broker_id)
        await engine.start()
        self._started.append(engine)
        return engine

    async def two(
        self, *, limits: EngineLimits = _DEFAULT_LIMITS, clock: Callable[[], float] = time.time
    ) -> tuple[Engine, Engine]:
        """The engines of two brokers sharing the backing store (see the module docstring)."""
        first = await self.one(limits=limits, clock=clock, broker_id="broker-a")
        if self.kind == "memory":
            return first, first
        second = await self.one(limits=limits, clock=clock, broker_id="broker-b")
        return first, second

    async def close(self) -> None:
        while self._started:
            await self._started.pop().close()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One private redis-server for the session (started only if a redis test runs)."""
    directory: Path = tmp_path_factory.mktemp("conformance-redis")
    with RedisServer(directory) as server:
        yield server


@pytest.fixture(params=ENGINES)
def engine_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


@pytest.fixture
def build(engine_kind: str, request: pytest.FixtureRequest) -> Build:
    """How to build an engine of this kind; for ``redis``, on an emptied private Redis."""
    if engine_kind == "memory":
        return lambda limits, clock, broker_id: MemoryEngine(limits=limits, clock=clock)
    # Imported here: a missing module is an error in setup for the redis tests
    # only, and the memory tests still run.
    from gateway.engines.redis.engine import RedisEngine

    server: RedisServer = request.getfixturevalue("redis_server")
    client = redis.Redis.from_url(server.url)
    try:
        client.flushall()
    finally:
        client.close()
    return lambda limits, clock, broker_id: RedisEngine(
        server.url, broker_id=broker_id, limits=limits, clock=clock
    )


@pytest.fixture
async def engines(engine_kind: str, build: Build) -> AsyncIterator[Engines]:
    factory = Engines(engine_kind, build)
    try:
        yield factory
    finally:
        await factory.close()
