"""Retention of a held Channel log on Redis (gateway/plane/redis/log_scripts.py, trim):
past ``max_frames`` it drops the frames without reading them, from each entry's
running byte count ``c``; a log written before ``c`` existed is trimmed as before,
and its byte count stays true across the change. A held append's frames are one
entry (packed): reads, acknowledgements and every bound cut inside one exactly."""

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


def unpacked(entry_id: bytes, fields: dict[bytes, bytes]) -> list[tuple[int, bytes]]:
    """An entry's frames with their numbers: one frame, or a call's frames packed (each a
    4-byte big-endian length and the frame; ``k`` how many), the ID the last one's number."""
    last = int(entry_id.split(b"-")[1])
    if b"k" not in fields:
        return [(last, fields[b"f"])]
    blob, frames, position = fields[b"f"], [], 0
    while position < len(blob):
        length = int.from_bytes(blob[position : position + 4], "big")
        frames.append(blob[position + 4 : position + 4 + length])
        position += 4 + length
    assert len(frames) == int(fields[b"k"])
    return list(enumerate(frames, start=last - len(frames) + 1))


async def held_frames(client: Client) -> list[tuple[int, bytes]]:
    """The frames the stream really holds, past those retention cut (``d``)."""
    gone = int(await client.hget(META, "d") or 0)
    held = []
    for entry_id, fields in await client.xrange(STREAM):
        held += [(n, frame) for n, frame in unpacked(entry_id, fields) if n > gone]
    return held


async def held_bytes(client: Client) -> tuple[int, int]:
    """The log's byte count, and the bytes its stream really holds."""
    held = await held_frames(client)
    return int(await client.hget(META, "b")), sum(len(frame) for _, frame in held)


async def test_past_max_frames_the_bytes_left_come_from_the_running_count(
    plane: RedisPlane, client: Client
) -> None:
    log = plane.channel_log
    await log.open(CHANNEL, digest=b"d" * 32, idle=3600.0)
    assert await log.hold(CHANNEL) == ("", 0)
    frames = [b"c=f;" + b"x" * n for n in range(1, 26)]  # sizes 5..29
    assert await log.held_append(CHANNEL, frames[:12]) == 12
    assert await log.held_append(CHANNEL, frames[12:]) == 25
    # One entry per call, its ID its last frame's number; the first call's entry went
    # whole, the second's first three frames were cut (``d``, the last number gone).
    entries = await client.xrange(STREAM)
    assert [entry_id for entry_id, _ in entries] == [b"0-25"]
    assert int(entries[0][1][b"k"]) == 13
    assert int(await client.hget(META, "d")) == 15
    # Each entry's c is the log's bytes through its last frame.
    assert int(entries[0][1][b"c"]) == sum(len(f) for f in frames)
    assert await held_frames(client) == list(enumerate(frames[15:], start=16))
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


async def test_a_read_and_an_acknowledgement_inside_a_packed_entry(
    plane: RedisPlane, client: Client
) -> None:
    log = plane.channel_log
    await log.open(CHANNEL, digest=b"d" * 32, idle=3600.0)
    assert await log.hold(CHANNEL) == ("", 0)
    frames = [b"c=p;" + b"y" * n for n in range(8)]
    assert await log.held_append(CHANNEL, frames[:5]) == 5
    assert await log.held_append(CHANNEL, frames[5:6]) == 6  # one frame: a plain entry
    assert await log.held_append(CHANNEL, frames[6:]) == 8
    entries = await client.xrange(STREAM)
    assert [entry_id for entry_id, _ in entries] == [b"0-5", b"0-6", b"0-8"]
    assert b"k" not in entries[1][1]
    # A read from the middle of a packed entry, a page at a time.
    read = await log.read(CHANNEL, 2, 2, 0)
    assert read is not None and read.frames == ((3, frames[2]), (4, frames[3]))
    read = await log.read(CHANNEL, 4, 3, 0)
    assert read is not None and read.frames == ((5, frames[4]), (6, frames[5]), (7, frames[6]))
    # Reading after 4 acknowledged 1..4: the first entry stays for frame 5 alone.
    assert [n for n, _ in await held_frames(client)] == [5, 6, 7, 8]
    counted, held = await held_bytes(client)
    assert counted == held == sum(len(f) for f in frames[4:])
    await log.acknowledge(CHANNEL, 7)
    assert [entry_id for entry_id, _ in await client.xrange(STREAM)] == [b"0-8"]
    assert await held_frames(client) == [(8, frames[7])]
    counted, held = await held_bytes(client)
    assert counted == held == len(frames[7])
    read = await log.read(CHANNEL, 0, 10, 0)
    assert read is not None and read.frames == ((8, frames[7]),) and read.lost_through == 0
    assert await log.held_append(CHANNEL, []) == 8  # nothing to append: nothing added
    assert [entry_id for entry_id, _ in await client.xrange(STREAM)] == [b"0-8"]


