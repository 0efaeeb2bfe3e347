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
    # A lease of 3 s: a broker's presence key lives half of it and is renewed every
    # sixth, so a renewal may come up to 1 s late. With 1.2 s, three planes in one
    # event loop on a loaded 2-core machine lost their presence between a write and
    # the lookup that checked it (CI, load 8-11).
    built = Bus(kind, url, lease=3.0)
    try:
        yield built
    finally:
        await built.close()
