"""Helpers for tests of one bus across brokers: the plane's directory in Redis, User-Agents.

``until_in_directory`` waits on keyspace notifications, never a poll: a change
cannot fall between a look and the wait.
"""

from __future__ import annotations

import anyio
import redis.asyncio
from websockets.asyncio.client import ClientConnection, connect

from asbp import Command, decode
from gateway.plane.redis.plane import PREFIX
from tests.support.timing import T

__all__ = ["frame", "open_with_id", "until_in_directory"]


async def until_in_directory(redis_url: str, key: str, field: str, present: bool = True) -> None:
    """Wait until the plane's Redis holds (or no longer holds) ``field`` of ``key``."""
    client = redis.asyncio.Redis.from_url(redis_url)
    pubsub = client.pubsub()
    full_key = PREFIX + key
    try:
        await client.config_set("notify-keyspace-events", "KA")
        db = client.connection_pool.connection_kwargs.get("db", 0)
        await pubsub.subscribe(f"__keyspace@{db}__:{full_key}")
        with anyio.fail_after(5 * T):
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
