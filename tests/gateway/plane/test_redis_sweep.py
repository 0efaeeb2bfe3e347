"""The Redis plane forgets a dead broker that held very many Channels in bounded batches,
on one Redis and on a Redis Cluster (where the directory shares one hash tag and each
broker's stream has its own, gateway/plane/redis/keys.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.engines.redis.calls import script_command
from gateway.engines.redis.connection import Client, connect
from gateway.plane.redis.keys import directory_prefix, live_key, stream_key
from gateway.plane.redis.plane import RedisPlane
from gateway.plane.redis.scripts import SWEEP
from tests.support import RedisServer, T
from tests.support.redis_cluster import RedisCluster

pytestmark = pytest.mark.anyio

PREFIX = "sweep-test:"
#: Where the directory's keys are (their hash tag included).
D = directory_prefix(PREFIX)
CHANNELS = 2_500
BATCH = 100


@pytest.fixture(scope="module", params=["redis", "redis-cluster"])
def redis_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A private redis-server for the module, or the session's Redis Cluster."""
    if request.param == "redis-cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        yield cluster.url
        return
    directory: Path = tmp_path_factory.mktemp("sweep-redis")
    with RedisServer(directory) as server:
        yield server.url


def client_for(url: str) -> Client:
    return connect(url, connect_timeout=T, command_timeout=5 * T)


async def forget_all(client: Client) -> None:
    """Nothing of an earlier test (this module's keys only: the cluster is shared)."""
    await client.delete(D + "ch", D + "chz", D + "brokers", D + "chs:b", D + "names:b")
    await client.delete(D + "grps:b")
    await client.delete(D + "name:echo", D + "fwd:echo", D + "alive:a", D + "alive:b")


def ignore(_: object) -> None:
    """Envelopes and lost peers do not matter here."""


async def test_a_dead_broker_with_many_channels_is_swept_in_batches(
    redis_url: str,
) -> None:
    client = client_for(redis_url)
    a = RedisPlane(redis_url, broker_id="a", prefix=PREFIX, lease=60, sweep_batch=BATCH)
    b = RedisPlane(redis_url, broker_id="b", prefix=PREFIX, lease=60, sweep_batch=BATCH)
    try:
        await forget_all(client)
        await a.start(ignore, ignore)
        await b.start(ignore, ignore)
        for n in range(CHANNELS):
            b.channel_opened(f"{n:032x}")
        b.serving("echo")
        for n in range(BATCH // 2):
            b.group_joined(f"room-{n}")
        await b.written()
        assert await client.hlen(D + "ch") == CHANNELS
        # The sorted set the management API pages holds the same identifiers.
        assert await client.zcard(D + "chz") == CHANNELS
        await b.abandon()
        await client.delete(D + "alive:b")  # its lease ran out

        # One script call forgets one batch, no more: Redis is never held for long.
        await a._call(script_command(SWEEP, (D + "brokers",), (D, BATCH)))
        assert await client.hlen(D + "ch") == CHANNELS - BATCH
        assert await client.zcard(D + "chz") == CHANNELS - BATCH
        assert await client.sismember(D + "brokers", "b")

        # The sweep calls it again until the broker is forgotten whole.
        assert await a.sweep() == 1
        assert await client.hlen(D + "ch") == 0
        assert await client.zcard(D + "chz") == 0
        assert not await client.exists(D + "chs:b", D + "names:b", D + "name:echo")
        assert not await client.exists(D + "grps:b", D + "grp:room-0")
        assert not await client.sismember(D + "brokers", "b")
        # Its stream, in a slot of its own on a cluster, is deleted too.
        assert not await client.exists(stream_key(PREFIX, "b"), live_key(PREFIX, "b"))
        assert await a.respondents("echo") == frozenset()
        assert await a.sweep() == 0
    finally:
        await a.close()
        await b.close()
        await client.aclose()


async def test_a_broker_leaving_with_many_channels_drops_them_all(
    redis_url: str,
) -> None:
    client = client_for(redis_url)
    b = RedisPlane(redis_url, broker_id="b", prefix=PREFIX, lease=60, sweep_batch=BATCH)
    try:
        await forget_all(client)
        await b.start(ignore, ignore)
        for n in range(CHANNELS):
            b.channel_opened(f"{n:032x}")
        await b.locate_channel("0" * 32)
        await b.close()
        assert await client.hlen(D + "ch") == 0
        assert await client.zcard(D + "chz") == 0
        assert not await client.exists(D + "alive:b", D + "chs:b")
        assert not await client.exists(stream_key(PREFIX, "b"), live_key(PREFIX, "b"))
    finally:
        await client.aclose()
