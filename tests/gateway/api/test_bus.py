"""The management API sees the whole bus: two brokers on one private redis-server,
each listing both, with their Channels (from the plane's directory) and Tubes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis.asyncio

from gateway.app import create_app
from gateway.config.model import GatewayConfig
from gateway.plane.redis.plane import PREFIX
from tests.support import RedisServer, T, serve_app_async
from tests.support.gateway import Gateway, GatewayFactory

pytestmark = pytest.mark.anyio

LEASE = 1.5


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(tmp_path / "redis") as server:
        yield server


@pytest.fixture
async def bus(
    redis_server: RedisServer, make_gateway: GatewayFactory, tmp_path: Path
) -> AsyncIterator[tuple[Gateway, Gateway]]:
    def options(broker_id: str) -> dict[str, Any]:
        return {
            "broker_id": broker_id,
            "data_dir": tmp_path / broker_id,
            "engine": "redis",
            "redis_url": redis_server.url,
            "bus_lease": LEASE,
        }

    yield await make_gateway(**options("broker-a")), await make_gateway(**options("broker-b"))


async def until(
    redis_url: str, key: str, holds: Callable[[redis.asyncio.Redis], Awaitable[bool]]
) -> None:
    """Wait until ``holds(client)``, woken by keyspace notifications of ``PREFIX + key``
    (subscribed to before each look, so no change falls between a look and the wait)."""
    client = redis.asyncio.Redis.from_url(redis_url)
    pubsub = client.pubsub()
    try:
        await client.config_set("notify-keyspace-events", "KA")
        await pubsub.subscribe(f"__keyspace@0__:{PREFIX}{key}")
        with anyio.fail_after(5 * T):
            while not await holds(client):
                await pubsub.get_message(ignore_subscribe_messages=True, timeout=None)
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]  # unannotated upstream
        await client.aclose()


async def until_card(redis_url: str, broker_id: str, **wanted: int) -> None:
    """Wait until ``broker_id``'s card on the bus (rewritten every lease / 6) shows ``wanted``."""

    async def holds(client: redis.asyncio.Redis) -> bool:
        card = await client.get(f"{PREFIX}card:{broker_id}")
        return card is not None and all(json.loads(card)[k] == v for k, v in wanted.items())

    await until(redis_url, f"card:{broker_id}", holds)


async def until_channels(redis_url: str, broker_id: str, count: int) -> None:
    """Wait until the plane's directory lists ``count`` Channels at ``broker_id``."""

    async def holds(client: redis.asyncio.Redis) -> bool:
        return int(await client.scard(f"{PREFIX}chs:{broker_id}")) == count

    await until(redis_url, f"chs:{broker_id}", holds)


async def brokers(gateway: Gateway) -> dict[str, Any]:
    client = await gateway.http_client()
    response = await client.get(f"{gateway.server.http_url}/api/v1/broker")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_each_broker_lists_the_whole_bus(
    bus: tuple[Gateway, Gateway], redis_server: RedisServer
) -> None:
    a, b = bus
    await a.channel()
    await a.channel()
    await b.channel()
    await b.tube("billing", serves=("quote",))
    await until_card(redis_server.url, "broker-b", tubes=1)
    await until_channels(redis_server.url, "broker-b", 1)
    await until_channels(redis_server.url, "broker-a", 2)

    for gateway, first in ((a, "broker-a"), (b, "broker-b")):
        body = await brokers(gateway)
        assert body["scope"] == "bus"
        listed = {item["broker"]: item for item in body["brokers"]}
        assert body["brokers"][0]["broker"] == first  # the one answering comes first
        assert set(listed) == {"broker-a", "broker-b"}
        assert (listed["broker-a"]["channels"], listed["broker-a"]["tubes"]) == (2, 0)
        assert (listed["broker-b"]["channels"], listed["broker-b"]["tubes"]) == (1, 1)
        assert all(item["engine"] == "redis" and item["uptime_seconds"] >= 0
                   for item in body["brokers"])  # fmt: skip


async def test_a_stopped_broker_leaves_the_list(
    redis_server: RedisServer, make_gateway: GatewayFactory, tmp_path: Path
) -> None:
    options: dict[str, Any] = {"engine": "redis", "redis_url": redis_server.url, "bus_lease": LEASE}
    a = await make_gateway(broker_id="broker-a", data_dir=tmp_path / "a", **options)
    # broker-b is served here, so that the test stops it.
    config = GatewayConfig(broker_id="broker-b", data_dir=tmp_path / "b", **options)
    async with serve_app_async(create_app(config)):
        await until_card(redis_server.url, "broker-b", tubes=0)
        assert {item["broker"] for item in (await brokers(a))["brokers"]} == {
            "broker-a",
            "broker-b",
        }
    # A broker that stops leaves the bus (LEAVE drops its lease) and its card.
    assert [item["broker"] for item in (await brokers(a))["brokers"]] == ["broker-a"]


async def test_a_broker_without_a_readable_card_is_left_out(
    bus: tuple[Gateway, Gateway], redis_server: RedisServer
) -> None:
    a, _ = bus
    client = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        # Two live brokers as the directory knows them: one whose card is garbage,
        # one that joined a moment ago and has none yet; and a dead one.
        for broker_id in ("garbled", "new", "dead"):
            await client.sadd(f"{PREFIX}brokers", broker_id)
        for broker_id in ("garbled", "new"):
            await client.set(f"{PREFIX}alive:{broker_id}", "1")
        await client.set(f"{PREFIX}card:garbled", b"{not json")
        await client.set(f"{PREFIX}card:dead", b"{}")
        listed = {item["broker"] for item in (await brokers(a))["brokers"]}
        assert listed == {"broker-a", "broker-b"}
        await a.events.wait("census.bad_card", peer="garbled")
    finally:
        await client.aclose()


async def test_a_bus_out_of_reach_is_a_503_and_the_broker_keeps_serving(
    bus: tuple[Gateway, Gateway], redis_server: RedisServer
) -> None:
    a, _ = bus
    redis_server.stop()
    try:
        refused = await a.http_client()
        response = await refused.get(f"{a.server.http_url}/api/v1/broker")
        assert response.status_code == 503
        assert "unreachable" in response.json()["detail"]
        # The card keeper says so in the log rather than dying.
        await a.events.wait("census.write_failed")
        assert (await refused.get(f"{a.server.http_url}/healthz")).status_code == 200
    finally:
        redis_server.start()
