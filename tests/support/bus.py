"""Helpers for tests of one bus across brokers: the plane's directory in Redis (one
Redis or a Redis Cluster), User-Agents.

``until_in_directory`` waits on keyspace notifications, never a poll: a change
cannot fall between a look and the wait.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import redis.asyncio
from websockets.asyncio.client import ClientConnection, connect

from asbp import Command, decode
from gateway.app import create_app
from gateway.config.model import GatewayConfig
from gateway.engines.redis.connection import Client
from gateway.engines.redis.connection import connect as connect_redis
from gateway.plane.redis.keys import directory_prefix
from gateway.plane.redis.plane import PREFIX
from tests.support.servers import RunningServer, serve_app_async
from tests.support.timing import T

__all__ = [
    "DIRECTORY",
    "client_for",
    "flush",
    "frame",
    "holder_of",
    "lease_gone",
    "open_with_id",
    "until",
    "until_in_directory",
]

#: Where the plane's directory keys are (their hash tag included).
DIRECTORY = directory_prefix(PREFIX)


def client_for(redis_url: str) -> Client:
    """A client for one Redis or a Redis Cluster (``redis+cluster://``)."""
    # 5 s to connect: a test process driving a thousand Channels stalls its loop for
    # a second or more under load, and a loopback connect then seemed to time out.
    return connect_redis(redis_url, connect_timeout=5 * T, command_timeout=5 * T)


async def flush(redis_url: str) -> None:
    """Every key gone, on each primary of a cluster."""
    client = client_for(redis_url)
    try:
        if isinstance(client, redis.asyncio.RedisCluster):
            await client.flushall(target_nodes=redis.asyncio.RedisCluster.PRIMARIES)
        else:
            await client.flushall()
    finally:
        await client.aclose()


async def until_in_directory(
    redis_url: str, key: str, field: str, present: bool = True, timeout: float = 5 * T
) -> None:
    """Wait until the plane's Redis holds (or no longer holds) ``field`` of ``key``,
    ``timeout`` seconds at most."""
    client = client_for(redis_url)
    full_key = DIRECTORY + key
    pubsub: Any
    if isinstance(client, redis.asyncio.RedisCluster):
        # A cluster node notifies only its own clients of its own keys.
        await client.initialize()
        node = client.get_node_from_key(full_key)
        assert node is not None
        await client.config_set("notify-keyspace-events", "KA", target_nodes=node)
        pubsub = client.pubsub(node=node)
        db = 0
    else:
        await client.config_set("notify-keyspace-events", "KA")
        pubsub = client.pubsub()
        db = client.connection_pool.connection_kwargs.get("db", 0)
    try:
        await pubsub.subscribe(f"__keyspace@{db}__:{full_key}")
        with anyio.fail_after(timeout):
            while bool(await client.hexists(full_key, field)) != present:
                await pubsub.get_message(ignore_subscribe_messages=True, timeout=None)
    finally:
        await pubsub.aclose()
        await client.aclose()


async def frame(connection: ClientConnection, timeout: float = 5 * T) -> Command:
    """The next Command on a User-Agent's WebSocket."""
    with anyio.fail_after(timeout):
        message = await connection.recv()
    return decode(message.encode() if isinstance(message, str) else message)


async def open_with_id(url: str) -> tuple[ClientConnection, str]:
    """A User-Agent's WebSocket and its ``i``, from the ``asbp.channel`` greeting."""
    connection = await connect(url, compression=None, max_size=None)
    greeting = await frame(connection)
    assert greeting.name == "asbp.channel", greeting
    identifier = greeting.get("i")
    assert isinstance(identifier, str)
    return connection, identifier


async def until(
    redis_url: str, key: str, holds: Callable[[redis.asyncio.Redis], Awaitable[bool]]
) -> None:
    """Wait until ``holds(client)``, woken by keyspace notifications of ``DIRECTORY + key``
    (:func:`until_redis`, five ``T`` at most)."""
    await until_redis(redis_url, DIRECTORY + key, holds, timeout=5 * T)


async def open_resumable(url: str) -> tuple[ClientConnection, str, str]:
    """A WebSocket Channel at ``url``: the connection, its ``i`` and its secret."""
    connection = await connect(url, compression=None, max_size=None)
    greeting = await frame(connection)
    assert greeting.name == "asbp.channel", greeting
    return connection, str(greeting.get("i")), str(greeting.get("secret"))


async def resume_at(
    url: str, channel_id: str, secret: str, received: int
) -> tuple[ClientConnection, Command]:
    """``asbp.resume`` at ``url`` (``/asbp``): the connection and the broker's first answer."""
    connection = await connect(url + "?resume=" + channel_id, compression=None, max_size=None)
    await connection.send(f"c=asbp.resume,i={channel_id},secret={secret},received={received};")
    return connection, await frame(connection)


async def kept_holds(
    redis_url: str, channel_id: str, needle: bytes, *, present: bool = True
) -> None:
    """Wait until the record kept beside the Channel's log (its field ``k``) holds
    ``needle`` (or, ``present`` false, no longer does; keyspace notifications): a
    broker writes it through its batcher, never awaited."""
    client = redis.asyncio.Redis.from_url(redis_url)
    key = f"{PREFIX}log:{{{channel_id}}}"
    pubsub = client.pubsub()
    try:
        await client.config_set("notify-keyspace-events", "KA")
        await pubsub.subscribe(f"__keyspace@0__:{key}")
        with anyio.fail_after(5 * T):
            while (needle in (await client.hget(key, "k") or b"")) is not present:
                await pubsub.get_message(ignore_subscribe_messages=True, timeout=None)
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]  # unannotated upstream
        await client.aclose()


