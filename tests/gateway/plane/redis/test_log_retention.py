"""Retention of a held Channel log on Redis (gateway/plane/redis/log_scripts.py, trim):
past ``max_frames`` it drops the frames without reading them, from each entry's
running byte count ``c``; a log written before ``c`` existed is trimmed as before,
and its byte count stays true across the change."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gateway.engines.redis.connection import Client, connect
from gateway.plane.base import LogRetention
from gateway.plane.redis.plane import RedisPlane
from tests.support import RedisServer, T

pytestmark = pytest.mark.anyio

PREFIX = "retention:"
CHANNEL = "0123456789abcdef0123456789abcdef"
META = f"{PREFIX}log:{{{CHANNEL}}}"
STREAM = f"{PREFIX}logs:{{{CHANNEL}}}"


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory: Path = tmp_path_factory.mktemp("retention-redis")
    with RedisServer(directory) as server:
        yield server.url


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[Client]:
    client = connect(redis_url, connect_timeout=T, command_timeout=5 * T)
    await client.flushall()
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def plane(redis_url: str, client: Client) -> AsyncIterator[RedisPlane]:
    plane = RedisPlane(
        redis_url,
        broker_id="broker-a",
        lease=30.0,
        prefix=PREFIX,
        retention=LogRetention(max_frames=10, max_bytes=10_000),
    )
    await plane.start(lambda envelope: None, lambda broker: None)
    try:
        yield plane
    finally:
        await plane.close()


async def held_bytes(client: Client) -> tuple[int, int]:
    """The log's byte count, and the bytes its stream really holds."""
    entries = await client.xrange(STREAM)
    return int(await client.hget(META, "b")), sum(len(fields[b"f"]) for _, fields in entries)


async def test_past_max_frames_the_bytes_left_come_from_the_running_count(
    plane: RedisPlane, client: Client
) -> None:
    log = plane.channel_log
    await log.open(CHANNEL, digest=b"d" * 32, idle=3600.0)
    assert await log.hold(CHANNEL) == ("", 0)
    frames = [b"c=f;" + b"x" * n for n in range(1, 26)]  # sizes 5..29
    assert await log.held_append(CHANNEL, frames[:12]) == 12
    assert await log.held_append(CHANNEL, frames[12:]) == 25
    entries = await client.xrange(STREAM)
    assert [entry_id for entry_id, _ in entries] == [b"0-%d" % n for n in range(16, 26)]
    # Each entry's c is the log's bytes through it.
    assert [int(fields[b"c"]) for _, fields in entries] == [
        sum(len(f) for f in frames[:n]) for n in range(16, 26)
    ]
    counted, held = await held_bytes(client)
    assert counted == held == sum(len(f) for f in frames[15:])
    read = await log.read(CHANNEL, 0, 100, 0)
    assert read is not None and read.lost_through == 15
    assert [frame for _, frame in read.frames] == frames[15:]


async def test_a_log_written_before_the_running_count_is_trimmed_as_before(
    plane: RedisPlane, client: Client
) -> None:
    log = plane.channel_log
    await log.open(CHANNEL, digest=b"d" * 32, idle=3600.0)
    assert await log.hold(CHANNEL) == ("", 0)
    # What an older broker wrote: entries without c, and no c in the hash.
    now = str(int(time.time() * 1000))
    old = [b"c=old;" + b"y" * n for n in range(8)]
    for n, frame in enumerate(old, start=1):
        await client.xadd(STREAM, {"f": frame, "t": now}, id=f"0-{n}")
    await client.hset(META, mapping={"n": len(old), "b": sum(len(f) for f in old)})
    await client.hdel(META, "c")
    new = [b"c=new;" + b"z" * n for n in range(12)]
    for start in range(0, 12, 3):  # the old entries leave over several trims
        assert await log.held_append(CHANNEL, new[start : start + 3]) == 8 + start + 3
        counted, held = await held_bytes(client)
        assert counted == held
    read = await log.read(CHANNEL, 0, 100, 0)
    assert read is not None and read.lost_through == 10
    assert [frame for _, frame in read.frames] == new[2:]
