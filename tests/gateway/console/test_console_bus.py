"""/console on a bus of two brokers on one private redis-server, in headless
Chromium: one broker's agents table lists the other broker's agents too, each
row naming its broker."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio

from tests.support import RedisServer, T
from tests.support.bus import DIRECTORY as PREFIX
from tests.support.bus import until
from tests.support.gateway import GatewayFactory

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "console_bus.mjs"

pytestmark = pytest.mark.anyio


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    # A fixture, so that it outlives the brokers (stopped after the test).
    with RedisServer(tmp_path / "redis") as server:
        yield server


async def test_the_console_shows_the_other_brokers_agents(
    redis_server: RedisServer, make_gateway: GatewayFactory, tmp_path: Path
) -> None:
    a, b = [
        await make_gateway(
            broker_id=broker_id,
            data_dir=tmp_path / broker_id,
            engine="redis",
            redis_url=redis_server.url,
            bus_lease=1.5,
        )
        for broker_id in ("broker-a", "broker-b")
    ]
    await a.tube("billing", serves=("quote",))
    await b.tube("search")

    async def carded(client: redis.asyncio.Redis) -> bool:
        card = await client.get(f"{PREFIX}card:broker-b")
        return card is not None and json.loads(card)["agents"] == {"search": 1}

    await until(redis_server.url, "card:broker-b", carded)
    process = await asyncio.create_subprocess_exec(
        "node",
        str(SCRIPT),
        a.server.http_url,
        "broker-b",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=HERE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60 * T)
    assert process.returncode == 0, err.decode()
    result = json.loads(out)
    assert result["headers"][:3] == ["Agent", "Broker", "Tube"]
    by_agent = {row[0]: row for row in result["rows"]}
    assert by_agent["billing"][1:2] + by_agent["billing"][3:4] == ["broker-a", "quote"]
    assert by_agent["search"][1:3] == ["broker-b", "(1 Tubes)"]
