"""What the event log costs the router, in process, without sockets.

    python bench/eventlog.py [--trips N] [--repeats N] [--engine memory|redis]

Two brokers in this process, one with ``event_log.mode = "on"``, one with
``off``. With ``--engine memory`` the log goes to files under a temporary
``data_dir``; with ``--engine redis`` to the ``asbp:events`` stream of a
``redis-server`` the benchmark starts (tests.support.RedisServer), whose CPU
while the events are written is shown apart: it is not the broker's, but the
machine's. Each gets a Channel and a Tube
registered for ``echo``; a round trip is the two frames bench/roundtrip.py
sends, routed by calling the router directly:

* ``c=echo,u=N;<64 bytes>`` from the Channel (to the agent),
* ``c=echo.reply,d=<i>,u=N;<64 bytes>`` from the Tube (back to the Channel).

The outboxes are emptied between blocks, outside the clock. For the broker
with the log on, the clock also covers writing every event recorded (the
flusher's share: JSON and the file write), so the difference is the whole
cost per round trip. Time is CPU time of the whole process (the file writes
run in a worker thread), so other load on the machine counts less than it
would in wall time. The brokers alternate, ``--repeats`` times; the table
shows medians (and minimums) and the ratio.

To compare two versions of the log, run this script from each (a copy of the
tree at the older commit: ``git archive <commit> | tar -x -C /tmp/old``) in
turn, several times: the machine's load changes between runs.
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
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from gateway.broker import Broker  # noqa: E402
from gateway.config.model import ChannelLimits, EventLogConfig, GatewayConfig, TubeLimits  # noqa: E402

if TYPE_CHECKING:
    from tests.support import RedisServer

BODY = bytes(range(0x41, 0x41 + 26)) * 2 + b"0123456789ab"  # 64 bytes, as roundtrip.py
#: Round trips between emptying the outboxes and writing the events: 4,000 events,
#: about what the flusher finds every 250 ms at 16,000 Commands a second.
BLOCK = 2000


def cpu_seconds(pid: int | None) -> float:
    """User and system CPU of process ``pid`` so far (0 without one)."""
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as stat:
        # After the command name, which is in parentheses: utime is field 14.
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one_run(
    broker: Broker, trips: int, store_pid: int | None = None
) -> tuple[float, float, float]:
    """Seconds routing ``trips`` round trips, writing their events, and of the
    store's process (``store_pid``: redis-server) while they were written."""
    channel, channel_outbox = broker.open_websocket_channel("bench")
    tube, tube_outbox = broker.open_tube("bench-agent", "bench")
    router = broker.router
    router.tube_frame(tube, b"c=asbp.register,names=echo,u=1;")
    await tube_outbox.take()
    reply_head = b"c=echo.reply,d=" + channel.id.encode() + b",u="
    routing = writing = store = 0.0
    clock = time.process_time
    done = 0
    while done < trips:
        block = min(BLOCK, trips - done)
        requests = [b"c=echo,u=%d;" % ((done + n) % 65536) + BODY for n in range(block)]
        replies = [reply_head + b"%d;" % ((done + n) % 65536) + BODY for n in range(block)]
        began = clock()
        for request, reply in zip(requests, replies, strict=True):
            router.channel_frame(channel, request)
            router.tube_frame(tube, reply)
        routing += clock() - began
        if broker.event_log is not None:
            began, store_began = clock(), cpu_seconds(store_pid)
            await broker.event_log.flush()
            writing += clock() - began
            store += cpu_seconds(store_pid) - store_began
        await channel_outbox.take()
        await tube_outbox.take()
        done += block
    router.close_tube(tube)
    broker.close_channel(channel)
    return routing, writing, store


async def main(args: argparse.Namespace) -> None:
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="asbp-bench-eventlog-"))
        redis = None
        if args.engine == "redis":
            # Only here: the test support is not needed for the files.
            from tests.support import RedisServer

            redis = stack.enter_context(RedisServer(Path(tmp) / "redis"))
        await measure(args, Path(tmp), redis)


async def measure(args: argparse.Namespace, tmp: Path, redis: RedisServer | None) -> None:
    brokers: dict[str, Broker] = {}
    for mode in ("on", "off"):
        config = GatewayConfig(
            broker_id=f"bench-{mode}",
            data_dir=tmp / mode,
            engine=args.engine,
            event_log=EventLogConfig(mode=mode),
            agents={"bench-agent": {}},
            channels=ChannelLimits(outbox_frames=2 * BLOCK),
            tubes=TubeLimits(outbox_frames=2 * BLOCK),
        )
        if redis is not None:
            config = replace(config, redis_url=redis.url)
        broker = Broker(config, broker_id=f"bench-{mode}", credentials=None)
        await broker.start()
        brokers[mode] = broker
    store_pid = redis.pid if redis is not None else None
    try:
        for broker in brokers.values():  # warm-up
            await one_run(broker, min(args.trips, 2000), store_pid)
        results: dict[str, list[tuple[float, float, float]]] = {"on": [], "off": []}
        for repeat in range(args.repeats):
            for mode in ("on", "off") if repeat % 2 == 0 else ("off", "on"):
                results[mode].append(await one_run(brokers[mode], args.trips, store_pid))
    finally:
        for broker in brokers.values():
            await broker.stop()
    on_log = brokers["on"].event_log
    assert on_log is not None
    print(
        f"{args.engine} engine, {args.trips} round trips (2 Commands each) x {args.repeats} "
        "repeats; CPU us per round trip, median (min)"
    )
    print(f"{'log':<6}{'routing':>18}{'writing':>18}{'total':>18}")
    totals = {}

    def cell(values: list[float]) -> str:
        per_trip = [v / args.trips * 1e6 for v in values]
        return f"{statistics.median(per_trip):.2f} ({min(per_trip):.2f})"

    for mode, runs in results.items():
        totals[mode] = statistics.median(r + w for r, w, _ in runs) / args.trips * 1e6
        print(
            f"{mode:<6}{cell([r for r, _, _ in runs]):>18}{cell([w for _, w, _ in runs]):>18}"
            f"{cell([r + w for r, w, _ in runs]):>18}"
        )
    extra = totals["on"] - totals["off"]
    print(
        f"\nthe log adds {extra:.2f} us per round trip ({extra / 2:.2f} us per Command), "
        f"{100 * extra / totals['off']:.1f}% of the routing time; on/off time ratio "
        f"{totals['on'] / totals['off']:.3f}"
    )
    if redis is not None:
        # Clock ticks (10 ms): only the sum over many batches means anything.
        store = sum(s for _, _, s in results["on"]) / (args.repeats * args.trips) * 1e6
        print(f"redis-server CPU while writing: {store:.2f} us per round trip (mean)")
    print(f"events written {on_log.written}, dropped {on_log.dropped}, lost {on_log.lost}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    parser.add_argument("--trips", type=int, default=20_000, help="round trips per run")
    parser.add_argument("--repeats", type=int, default=5, help="alternating runs per broker")
    parser.add_argument(
        "--engine", choices=("memory", "redis"), default="memory", help="where the log goes"
    )
    asyncio.run(main(parser.parse_args()))
