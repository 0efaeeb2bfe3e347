"""Waiting on keyspace notifications of a few keys, on one Redis or a Redis Cluster.

A cluster node notifies only its own clients of its own keys, so each key is
listened for at the node whose slot holds it (from the cluster's slot map), all
at once; on one Redis it is one subscription. The condition is checked after each
notification, and once before waiting (the flag is cleared before each look, so
a change between a look and the wait still wakes it): no polling, no sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import anyio
import redis.asyncio

from .bus import client_for
from .timing import T

__all__ = ["until_keys"]


async def until_keys(
    redis_url: str,
    keys: tuple[str, ...],
    holds: Callable[[], Awaitable[bool]],
    timeout: float = 10 * T,
) -> None:
    """Wait until ``holds()``, woken by keyspace notifications of any of ``keys``, each
    from the node that holds it (a cluster node notifies only of its own keys), for
    ``timeout`` seconds at most."""
    nodes: dict[tuple[str, int], list[str]] = {}
    locator = client_for(redis_url)
    try:
        for key in keys:
            if isinstance(locator, redis.asyncio.RedisCluster):
                await locator.initialize()
                node = locator.get_node_from_key(key)
                assert node is not None
                where = (node.host, int(node.port))
            else:
                kwargs = locator.connection_pool.connection_kwargs
                where = (str(kwargs["host"]), int(kwargs["port"]))
            nodes.setdefault(where, []).append(key)
    finally:
        await locator.aclose()
    changed = asyncio.Event()
    clients = [redis.asyncio.Redis(host=host, port=port) for host, port in nodes]
    pubsubs = [client.pubsub() for client in clients]

    async def listen(pubsub: redis.asyncio.client.PubSub) -> None:
        while True:
            if await pubsub.get_message(ignore_subscribe_messages=True, timeout=None):
                changed.set()

    listeners: list[asyncio.Task[None]] = []
    try:
        for client, pubsub, node_keys in zip(clients, pubsubs, nodes.values(), strict=True):
            await client.config_set("notify-keyspace-events", "KA")
            await pubsub.subscribe(*(f"__keyspace@0__:{key}" for key in node_keys))
            listeners.append(asyncio.create_task(listen(pubsub)))
        with anyio.fail_after(timeout):
            while True:
                changed.clear()  # before the look: a change after it wakes the wait
                if await holds():
                    return
                await changed.wait()
    finally:
        for task in listeners:
            task.cancel()
        await asyncio.gather(*listeners, return_exceptions=True)
        for pubsub in pubsubs:
            await pubsub.aclose()  # type: ignore[no-untyped-call]  # unannotated upstream
        for client in clients:
            await client.aclose()
