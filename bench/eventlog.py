"""What the event log costs the router, in process, without sockets.

    python bench/eventlog.py [--trips N] [--repeats N] [--engine memory]

Two brokers in this process, one with ``event_log.mode = "on"`` (files under a
temporary ``data_dir``), one with ``off``. Each gets a Channel and a Tube
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
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from gateway.broker import Broker  # noqa: E402
from gateway.config import ChannelLimits, EventLogConfig, GatewayConfig, TubeLimits  # noqa: E402

BODY = bytes(range(0x41, 0x41 + 26)) * 2 + b"0123456789ab"  # 64 bytes, as roundtrip.py
#: Round trips between emptying the outboxes and writing the events: 4,000 events,
#: about what the flusher finds every 250 ms at 16,000 Commands a second.
BLOCK = 2000


async def one_run(broker: Broker, trips: int) -> tuple[float, float]:
    """Seconds routing ``trips`` round trips, and seconds writing their events."""
    channel, channel_outbox = broker.open_websocket_channel("bench")
    tube, tube_outbox = broker.open_tube("bench-agent", "bench")
    router = broker.router
    router.tube_frame(tube, b"c=asbp.register,names=echo,u=1;")
    await tube_outbox.take()
    reply_head = b"c=echo.reply,d=" + channel.id.encode() + b",u="
    routing = writing = 0.0
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
            began = clock()
            await broker.event_log.flush()
            writing += clock() - began
        await channel_outbox.take()
        await tube_outbox.take()
        done += block
    router.close_tube(tube)
    broker.close_channel(channel)
    return routing, writing


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="asbp-bench-eventlog-") as tmp:
        brokers: dict[str, Broker] = {}
        for mode in ("on", "off"):
            config = GatewayConfig(
                broker_id=f"bench-{mode}",
                data_dir=Path(tmp) / mode,
                event_log=EventLogConfig(mode=mode),
                agents={"bench-agent": {}},
                channels=ChannelLimits(outbox_frames=2 * BLOCK),
                tubes=TubeLimits(outbox_frames=2 * BLOCK),
            )
            broker = Broker(config, broker_id=f"bench-{mode}", credentials=None)
            await broker.start()
            brokers[mode] = broker
        try:
            for broker in brokers.values():  # warm-up
                await one_run(broker, min(args.trips, 2000))
            results: dict[str, list[tuple[float, float]]] = {"on": [], "off": []}
            for repeat in range(args.repeats):
                for mode in ("on", "off") if repeat % 2 == 0 else ("off", "on"):
                    results[mode].append(await one_run(brokers[mode], args.trips))
        finally:
            for broker in brokers.values():
                await broker.stop()
        on_log = brokers["on"].event_log
        assert on_log is not None
        print(
            f"{args.trips} round trips (2 Commands each) x {args.repeats} repeats; "
            "CPU us per round trip, median (min)"
        )
        print(f"{'log':<6}{'routing':>18}{'writing':>18}{'total':>18}")
        totals = {}

        def cell(values: list[float]) -> str:
            per_trip = [v / args.trips * 1e6 for v in values]
            return f"{statistics.median(per_trip):.2f} ({min(per_trip):.2f})"

        for mode, runs in results.items():
            totals[mode] = statistics.median(r + w for r, w in runs) / args.trips * 1e6
            print(
                f"{mode:<6}{cell([r for r, _ in runs]):>18}{cell([w for _, w in runs]):>18}"
                f"{cell([r + w for r, w in runs]):>18}"
            )
        extra = totals["on"] - totals["off"]
        print(
            f"\nthe log adds {extra:.2f} us per round trip ({extra / 2:.2f} us per Command), "
            f"{100 * extra / totals['off']:.1f}% of the routing time; on/off time ratio "
            f"{totals['on'] / totals['off']:.3f}"
        )
        print(f"events written {on_log.written}, dropped {on_log.dropped}, lost {on_log.lost}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    parser.add_argument("--trips", type=int, default=20_000, help="round trips per run")
    parser.add_argument("--repeats", type=int, default=5, help="alternating runs per broker")
    asyncio.run(main(parser.parse_args()))
