"""What a ``/metrics`` scrape costs with many queues (issue 15: < 100 ms at 100,000).

Declares ``--queues`` queues (one message each, depths 1..7 so the top-N pick has
work to do) on the memory engine of a real Broker, then times whole scrapes
(``gateway.metrics.collector.render``: engine depths, every family, the text
encoding) beside the baseline of the same broker with no queues, in the same run,
and prints the medians and their ratio. In-process, so the figure is the
broker's CPU time for one scrape without the HTTP round trip around it.

    python bench/metrics.py [--queues 100000] [--repeats 15]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import tempfile
import time
from pathlib import Path

from gateway.broker import Broker
from gateway.config.model import GatewayConfig, MessagingLimits
from gateway.engines.base import new_message
from gateway.metrics.collector import render

GOAL_MS = 100.0


async def _broker(data_dir: Path, queues: int) -> Broker:
    config = GatewayConfig(
        data_dir=data_dir, messaging=MessagingLimits(max_queues=max(queues, 1) + 10)
    )
    broker = Broker(
        config, broker_id="bench-metrics", credentials=None, log=logging.getLogger("bench")
    )
    await broker.start()
    now = time.time()
    for n in range(queues):
        for m in range(1 + n % 7):
            await broker.engine.enqueue(
                new_message(f"{n}.{m}", f"q{n}", b"x", now, None, 4, None, None, frozenset(), {})
            )
    return broker


async def _time(broker: Broker, repeats: int) -> tuple[float, int]:
    samples = []
    size = 0
    for _ in range(repeats):
        began = time.perf_counter()
        body = await render(broker, throttled=0)
        samples.append((time.perf_counter() - began) * 1000)
        size = len(body)
    return statistics.median(samples), size


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="asbp-bench-") as tmp:
        empty = await _broker(Path(tmp) / "empty", 0)
        print(f"declaring {args.queues:,} queues on the memory engine...", flush=True)
        full = await _broker(Path(tmp) / "full", args.queues)
        try:
            base_ms, base_size = await _time(empty, args.repeats)
            full_ms, full_size = await _time(full, args.repeats)
        finally:
            await empty.stop()
            await full.stop()
    print(f"\nmedians of {args.repeats} scrapes:")
    print(f"  no queues            {base_ms:8.2f} ms  {base_size:>8,} bytes")
    print(f"  {args.queues:>7,} queues       {full_ms:8.2f} ms  {full_size:>8,} bytes")
    verdict = "ok" if full_ms < GOAL_MS else "MISSED"
    print(f"  ratio {full_ms / base_ms:.1f}x; goal < {GOAL_MS:.0f} ms: {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=15)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
