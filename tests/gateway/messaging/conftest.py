"""The ``engine``, ``redis`` and ``broker`` fixtures: each messaging test runs on every engine."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.gateway import Gateway, GatewayFactory
from tests.support.messaging import ENGINES, RedisServers, start_broker


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def redis(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[RedisServers]:
    # The session's cluster, asked for only by a test on the redis-cluster engine.
    servers = RedisServers(tmp_path, cluster=lambda: request.getfixturevalue("redis_cluster"))
    try:
        yield servers
    finally:
        await servers.stop()


@pytest.fixture
async def broker(redis: RedisServers, make_gateway: GatewayFactory, engine: str) -> Gateway:
    return await start_broker(make_gateway, engine, redis)
