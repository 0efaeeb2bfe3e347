"""The analytics job on a million events, against just reading them, in local[2].

    python bench/analytics.py [--events N] [--runs R] [--redis] [--driver] [--cold]

Generates a log of ``--events`` events (default 1,000,000, over one hour, in
ten rotated NDJSON files written by the event log's own ``Event.to_json``) and,
with ``--redis``, the same events as a Redis Stream on a private redis-server
(IDs from the event times). Then, in one SparkSession (``local[2]``), each run
times, in a rotated order:

==================  ===========================================================
job (ndjson)        ``analytics.run``: read, parse, cache, seven aggregates
                    written as Parquet, the summary
read (ndjson)       the baseline: the same files, the same schema, every
                    column parsed (``write.format("noop")``) and nothing else
job (redis)         ``--redis``: the job on the stream (the Data Source)
read (redis)        ``--redis``: the stream through the Data Source, parsed
read (driver)       ``--redis --driver``: the naive way, for comparison: XRANGE
                    on the driver, ``createDataFrame`` from Python rows
==================  ===========================================================

The ratio job / read is what the analytics cost over just reading the log.
Medians over ``--runs``. ``--cold`` also times one ``python -m
agents.spark.analytics`` end to end (JVM start included), once.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.support, when run as a script

import orjson  # noqa: E402  # after the sys.path line above
import redis  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

from agents.spark import analytics  # noqa: E402
from agents.spark.events import EVENT_SCHEMA, RedisStreamSource, read_events  # noqa: E402
from agents.spark.session import session  # noqa: E402
from gateway.eventlog.schema import FIELDS, STREAM_FIELD, Event  # noqa: E402
from tests.support import RedisServer  # noqa: E402

T0 = 1_763_712_000.0
COMMANDS = ("chat.send", "orders.create", "asbp.publish", "asbp.subscribe", "asbp.ping", None)
AGENTS = ("billing", "chat", "search", None)
KINDS = ("group", "topic", "queue", "virtual_queue", "agent", "channel", "broker")


def event(i: int, count: int) -> Event:
    """A plausible event: 200 groups, 500 topics, 50 queues; 2 % faults."""
    kind = KINDS[i % len(KINDS)]
    fault = (2001, 3201, 2104, 2005)[i % 4] if i % 50 == 0 else None
    return Event(
        time=T0 + 3600.0 * i / count,
        broker=f"broker-{i % 3}",
        source_kind="agent" if i % 5 == 0 else "channel",
        source=f"{i % 10_000:032x}",
        subject=None,
        command=COMMANDS[(i * 7) % len(COMMANDS)],
        header_bytes=60 + i % 40,
        body_bytes=(i * 131) % 2000,
        destination_kind=kind,  # type: ignore[arg-type]  # one of DestinationKind
        destination=f"{kind}-{(i * 2654435761) % (500 if kind == 'topic' else 200)}",
        agent=AGENTS[i % len(AGENTS)],
        outcome="fault" if fault else "delivered",
        fault=fault,
        latency_us=(i * 7919) % 3000 + (40_000 if i % 1000 == 0 else 0) + 20,
    )


def generate(directory: Path, count: int, files: int = 10) -> int:
    """Write the NDJSON log; return its size in bytes."""
    directory.mkdir(parents=True, exist_ok=True)
    size = 0
    per_file = -(-count // files)
    for index in range(files):
        lines = [
            event(i, count).to_json()
            for i in range(index * per_file, min(count, (index + 1) * per_file))
        ]
        data = b"\n".join(lines) + b"\n"
        (directory / f"events-20251121T{index:02d}0000000000Z.ndjson").write_bytes(data)
        size += len(data)
    return size


def fill_stream(url: str, key: str, count: int) -> None:
    client = redis.Redis.from_url(url)
    try:
        client.delete(key)
        pipe = client.pipeline(transaction=False)
        last_ms, sequence = -1, 0
        for i in range(count):
            item = event(i, count)
            ms = int(item.time * 1000)
            sequence = sequence + 1 if ms == last_ms else 0
            last_ms = ms
            pipe.xadd(key, {STREAM_FIELD: item.to_json()}, id=f"{ms}-{sequence}")
            if i % 10_000 == 9_999:
                pipe.execute()
        pipe.execute()
    finally:
        client.close()


def read_through_driver(spark: SparkSession, url: str, key: str) -> None:
    """The naive reader: every entry through the driver, rows built in Python."""
    client = redis.Redis.from_url(url)
    rows = []
    try:
        start = "-"
        while True:
            entries: list[tuple[bytes, dict[bytes, bytes]]] = client.xrange(  # type: ignore[assignment]  # bytes without decode_responses
                key, start, "+", count=10_000
            )
            if not entries:
                break
            for _, fields in entries:
                record = orjson.loads(fields[STREAM_FIELD])
                rows.append(tuple(record.get(name) for name in FIELDS))
            start = "(" + entries[-1][0].decode()
    finally:
        client.close()
    spark.createDataFrame(rows, EVENT_SCHEMA).write.format("noop").mode("overwrite").save()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--redis", action="store_true", help="also the Redis Stream")
    parser.add_argument("--driver", action="store_true", help="also the naive driver read")
    parser.add_argument("--cold", action="store_true", help="also one CLI run, JVM included")
    parser.add_argument("--keep", type=Path, help="keep the data in this directory")
    args = parser.parse_args()

    work = args.keep or Path(tempfile.mkdtemp(prefix="asbp-bench-analytics-"))
    log = work / "events"
    started = time.perf_counter()
    size = generate(log, args.events)
    print(
        f"log: {args.events:,} events, {size / 1e6:.0f} MB NDJSON in 10 files "
        f"({time.perf_counter() - started:.1f} s to write)"
    )

    cases: dict[str, Callable[[], object]] = {}
    spark = session(
        "asbp-bench-analytics",
        master="local[2]",
        conf={"spark.sql.session.timeZone": "UTC", "spark.ui.showConsoleProgress": "false"},
    )
    spark.sparkContext.setLogLevel("ERROR")
    cases["job (ndjson)"] = lambda: analytics.run(spark, log, work / "out-ndjson")
    cases["read (ndjson)"] = lambda: (
        spark.read.schema(EVENT_SCHEMA).json(str(log)).write.format("noop").mode("overwrite").save()
    )
    server: RedisServer | None = None
    try:
        if args.redis:
            server = RedisServer(work / "redis")
            server.start()
            started = time.perf_counter()
            fill_stream(server.url, "asbp:events", args.events)
            print(
                f"stream: {args.events:,} entries ({time.perf_counter() - started:.1f} s to XADD)"
            )
            source = RedisStreamSource(server.url)
            cases["job (redis)"] = lambda: analytics.run(spark, source, work / "out-redis")
            cases["read (redis)"] = lambda: (
                read_events(spark, source).write.format("noop").mode("overwrite").save()
            )
            if args.driver:
                url = server.url
                cases["read (driver)"] = lambda: read_through_driver(spark, url, "asbp:events")
        # One warm-up of each, untimed: the first Python worker, JIT, file listing caches.
        for case in cases.values():
            case()
        times: dict[str, list[float]] = {name: [] for name in cases}
        names = list(cases)
        for run in range(args.runs):
            for name in names[run % len(names) :] + names[: run % len(names)]:
                started = time.perf_counter()
                cases[name]()
                times[name].append(time.perf_counter() - started)
        print(f"\nlocal[2], {os.cpu_count()} CPUs, median of {args.runs} runs:")
        medians = {name: statistics.median(values) for name, values in times.items()}
        for name, value in medians.items():
            spread = ", ".join(f"{v:.2f}" for v in times[name])
            print(
                f"  {name:<16} {value:7.2f} s   ({spread})   "
                f"{args.events / value / 1e3:8.0f} k events/s"
            )
        print(f"  job / read (ndjson): {medians['job (ndjson)'] / medians['read (ndjson)']:.2f}")
        if args.redis:
            print(f"  job / read (redis):  {medians['job (redis)'] / medians['read (redis)']:.2f}")
        if args.driver:
            print(
                f"  driver / data source: {medians['read (driver)'] / medians['read (redis)']:.2f}"
            )
    finally:
        spark.stop()
        if server is not None:
            server.stop()
    if args.cold:
        started = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "agents.spark.analytics",
                "--events",
                str(log),
                "--output",
                str(work / "out-cold"),
                "--master",
                "local[2]",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        print(f"  cold CLI run (JVM start included): {time.perf_counter() - started:.2f} s")
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
