"""A Redis round trip's CPU: redis-py's connection against the lean RESP connection.

    python bench/resp.py [--trips N] [--repeats N] [--depth N ...]

One private ``redis-server`` on a free port (no AOF). Per case and repeat,
``--trips`` sequential pipelines of ``--depth`` PINGs on one connection, and
this process's CPU per pipeline (``getrusage``: user + system, so the
kernel's loopback send and receive count, as they do for a broker):

=========  ==============================================================
redis-py   ``send_packed_command`` then one ``read_response`` per reply on
           a pooled redis-py connection (what the Batcher did)
lean       ``RespConnection.execute`` (gateway/engines/redis/resp.py): one
           ``transport.write``, the replies parsed in ``data_received``
=========  ==============================================================

Cases run interleaved, in a rotated order each repeat; the table shows the
medians, and the ratio lean / redis-py of the medians per depth.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import hiredis
from redis.asyncio import Redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the gateway package of this checkout

from cluster import redis_server  # noqa: E402  # bench/cluster.py: a private redis-server

from gateway.engines.redis.resp import open_connection  # noqa: E402  # after the path above


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def redis_py(url: str, trips: int, depth: int) -> float:
    """µs of CPU per pipeline on redis-py's connection."""
    client = Redis.from_url(url)
    pool = client.connection_pool
    connection = await pool.get_connection()  # type: ignore[no-untyped-call]  # upstream
    packed = hiredis.pack_command(("PING",)) * depth
    try:
        began = cpu_seconds()
        for _ in range(trips):
            await connection.send_packed_command(packed, check_health=False)
            for _ in range(depth):
                await connection.read_response()
        return (cpu_seconds() - began) / trips * 1e6
    finally:
        await pool.release(connection)
        await client.aclose()


async def lean(url: str, trips: int, depth: int) -> float:
    """µs of CPU per pipeline on the lean connection."""
    client = Redis.from_url(url)
    pool = client.connection_pool
    connection = await open_connection(pool.connection_class(**pool.connection_kwargs))
    packed = hiredis.pack_command(("PING",)) * depth
    try:
        began = cpu_seconds()
        for _ in range(trips):
            await connection.execute(packed, depth)
        return (cpu_seconds() - began) / trips * 1e6
    finally:
        connection.close()
        await client.aclose()


CASES: dict[str, Callable[[str, int, int], Awaitable[float]]] = {
    "redis-py": redis_py,
    "lean": lean,
}


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="asbp-resp-") as tmp, redis_server(Path(tmp)) as url:
        samples: dict[tuple[str, int], list[float]] = {}
        names = list(CASES)
        for repeat in range(args.repeats):
            order = names[repeat % len(names) :] + names[: repeat % len(names)]
            for depth in args.depth:
                for name in order:
                    await CASES[name](url, args.trips // 10, depth)  # warm-up
                    sample = await CASES[name](url, args.trips, depth)
                    samples.setdefault((name, depth), []).append(sample)
    print(f"{'case':<10} {'depth':>5} {'CPU us/pipeline':>16}   samples")
    for (name, depth), values in sorted(samples.items(), key=lambda item: (item[0][1], item[0][0])):
        shown = ", ".join(f"{value:.1f}" for value in values)
        print(f"{name:<10} {depth:>5} {statistics.median(values):>16.1f}   {shown}")
    for depth in args.depth:
        ratio = statistics.median(samples[("lean", depth)]) / statistics.median(
            samples[("redis-py", depth)]
        )
        print(f"depth {depth}: lean / redis-py CPU per pipeline {ratio:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trips", type=int, default=20000, help="pipelines per sample (20000)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats (3)")
    parser.add_argument(
        "--depth", type=int, nargs="+", default=[1, 4], help="PINGs per pipeline (1 4)"
    )
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
