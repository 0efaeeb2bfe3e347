"""Frames for a Channel held at another broker, on a Redis Cluster beside one Redis.

    python bench/cluster_held.py [--repeats N] [--frames N] [--quick]

Issue 11 point 3 (a resumable WebSocket Channel: its log is *held* by the broker
its connection is on, and a frame routed to it elsewhere goes to that broker).
Two routing planes (``gateway.plane.redis.plane.RedisPlane``) in this process,
brokers A and B: A holds the Channel's log, B hands ``--frames`` frames for the
Channel to its plane at once (``forward_to_channel``, as a burst of an agent's
``d=<i>`` Commands), and the clock runs until A's reader has received the last
one. Layouts:

* ``one-redis`` (the baseline): a private ``redis-server`` without AOF; each
  forward is one script (``LOG_OR_FORWARD``: the log's holder, the send, the
  entry's ID recorded for the release barrier);
* ``cluster``: a private six-node Redis Cluster without AOF
  (tests/support/redis_cluster.py); a forward is the log's slot (counted on its
  way to the holder, ``LOG_OR_HOLDER``) then the holder's stream's slot (the
  send, and ``WAIT 1`` for the replica), gateway/plane/redis/counted_barriers.py.

Per repeat each layout once (alternating which goes first): frames/s, this
process's CPU per frame (both planes: the batching, the reader) and the Redis
servers' CPU per frame (every node's ``/proc/<pid>/stat`` user + system time),
medians, and the ratio cluster / one Redis of each within a repeat (median and
range). Run it on two checkouts, alternating, for before/after.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.support.redis_cluster, gateway
from cluster import redis_process  # noqa: E402  # bench/cluster.py's private redis-server

from gateway.plane.base import Envelope, EnvelopeKind  # noqa: E402
from gateway.plane.redis.plane import RedisPlane  # noqa: E402
from tests.support.redis_cluster import RedisCluster  # noqa: E402

CHANNEL = "0123456789abcdef0123456789abcdef"
#: Frames forwarded (and waited for) before the clock starts: scripts loaded,
#: connections made, pipelines warm.
WARMUP = 200
#: Seconds a run may take before it counts as stuck.
TIMEOUT = 120.0
_TICK = os.sysconf("SC_CLK_TCK")


def redis_cpu(pids: list[int]) -> float:
    """Seconds of CPU the Redis processes ``pids`` used so far (user + system)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / _TICK


async def run(url: str, pids: list[int], frames: int, tag: str) -> tuple[float, float, float]:
    """One burst: (frames/s, this process's CPU µs per frame, Redis CPU µs per frame)."""
    prefix = f"bench-held-{tag}:"
    a = RedisPlane(url, broker_id="bench-a", prefix=prefix, lease=30.0)
    b = RedisPlane(url, broker_id="bench-b", prefix=prefix, lease=30.0)
    got = 0
    want = WARMUP
    arrived = asyncio.Event()

    def at_a(envelope: Envelope) -> None:
        nonlocal got
        if envelope.kind is EnvelopeKind.CHANNEL:
            got += 1
            if got >= want:
                arrived.set()

    await a.start(at_a, lambda peer: None)
    await b.start(lambda envelope: None, lambda peer: None)
    try:
        log = a.channel_log
        await log.open(CHANNEL, digest=b"digest", idle=3600.0)
        await log.hold(CHANNEL)
        a.channel_opened(CHANNEL)
        await a.written()

        async def burst(count: int) -> None:
            nonlocal want
            want = got + count
            arrived.clear()
            sent = [
                b.forward_to_channel(
                    CHANNEL,
                    Envelope(
                        EnvelopeKind.CHANNEL, "bench-b", CHANNEL, b"c=news,u=%d;0123456789" % n
                    ),
                )
                for n in range(count)
            ]
            async with asyncio.timeout(TIMEOUT):
                await arrived.wait()
                placed = await asyncio.gather(*sent)
            assert all(target == "bench-a" for target in placed), set(placed)

        await burst(WARMUP)
        wall, cpu, server = time.perf_counter(), time.process_time(), redis_cpu(pids)
        await burst(frames)
        wall = time.perf_counter() - wall
        cpu = time.process_time() - cpu
        server = redis_cpu(pids) - server
    finally:
        await b.close()
        await a.close()
    return frames / wall, cpu / frames * 1e6, server / frames * 1e6


def _ratio(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="repeats (3)")
    parser.add_argument("--frames", type=int, default=10_000, help="frames per burst (10000)")
    parser.add_argument("--quick", action="store_true", help="1 repeat of 1,000 frames: rough")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.frames = 1, 1000
    rows: dict[str, list[tuple[float, float, float]]] = {"one-redis": [], "cluster": []}
    ratios: list[tuple[float, float, float]] = []
    with tempfile.TemporaryDirectory(prefix="asbp-held-") as tmp:
        cluster = RedisCluster(Path(tmp) / "cluster", appendonly=False)
        with redis_process(Path(tmp)) as (redis_url, redis_pid), cluster:
            nodes = [server.pid for server in cluster.servers]
            layouts = {"one-redis": (redis_url, [redis_pid]), "cluster": (cluster.url, nodes)}
            for repeat in range(args.repeats):
                order = list(layouts) if repeat % 2 == 0 else list(reversed(layouts))
                got = {}
                for name in order:
                    url, pids = layouts[name]
                    got[name] = await run(url, pids, args.frames, f"{name}-{repeat}")
                    rows[name].append(got[name])
                one, two = got["one-redis"], got["cluster"]
                ratios.append((two[0] / one[0], two[1] / one[1], two[2] / one[2]))
    print(f"{'layout':<10} {'frames/s':>10} {'cli CPU us':>11} {'redis CPU us':>13}")
    for name, samples in rows.items():
        rate, cpu, server = (statistics.median(column) for column in zip(*samples, strict=True))
        print(f"{name:<10} {rate:>10,.0f} {cpu:>11.1f} {server:>13.1f}")
    rate, cpu, server = (list(column) for column in zip(*ratios, strict=True))
    print(
        f"cluster / one-redis: frames/s {_ratio(rate)}, cli CPU {_ratio(cpu)},"
        f" redis CPU {_ratio(server)}"
    )


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
