"""One place that turns ``redis_url`` into a client: one Redis, or a Redis Cluster.

The engine, the routing plane and the event log all connect through
:func:`connect`, so they agree on what a URL means:

- ``redis://host:port/db``, ``rediss://`` (TLS), ``unix://``: one Redis (or one
  behind Sentinel's address), as redis-py reads the URL;
- ``redis+cluster://[user:password@]host:port,host:port,...`` and
  ``rediss+cluster://`` (TLS): a Redis Cluster. The hosts are seeds: the client
  asks any of them for the slot map and follows it (and its changes) from
  there, so naming one node is enough and naming more survives one being down.
  A cluster has only database 0, so a path (``/0``) may be given but no other.

A cluster client is a :class:`redis.asyncio.cluster.RedisCluster`; the raw
pipelines of :class:`~gateway.engines.redis.batch.Batcher` become
:class:`~gateway.engines.redis.cluster.ClusterBatcher`, which sends each command
to the primary serving its slot (see there). :func:`batcher` and
:func:`node_connection` hide the difference from callers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.engines.redis.batch import Batcher
from gateway.engines.redis.cluster_url import is_cluster_url, parse_cluster_url
from gateway.engines.redis.scripts import Script

__all__ = ["Client", "batcher", "broadcast_connection", "connect", "node_connection", "refresh"]

#: What :func:`connect` returns.
Client: TypeAlias = Redis | RedisCluster


def connect(url: str, *, connect_timeout: float, command_timeout: float) -> Client:
    """A client for ``url``; connects on first use.

    One Redis gets one retry, at once, on a connection error: a pooled connection
    that Redis closed while idle (a restart) fails on first use and the retry
    takes a fresh one. Not after a timeout: a Redis that is there but silent
    would make every call wait twice the command timeout. A cluster client
    follows redirections and refreshes its slot map itself.

    Raises:
        ValueError: a malformed cluster URL.
    """
    if not is_cluster_url(url):
        return Redis.from_url(
            url,
            decode_responses=False,
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
            socket_connect_timeout=connect_timeout,
            socket_timeout=command_timeout,
        )
    address = parse_cluster_url(url)
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in address.seeds],
        username=address.username,
        password=address.password,
        ssl=address.tls,
        decode_responses=False,
        socket_connect_timeout=connect_timeout,
        socket_timeout=command_timeout,
    )


def batcher(client: Client, scripts: Sequence[Script], *, max_calls: int = 512) -> Batcher:
    """The pipeline writer for ``client``: raw pipelines, split by slot on a cluster."""
    if isinstance(client, RedisCluster):
        from gateway.engines.redis.cluster import ClusterBatcher

        return ClusterBatcher(client, scripts, max_calls=max_calls)
    return Batcher(client, scripts, max_calls=max_calls)


def node_connection(client: Client, key: str | bytes) -> AbstractConnection:
    """A new connection of the caller's own (a blocking read, say) to where ``key`` lives.

    On a cluster that is the primary serving the key's slot in the slot map the
    client loaded (its batcher's ``load_scripts`` loads it); the caller
    disconnects it, and after a ``MOVED`` or a lost connection calls
    :func:`refresh` and asks again.
    """
    if isinstance(client, RedisCluster):
        raw = key.encode() if isinstance(key, str) else key
        node = client.nodes_manager.get_node_from_slot(key_slot(raw))
        connection: AbstractConnection = node.connection_class(**node.connection_kwargs)
        return connection
    pool = client.connection_pool
    connection = pool.connection_class(**pool.connection_kwargs)
    return connection


def broadcast_connection(client: Client, attempt: int) -> AbstractConnection:
    """A new connection for classic pub/sub, which every node of a cluster repeats.

    On a cluster any node will do, so successive ``attempt``s go round every
    node the client knows (replicas too): a subscriber whose node died finds a
    live one without waiting for the slot map to change. One Redis: its pool's.
    """
    if isinstance(client, RedisCluster):
        nodes = sorted(client.get_nodes(), key=lambda node: node.name)
        if nodes:
            node = nodes[attempt % len(nodes)]
            connection: AbstractConnection = node.connection_class(**node.connection_kwargs)
            return connection
    return node_connection(client, b"")


async def refresh(client: Client) -> None:
    """Reload a cluster's slot map (after ``MOVED`` or a lost node); nothing for one Redis."""
    if isinstance(client, RedisCluster):
        await client.nodes_manager.initialize()
