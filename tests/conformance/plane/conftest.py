"""The ``planes`` fixture: every plane conformance test runs on ``memory`` and ``redis``.

``memory`` planes share one :class:`gateway.plane.memory.MemoryBus`; ``redis``
planes share the session's private ``redis-server`` (tests/conformance/conftest.py)
under a key prefix of the test's own. A missing Redis is an error, never a skip.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support import RedisServer
from tests.support.planes import PLANES, Bus


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
