"""The ``engines`` fixture: every conformance test runs once per engine.

``memory`` builds :class:`gateway.engines.memory.engine.MemoryEngine`. ``redis`` builds
``gateway.engines.redis.engine.RedisEngine`` on one private ``redis-server`` per
session (:class:`tests.support.RedisServer`), emptied with FLUSHALL before each
test; ``redis-cluster`` on the session's private six-node Redis Cluster
(``redis+cluster://``), emptied on every primary. A missing Redis engine or
``redis-server`` is an error, never a skip: a suite that skips half its engines
reports green while testing half the broker.

"Two brokers" are two engine instances on one Redis. The memory engine serves
exactly one broker, so for ``memory`` both names refer to the same instance:
what one broker publishes, enqueues or acknowledges, "the other" sees because
it *is* the other, which is the whole cloud in that deployment.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis

from gateway.engines.memory.engine import MemoryEngine
from tests.support import RedisServer
from tests.support.engines import ENGINES, Build, Engines


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

    # The session's six-node cluster (tests/support/redis_cluster.py), emptied on
    # every primary: the engine's keys spread over its slots (layout.py).
    if engine_kind == "redis-cluster":
        cluster = request.getfixturevalue("redis_cluster")
        cluster.flush()
        url = cluster.url
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        client = redis.Redis.from_url(server.url)
        try:
            client.flushall()
        finally:
            client.close()
        url = server.url
    return lambda limits, clock, broker_id: RedisEngine(
        url, broker_id=broker_id, limits=limits, clock=clock
    )


@pytest.fixture
async def engines(engine_kind: str, build: Build) -> AsyncIterator[Engines]:
    factory = Engines(engine_kind, build)
    try:
        yield factory
    finally:
        await factory.close()
