"""A bus of two in-process brokers on one private redis-server, for the resume
tests (tests/gateway/routing/test_bus_resume*.py): the brokers, the SDK agent on
broker B, and the User-Agent's side of a resume (a plain ``websockets`` client).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest
import redis.asyncio
from websockets.asyncio.client import ClientConnection, connect

from agents import ApplicationAgent
from asbp import Command
from gateway.config.model import GatewayConfig
from gateway.plane.redis.plane import PREFIX
from tests.support.agents import make_agent, make_credentials
from tests.support.bus import BUS_LEASE, bus_broker, bus_config, flush, frame
from tests.support.bus import open_resumable as open_channel
from tests.support.redis import RedisServer
from tests.support.servers import RunningServer
from tests.support.timing import T

__all__ = [
    "LEASE",
    "broker",
    "bus",
    "config",
    "log_holds",
    "open_channel",
    "redis_server",
    "resume",
]

LEASE = BUS_LEASE


def config(tmp_path: Path, broker_id: str, redis_url: str) -> GatewayConfig:
    return bus_config(tmp_path, broker_id, redis_url, agent="news")


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("bus-resume-redis")) as server:
        yield server


def broker(
    tmp_path: Path, broker_id: str, redis_url: str
) -> contextlib.AbstractAsyncContextManager[RunningServer]:
    return bus_broker(tmp_path, broker_id, redis_url, agent="news")


@pytest.fixture
async def bus(
    tmp_path: Path, redis_server: RedisServer
) -> AsyncIterator[tuple[RunningServer, RunningServer, ApplicationAgent]]:
    redis_url = redis_server.url
    await flush(redis_url)
    credentials = make_credentials(tmp_path, "news")
    async with (
        broker(tmp_path, "broker-a", redis_url) as a,
        broker(tmp_path, "broker-b", redis_url) as b,
    ):
        agent = make_agent(credentials, [b.ws_url + "/tube"])
        async with agent:
            await agent.wait_registered(5 * T)
            yield a, b, agent


async def resume(
    url: str, channel_id: str, secret: str, received: int
) -> tuple[ClientConnection, Command]:
    """``asbp.resume`` at ``url``: the connection and the broker's first answer."""
    connection = await connect(url + "?resume=" + channel_id, compression=None, max_size=None)
    key = f",secret={secret}" if secret else ""  # none at all: the same as a wrong one
    await connection.send(f"c=asbp.resume,i={channel_id}{key},received={received};")
    return connection, await frame(connection)


async def log_holds(redis_url: str, channel_id: str, count: int) -> None:
    """Wait until the Channel's log exists and numbers ``count`` frames (keyspace
    notifications): a broker writes it through its batcher, never awaited."""
    client = redis.asyncio.Redis.from_url(redis_url)
    key = f"{PREFIX}log:{{{channel_id}}}"
    pubsub = client.pubsub()
    try:
        await client.config_set("notify-keyspace-events", "KA")
        await pubsub.subscribe(f"__keyspace@0__:{key}")
        with anyio.fail_after(5 * T):
            while not await client.exists(key) or int(await client.hget(key, "n") or 0) < count:
                await pubsub.get_message(ignore_subscribe_messages=True, timeout=None)
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]  # unannotated upstream
        await client.aclose()
