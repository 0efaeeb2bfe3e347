"""Queues and topics of the redis engine on a Redis Cluster, against one Redis.

    python bench/cluster_queues.py [--repeats N] [--messages N] [--quick]

Starts a private ``redis-server`` and a private six-node Redis Cluster (three
primaries, one replica each; tests/support/redis_cluster.py), neither keeping
an AOF, and measures on each, interleaved, ``--repeats`` times:

``queue``
    bench/queues.py's ``engine`` target: one ``RedisEngine`` with a producer
    keeping 100 ``enqueue`` calls outstanding and a consumer looping
    ``fetch(count=100)`` then ``ack``. On the cluster each enqueue script
    call is followed by ``WAIT 1 1000`` (the promise of docs/kubernetes.md).
``topic``
    one engine publishes ``--messages`` topic messages with 100 outstanding,
    each copied into four virtual queues (on the cluster they live in four
    shards, so four ``COPY`` calls plus the version ``GET`` and the
    ``SPUBLISH``; on one Redis one script), and a second engine's listener
    receives every one: the publication's fan-out to another broker and to
    the virtual queues.

Messages per second, and the ratio cluster / one Redis within each repeat; the
medians are printed against issue 12's goal, >= 0.7. On one machine a cluster
cannot be faster (its primaries share the same cores), so the figure is its
overhead: the extra round trips and ``WAIT``s, and six Redis processes.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

from queues import run_engine  # bench/queues.py: the same engine target

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.support: the servers the tests use

from gateway.engines.base import EngineLimits, Message  # noqa: E402
from gateway.engines.redis.engine import RedisEngine  # noqa: E402
from tests.support import RedisServer  # noqa: E402
from tests.support.redis_cluster import RedisCluster  # noqa: E402

#: Publications outstanding.
WINDOW: Final = 100
#: Virtual queues each topic message is copied into.
VIRTUAL_QUEUES: Final = 4
GOAL: Final = 0.7


async def run_topic(url: str, messages: int, payload: bytes) -> float:
    """Topic messages per second, published at one engine and received at another."""
    limits = EngineLimits(max_queue_depth=10**9)
    topic = f"/bench/{uuid.uuid4().hex[:8]}"
    publisher = RedisEngine(url, broker_id="pub", limits=limits, sweep_interval=None)
    listener = RedisEngine(url, broker_id="sub", limits=limits, sweep_interval=None)
    await publisher.start()
    await listener.start()
    try:
        for n in range(VIRTUAL_QUEUES):
            await publisher.declare_virtual_queue(f"bench{n}", topic)
        received = 0
        everything = asyncio.Event()

        def heard(message: Message) -> None:
            nonlocal received
            if message.destination == topic:
                received += 1
                if received == messages:
                    everything.set()

        listener.listen(heard)
        started = time.perf_counter()
        now = time.time()
        for start in range(0, messages, WINDOW):
            batch = [
                Message(id=uuid.uuid4().hex, destination=topic, payload=payload, timestamp=now)
                for _ in range(min(WINDOW, messages - start))
            ]
            await asyncio.gather(*(publisher.publish(message) for message in batch))
        await asyncio.wait_for(everything.wait(), 60)
        elapsed = time.perf_counter() - started
        for n in range(VIRTUAL_QUEUES):
            depth = await publisher.depth(f"bench{n}@{topic}")
            if depth != messages:
                raise RuntimeError(f"virtual queue {n} holds {depth} of {messages} copies")
        return messages / elapsed
    finally:
        await listener.close()
        await publisher.close()


Run = Callable[[str, int, bytes], Awaitable[float]]
TARGETS: Final[dict[str, Run]] = {"queue": run_engine, "topic": run_topic}


async def measure(args: argparse.Namespace, single: str, cluster: str) -> None:
    payload = b"x" * args.payload
    rates: dict[tuple[str, str], list[float]] = {}
    ratios: dict[str, list[float]] = {name: [] for name in TARGETS}
    for repeat in range(1, args.repeats + 1):
        line = [f"repeat {repeat}:"]
        for name, run in TARGETS.items():
            # Alternate which goes first, so neither always meets a warmer machine.
            order = [("one", single), ("cluster", cluster)]
            if repeat % 2 == 0:
                order.reverse()
            got: dict[str, float] = {}
            for where, url in order:
                got[where] = await run(url, args.messages, payload)
                rates.setdefault((name, where), []).append(got[where])
            ratio = got["cluster"] / got["one"]
            ratios[name].append(ratio)
            line.append(
                f"{name} one {got['one']:,.0f} msg/s, cluster {got['cluster']:,.0f} msg/s "
                f"({ratio:.2f})"
            )
        print("  ".join(line), flush=True)
    for name in TARGETS:
        one = statistics.median(rates[name, "one"])
        cluster_rate = statistics.median(rates[name, "cluster"])
        ratio = statistics.median(ratios[name])
        met = "met" if ratio >= GOAL else "NOT met"
        print(
            f"median {name}: one Redis {one:,.0f} msg/s, cluster {cluster_rate:,.0f} msg/s; "
            f"ratio cluster/one {ratio:.2f} (range {min(ratios[name]):.2f}-"
            f"{max(ratios[name]):.2f}); goal >= {GOAL}: {met}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--payload", type=int, default=100, help="payload bytes")
    parser.add_argument("--quick", action="store_true", help="1 repeat of 2,000: rough numbers")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.messages = 1, 2_000
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        (root / "one").mkdir()
        (root / "cluster").mkdir()
        with (
            RedisServer(root / "one") as server,
            RedisCluster(root / "cluster", appendonly=False) as cluster,
        ):
            print(f"one Redis {server.url}, cluster {cluster.url}", flush=True)
            asyncio.run(measure(args, server.url, cluster.url))


if __name__ == "__main__":
    main()
