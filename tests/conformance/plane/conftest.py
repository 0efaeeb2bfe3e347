"""The ``bus`` fixture: every plane conformance test runs on ``memory``, ``redis`` and
``redis-cluster``.

``memory`` planes share one :class:`gateway.plane.memory.MemoryBus`; ``redis``
planes share the session's private ``redis-server`` (tests/conformance/conftest.py)
under a key prefix of the test's own; ``redis-cluster`` planes the session's
private six-node Redis Cluster (tests/conftest.py) the same way. A missing Redis
is an error, never a skip.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support import RedisServer
from tests.support.planes import PLANES, Bus
from tests.support.redis_cluster import RedisCluster


@pytest.fixture(params=PLANES)
async def bus(request: pytest.FixtureRequest) -> AsyncIterator[Bus]:
    kind: str = request.param
    url = None
    if kind == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        url = server.url
    elif kind == "redis-cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        url = cluster.url
    built = Bus(kind, url, lease=1.2)
    try:
        yield built
    finally:
        await built.close()
