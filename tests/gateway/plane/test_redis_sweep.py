"""The Redis plane forgets a dead broker that held very many Channels in bounded batches."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio

from gateway.engines.redis.calls import script_command
from gateway.plane.redis.plane import RedisPlane
from gateway.plane.redis.scripts import SWEEP
from tests.support import RedisServer

pytestmark = pytest.mark.anyio

PREFIX = "sweep-test:"
CHANNELS = 2_500
BATCH = 100


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    directory: Path = tmp_path_factory.mktemp("sweep-redis")
    with RedisServer(directory) as server:
        yield server


def ignore(_: object) -> None:
    """Envelopes and lost peers do not matter here."""


async def test_a_dead_broker_with_many_channels_is_swept_in_batches(
    redis_server: RedisServer,
) -> None:
    client = redis.asyncio.Redis.from_url(redis_server.url)
    a = RedisPlane(redis_server.url, broker_id="a", prefix=PREFIX, lease=60, sweep_batch=BATCH)
    b = RedisPlane(redis_server.url, broker_id="b", prefix=PREFIX, lease=60, sweep_batch=BATCH)
    try:
        await client.flushall()
        await a.start(ignore, ignore)
        await b.start(ignore, ignore)
        for n in range(CHANNELS):
            b.channel_opened(f"{n:032x}")
        b.serving("echo")
        for n in range(BATCH // 2):
            b.group_joined(f"room-{n}")
        await b.written()
        assert await client.hlen(PREFIX + "ch") == CHANNELS
        await b.abandon()
        await client.delete(PREFIX + "alive:b")  # its lease ran out

        # One script call forgets one batch, no more: Redis is never held for long.
        await a._call(script_command(SWEEP, (), (PREFIX, BATCH)))
        assert await client.hlen(PREFIX + "ch") == CHANNELS - BATCH
        assert await client.sismember(PREFIX + "brokers", "b")

        # The sweep calls it again until the broker is forgotten whole.
        assert await a.sweep() == 1
        assert await client.hlen(PREFIX + "ch") == 0
        assert not await client.exists(PREFIX + "chs:b", PREFIX + "names:b", PREFIX + "name:echo")
        assert not await client.exists(PREFIX + "grps:b", PREFIX + "grp:room-0")
        assert not await client.sismember(PREFIX + "brokers", "b")
        assert await a.respondents("echo") == frozenset()
        assert await a.sweep() == 0
    finally:
        await a.close()
        await b.close()
        await client.aclose()


async def test_a_broker_leaving_with_many_channels_drops_them_all(
    redis_server: RedisServer,
) -> None:
    client = redis.asyncio.Redis.from_url(redis_server.url)
    b = RedisPlane(redis_server.url, broker_id="b", prefix=PREFIX, lease=60, sweep_batch=BATCH)
    try:
        await client.flushall()
        await b.start(ignore, ignore)
        for n in range(CHANNELS):
            b.channel_opened(f"{n:032x}")
        await b.locate_channel("0" * 32)
        await b.close()
        assert await client.hlen(PREFIX + "ch") == 0
        assert not await client.exists(PREFIX + "alive:b", PREFIX + "chs:b")
    finally:
        await client.aclose()
