"""What the metrics cost: the router's counting per Command, and a ``/metrics``
scrape with many queues (issue 15: <= 3% of throughput; < 100 ms at 100,000 queues).

Routing: two Brokers in this process, ``[metrics] enabled`` on and off, each with
one Channel and one Tube serving ``echo``; each routes round trips (the User-Agent's
frame through ``router.channel_frame``, the agent's answer through
``router.tube_frame``, the event log on as a broker runs), in batches of 500
that alternate between the two, and the median CPU per round trip of each and
the median of the repeats' ratios are printed.
This is the broker's own cost without sockets, so the ratio is an upper bound of
what metrics take from end-to-end throughput (``bench/roundtrip.py --metrics-cost``
measures that, noisier).

Scrape: declares ``--queues`` queues (one message each, depths 1..7 so the top-N pick has
work to do) on the memory engine of a real Broker, then times whole scrapes
(``gateway.metrics.collector.render``: engine depths, every family, the text
encoding) beside the baseline of the same broker with no queues, in the same run,
and prints the medians and their ratio. In-process, so the figure is the
broker's CPU time for one scrape without the HTTP round trip around it.

    python bench/metrics.py [--queues 100000] [--repeats 15] [--trips 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from gateway.broker import Broker
from gateway.config.model import GatewayConfig, MessagingLimits, MetricsConfig
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


BATCH = 500


async def _routing_broker(data_dir: Path, metrics: bool) -> tuple[Broker, Any, Any, Any]:
    config = GatewayConfig(data_dir=data_dir, metrics=MetricsConfig(enabled=metrics))
    broker = Broker(config, broker_id="bench", credentials=None, log=logging.getLogger("bench"))
    await broker.start()
    channel, channel_outbox = broker.open_websocket_channel("bench")
    tube, tube_outbox = broker.open_tube("bench-agent", "bench")
    broker.respondents.register(tube, ["echo"])
    await tube_outbox.take()  # the Tube's greeting
    return broker, (channel, channel_outbox), (tube, tube_outbox), channel.id


async def _batch(broker: Broker, channel: Any, tube: Any, channel_id: str) -> float:
    """CPU seconds for ``BATCH`` round trips."""
    router = broker.router
    (user, user_outbox), (agent, agent_outbox) = channel, tube
    request = b"c=echo,u=1;" + bytes(64)
    answer = b"c=echo.reply,d=" + channel_id.encode() + b",u=1;" + bytes(64)
    began = time.process_time()
    for _ in range(BATCH):
        router.channel_frame(user, request)
        router.tube_frame(agent, answer)
    spent = time.process_time() - began
    # Outside the timing: the writers' side, the same for both brokers.
    assert len(await agent_outbox.take()) == BATCH
    assert len(await user_outbox.take()) == BATCH
    return spent


async def routing(args: argparse.Namespace, tmp: Path) -> None:
    brokers = {on: await _routing_broker(tmp / f"routing-{on}", on) for on in (True, False)}
    samples: dict[bool, list[float]] = {True: [], False: []}
    batches = max(args.trips // BATCH, 1)
    try:
        for repeat in range(args.repeats):
            # Batches alternate between the two brokers, so both see the same
            # load from whatever else the machine runs (on a shared machine a
            # sample's neighbours matter more than its broker).
            spent = {True: 0.0, False: 0.0}
            for batch in range(batches):
                for on in (True, False) if (repeat + batch) % 2 == 0 else (False, True):
                    spent[on] += await _batch(*brokers[on])
            for on in (True, False):
                samples[on].append(spent[on] / (batches * BATCH))
    finally:
        for broker, *_ in brokers.values():
            await broker.stop()
    on_us = statistics.median(samples[True]) * 1e6
    off_us = statistics.median(samples[False]) * 1e6
    ratios = [off / on for on, off in zip(samples[True], samples[False], strict=True)]
    ratio = statistics.median(ratios)
    print(f"routing, medians of {args.repeats} x {batches * BATCH:,} round trips (CPU):")
    print(f"  metrics on   {on_us:7.2f} us per round trip")
    print(f"  metrics off  {off_us:7.2f} us per round trip")
    verdict = "ok" if ratio >= 0.97 else "MISSED"
    print(
        f"  throughput on / off {ratio:.3f} [{min(ratios):.3f}-{max(ratios):.3f}]"
        f" (cost {100 * (1 - ratio):.1f}%); goal >= 0.97: {verdict}\n"
    )


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="asbp-bench-") as tmp:
        if args.trips:
            await routing(args, Path(tmp))
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
    parser.add_argument(
        "--trips", type=int, default=20_000, help="round trips per routing sample (0: skip)"
    )
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