async def test_the_byte_bound_cuts_inside_a_packed_entry(redis_url: str, client: Client) -> None:
    plane = RedisPlane(
        redis_url,
        broker_id="broker-a",
        lease=30.0,
        prefix=PREFIX,
        retention=LogRetention(max_frames=100, max_bytes=50),
    )
    await plane.start(lambda envelope: None, lambda broker: None)
    try:
        log = plane.channel_log
        await log.open(CHANNEL, digest=b"d" * 32, idle=3600.0)
        assert await log.hold(CHANNEL) == ("", 0)
        frames = [b"c=b;%06d" % n for n in range(1, 13)]  # 10 bytes each
        assert await log.held_append(CHANNEL, frames[:7]) == 7
        # 70 bytes over 50: the first two frames of the entry go, the entry stays.
        assert await held_frames(client) == list(enumerate(frames[2:7], start=3))
        assert await log.held_append(CHANNEL, frames[7:]) == 12
        assert await held_frames(client) == list(enumerate(frames[7:], start=8))
        assert [entry_id for entry_id, _ in await client.xrange(STREAM)] == [b"0-12"]
        counted, held = await held_bytes(client)
        assert counted == held == 50
        read = await log.read(CHANNEL, 0, 100, 0)
        assert read is not None and read.lost_through == 7
        assert [frame for _, frame in read.frames] == frames[7:]
    finally:
        await plane.close()


async def test_with_an_older_broker_on_the_bus_each_frame_is_an_entry(
    plane: RedisPlane, client: Client
) -> None:
    # An older broker reads (and trims) one frame per entry: while its lease is up,
    # with its value 1, the frames of a call go into an entry each.
    await client.sadd(f"{{{PREFIX}}}brokers", "broker-old")
    await client.set(f"{{{PREFIX}}}alive:broker-old", "1")
    await plane.learn_log_format()
    log = plane.channel_log
    await log.open(CHANNEL, digest=b"d" * 32, idle=3600.0)
    assert await log.hold(CHANNEL) == ("", 0)
    frames = [b"c=o;" + b"w" * n for n in range(6)]
    assert await log.held_append(CHANNEL, frames[:3]) == 3
    entries = await client.xrange(STREAM)
    assert [entry_id for entry_id, _ in entries] == [b"0-1", b"0-2", b"0-3"]
    assert [fields[b"f"] for _, fields in entries] == frames[:3]
    assert [int(fields[b"c"]) for _, fields in entries] == [
        sum(len(f) for f in frames[:n]) for n in (1, 2, 3)
    ]
    assert all(b"k" not in fields for _, fields in entries)
    # Gone (its lease ended): the next call's frames are one entry.
    await client.delete(f"{{{PREFIX}}}alive:broker-old")
    await plane.learn_log_format()
    assert await log.held_append(CHANNEL, frames[3:]) == 6
    entries = await client.xrange(STREAM)
    assert [entry_id for entry_id, _ in entries] == [b"0-1", b"0-2", b"0-3", b"0-6"]
    assert int(entries[-1][1][b"k"]) == 3
    counted, held = await held_bytes(client)
    assert counted == held == sum(len(f) for f in frames)
    read = await log.read(CHANNEL, 1, 100, 0)
    assert read is not None
    assert read.frames == tuple(enumerate(frames[1:], start=2))
