"""Redis's CPU for the fetch of queued messages: the engine's FETCH script against
a native XREADGROUP with the lease written by a script given the ids.

    python bench/queue_fetch.py [--messages N] [--repeats R] [--payload BYTES]

Issue 17, point 2, lever B: the FETCH script (gateway/engines/redis/scripts.py)
reads new entries with XREADGROUP inside Lua, so every entry is turned into Lua
tables and back into the script's reply. This measures what taking the read out of
Lua would save before the engine is changed for it. Each repeat fills two queues
with the same ``RedisEngine.enqueue`` (not measured), then reads each whole, 100
messages a call, measuring redis-server's CPU (``/proc/<pid>/schedstat``) over the
reads only:

``script``
    ``RedisEngine.fetch(count=100)``: the FETCH script as the broker runs it
    (promote, reclaim, XREADGROUP, the lease batch, the grouped reply).
``native``
    ``XREADGROUP ... COUNT 100`` on the queue's stream (the default priority), then one
    EVALSHA of a two-command script writing the same lease batch (ZADD of the
    call's tag in ``l<p>``, HSET of its ids, joined by the client, in ``lb``): the
    reply parsed by redis-py. What the engine's fetch would cost Redis with the
    read native (two round trips; what it leaves out: promote, reclaim, the
    expiry check, which would move to the engine or to the next call).
``read``
    The XREADGROUP alone: the floor.

Prints medians of each, and ``script/native``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from redis.asyncio import Redis

from gateway.engines.base import DEFAULT_PRIORITY, EngineLimits, Message
from gateway.engines.redis.engine import RedisEngine
from gateway.engines.redis.scripts import GROUP
from tests.support import RedisServer

BATCH = 100
#: The lease batch as the native fetch would write it: one member, one list.
LEASE = """
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[4] .. ':' .. ARGV[1], ARGV[3])
return 1
"""


def redis_cpu(pid: int) -> float:
    """redis-server's CPU time so far, in seconds (all its threads)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/schedstat") as stats:
            total += int(stats.read().split()[0])
    return total / 1e9


async def fill(engine: RedisEngine, queue: str, messages: int, payload: bytes) -> None:
    now = time.time()
    for start in range(0, messages, BATCH):
        await asyncio.gather(
            *(
                engine.enqueue(
                    Message(id=uuid.uuid4().hex, destination=queue, payload=payload, timestamp=now)
                )
                for _ in range(min(BATCH, messages - start))
            )
        )


async def repeat(url: str, pid: int, messages: int, payload: bytes) -> dict[str, float]:
    engine = RedisEngine(url, broker_id="bench", limits=EngineLimits(max_queue_depth=10**9))
    client = Redis.from_url(url)
    await engine.start()
    try:
        queues = {name: f"fetch-{name}-{uuid.uuid4().hex[:8]}" for name in ("script", "native")}
        for queue in queues.values():
            await fill(engine, queue, messages, payload)
        # The raw read: a stream of the same entries, read without a lease.
        raw = f"fetch-read-{uuid.uuid4().hex[:8]}"
        await client.xgroup_create(raw, GROUP, id="0", mkstream=True)
        for start in range(0, messages, BATCH):
            async with client.pipeline(transaction=False) as pipe:
                for _ in range(min(BATCH, messages - start)):
                    pipe.xadd(raw, {"h": "{}", "p": payload, "x": "9999999999"})
                await pipe.execute()
        lease = client.register_script(LEASE)
        per_message: dict[str, float] = {}

        before = redis_cpu(pid)
        got = 0
        while got < messages:
            got += len(await engine.fetch(queues["script"], "bench", count=BATCH))
        per_message["script"] = (redis_cpu(pid) - before) * 1e6 / messages

        base = f"asbp:q:{queues['native']}:"
        before = redis_cpu(pid)
        got = 0
        deadline = int((time.time() + 30) * 1000)
        while got < messages:
            read: Any = await client.xreadgroup(
                GROUP, "bench", {f"{base}s{DEFAULT_PRIORITY}": ">"}, count=BATCH
            )
            ids = [entry_id for entry_id, _ in read[0][1]]
            await lease(
                keys=[f"{base}l{DEFAULT_PRIORITY}", base + "lb"],
                args=[uuid.uuid4().hex[:8], deadline, b" ".join(ids), DEFAULT_PRIORITY],
            )
            got += len(ids)
        per_message["native"] = (redis_cpu(pid) - before) * 1e6 / messages

        before = redis_cpu(pid)
        got = 0
        while got < messages:
            read = await client.xreadgroup(GROUP, "bench", {raw: ">"}, count=BATCH)
            got += len(read[0][1])
        per_message["read"] = (redis_cpu(pid) - before) * 1e6 / messages
        await client.delete(
            raw,
            *(
                f"asbp:q:{queue}:{key}"
                for queue in queues.values()
                for key in (f"s{DEFAULT_PRIORITY}", f"l{DEFAULT_PRIORITY}", "lb")
            ),
        )
        return per_message
    finally:
        await client.aclose()
        await engine.close()


async def measure(url: str, pid: int, args: argparse.Namespace) -> list[dict[str, float]]:
    payload = b"x" * args.payload
    await repeat(url, pid, 2000, payload)  # warm up: scripts loaded, allocator
    runs = []
    for number in range(args.repeats):
        run = await repeat(url, pid, args.messages, payload)
        print(
            f"  repeat {number + 1}: "
            + ", ".join(f"{name} {value:.2f} us" for name, value in run.items())
            + " of redis-server CPU per message",
            flush=True,
        )
        runs.append(run)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--payload", type=int, default=100, help="payload bytes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory, RedisServer(Path(directory)) as server:
        print(f"{args.messages:,} messages of {args.payload} bytes, {args.repeats} repeats")
        runs = asyncio.run(measure(server.url, server.pid, args))
    medians = {name: statistics.median(run[name] for run in runs) for name in runs[0]}
    print(
        "median: "
        + ", ".join(f"{name} {value:.2f} us" for name, value in medians.items())
        + " of redis-server CPU per message"
    )
    ratios = [run["script"] / run["native"] for run in runs if run["native"] > 0]
    print(
        f"script/native: median {statistics.median(ratios):.2f} "
        f"(range {min(ratios):.2f}-{max(ratios):.2f})"
    )


if __name__ == "__main__":
    main()
