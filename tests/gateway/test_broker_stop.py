"""A broker's stop is bounded, even when the Redis it leans on is there but silent.

Each closing step (messaging, census, routing plane, engine, event log) may wait
on a Redis command timeout of its own; in all they get ``_STOP_BUDGET``, then a
last short try each, so a broker stops inside its server's and Kubernetes' grace
period instead of being killed half-way or lingering in the bus's directory.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from gateway.broker import _STOP_BUDGET, _STOP_LAST_TRY
from tests.support import RedisServer
from tests.support.gateway import GatewayFactory
from tests.support.timing import T

pytestmark = pytest.mark.anyio


async def test_a_bus_broker_stops_within_its_budget_when_redis_is_silent(
    make_gateway: GatewayFactory, tmp_path: Path
) -> None:
    server = RedisServer(tmp_path / "redis")
    await asyncio.to_thread(server.start)
    try:
        gateway = await make_gateway(engine="redis", redis_url=server.url, bus_lease=1.5)
        await gateway.channel()
        os.kill(server.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            # Started in the broker's loop; the server's own stop comes later and
            # finds the broker stopped (stop is idempotent).
            await gateway.call(lambda broker: asyncio.ensure_future(broker.stop()))
            bound = _STOP_BUDGET + 5 * _STOP_LAST_TRY
            await gateway.events.wait("broker.stop", timeout=bound + 10 * T)
            elapsed = time.monotonic() - started
            # Silent Redis: the census's card, the plane's leave and the engine's
            # last writes each wait on a command timeout; the budget cuts them.
            assert gateway.events.find("broker.stop_overran")
            assert elapsed < bound + 2 * T, elapsed
        finally:
            os.kill(server.pid, signal.SIGCONT)
    finally:
        await asyncio.to_thread(server.stop)