async def holder_of(redis_url: str, channel_id: str) -> str:
    """The broker holding the Channel's log (its field ``w``)."""
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        holder = await client.hget(f"{PREFIX}log:{{{channel_id}}}", "w")
    finally:
        await client.aclose()
    assert isinstance(holder, bytes)
    return holder.decode()


async def lease_gone(client: redis.asyncio.Redis, broker_id: str) -> bool:
    """Whether ``broker_id``'s lease has run out (for :func:`until`)."""
    return not await client.exists(f"{DIRECTORY}alive:{broker_id}")


async def until_redis(
    redis_url: str,
    key: str,
    holds: Callable[[redis.asyncio.Redis], Awaitable[bool]],
    timeout: float = 10 * T,
) -> None:
    """Wait until ``holds(client)``, woken by keyspace notifications of ``key`` (a
    pattern: ``*`` for any key), subscribed to before each look (so no change falls
    between a look and the wait), ``timeout`` seconds at most."""
    client = redis.asyncio.Redis.from_url(redis_url)
    pubsub = client.pubsub()
    try:
        await client.config_set("notify-keyspace-events", "KA")
        await pubsub.psubscribe(f"__keyspace@0__:{key}")
        with anyio.fail_after(timeout):
            while not await holds(client):
                await pubsub.get_message(ignore_subscribe_messages=True, timeout=None)
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]  # unannotated upstream
        await client.aclose()


#: The bus lease of the in-process brokers below: short, so that a broker a test
#: kills drops out of the directory soon.
BUS_LEASE = 1.5


def bus_config(tmp_path: Path, broker_id: str, redis_url: str, *, agent: str) -> GatewayConfig:
    """A broker of a bus on ``redis_url`` with its data under ``tmp_path/broker_id``,
    plain-text Tubes on loopback, and the agent ``agent`` (its key ``<agent>.pem`` in
    ``tmp_path``, as :func:`tests.support.agents.make_credentials` writes it)."""
    directory = tmp_path / broker_id
    directory.mkdir()
    return GatewayConfig(
        data_dir=directory,
        broker_id=broker_id,
        engine="redis",
        redis_url=redis_url,
        bus_lease=BUS_LEASE,
        insecure_dev_tubes=True,
        agents={agent: {"public_key": f"{agent}.pem"}},
        agents_base_dir=tmp_path,
    )


@contextlib.asynccontextmanager
async def bus_broker(
    tmp_path: Path, broker_id: str, redis_url: str, *, agent: str
) -> AsyncIterator[RunningServer]:
    """:func:`bus_config`'s broker, served in this process on a free port."""
    config = bus_config(tmp_path, broker_id, redis_url, agent=agent)
    async with serve_app_async(create_app(config)) as running:
        yield running
