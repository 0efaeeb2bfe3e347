"""The ``asbp`` streaming source's throughput against Spark's ``rate`` source, same run.

    python bench/spark_source.py [--messages N] [--repeats R] [--payload BYTES]
                                 [--prefetch P] [--quick]

Starts its own ``redis-server`` (tests.support.RedisServer) and a broker
process on it (``python -m gateway --engine redis``, ``prefetch`` P), one
local[2] SparkSession, and measures, interleaved, ``--repeats`` times:

``asbp``
    N messages of ``--payload`` bytes are published to a fresh queue first
    (not timed); then ``spark.readStream.format("asbp")`` (type QUEUE,
    ``prefetch`` P, 4 polls in flight, WAL fsync on, default ``maxBacklog``
    10,000) feeds a ``noop`` sink with ``Trigger.AvailableNow`` until the
    queue is drained. Every row is taken from the broker, written to the WAL,
    fsynced, planned, read and acknowledged.
``rate``
    ``spark.readStream.format("rate")`` at ``rowsPerSecond`` far above what
    Spark can process (so every batch holds what accumulated while the last
    one ran), into the same ``noop`` sink, until it has processed N rows.

Rows per second, for both, is Spark's own measure summed over the run: the
rows of every batch over the batches' ``triggerExecution`` time (offsets,
planning, execution and commit), so the query's start-up, the same for both,
is left out. The asbp run's wall time from ``start()`` to the end is printed
too. Medians of the repeats and the ratio asbp/rate (per repeat, then the
median) are printed. The machine has 2 cores shared by Spark's JVM, its Python
workers, the broker and Redis: trust medians and ratios, not one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pyspark.sql import SparkSession  # noqa: E402  # after the sys.path line above
from pyspark.sql.streaming.query import StreamingQuery  # noqa: E402

from agents.messaging import MessagingClient, Publication, publish_all  # noqa: E402
from agents.spark.datasource import register  # noqa: E402
from agents.spark.session import session  # noqa: E402
from tests.support import RedisServer  # noqa: E402

START_TIMEOUT = 60.0


@contextmanager
def broker(redis_url: str, directory: Path, prefetch: int) -> Iterator[str]:
    """A broker process on Redis; yields its Channel URL (``ws://.../asbp``)."""
    config = directory / "bench.toml"
    config.write_text(
        f"[messaging]\nprefetch = {prefetch}\nmax_queue_depth = 1000000000\n"
        '[event_log]\nmode = "off"\n'
    )
    process = subprocess.Popen(
        [
            sys.executable, "-m", "gateway",
            "--config", str(config),
            "--engine", "redis", "--redis-url", redis_url,
            "--host", "127.0.0.1", "--port", "0", "--server", "uvicorn",
            "--data-dir", str(directory / "broker"),
            "--log-format", "json",
        ],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert process.stderr is not None
    try:
        url = None
        deadline = time.monotonic() + START_TIMEOUT
        while url is None and time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line:
                raise RuntimeError("the broker exited before listening")
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "listening":
                url = str(event["url"]).replace("http://", "ws://", 1) + "/asbp"
        if url is None:
            raise RuntimeError("the broker did not listen in time")
        # The broker logs little once running (event log off), so its stderr pipe
        # cannot fill while we hold it unread.
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait()


def fill(url: str, queue: str, messages: int, payload: bytes) -> None:
    async def run() -> None:
        async with MessagingClient.websocket(url) as client:
            await publish_all(
                client, (Publication(queue, payload, type="QUEUE") for _ in range(messages))
            )

    asyncio.run(run())


def spark_rate(progress: list[dict[str, Any]]) -> tuple[int, float]:
    """Rows, and rows per second of triggerExecution, over the batches that had rows."""
    rows = sum(int(p["numInputRows"]) for p in progress)
    millis = sum(int(p["durationMs"]["triggerExecution"]) for p in progress if p["numInputRows"])
    return rows, rows / (millis / 1000) if millis else 0.0


def progress_of(query: StreamingQuery, seen: dict[int, dict[str, Any]]) -> None:
    for update in query.recentProgress:
        seen[int(update["batchId"])] = update


def run_asbp(
    spark: SparkSession, url: str, work: Path, messages: int, payload: bytes, prefetch: int
) -> tuple[float, float]:
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    fill(url, queue, messages, payload)
    frame = (
        spark.readStream.format("asbp")
        .option("url", url)
        .option("type", "QUEUE")
        .option("destination", queue)
        .option("walPath", str(work / queue / "wal"))
        .option("prefetch", str(prefetch))
        .option("parallelPolls", "4")
        .option("numPartitions", "2")
        .load()
    )
    began = time.perf_counter()
    query = (
        frame.writeStream.format("noop")
        .trigger(availableNow=True)
        .option("checkpointLocation", str(work / queue / "checkpoint"))
        .start()
    )
    query.awaitTermination()
    wall = time.perf_counter() - began
    seen: dict[int, dict[str, Any]] = {}
    progress_of(query, seen)
    rows, rate = spark_rate(list(seen.values()))
    if rows != messages:
        raise RuntimeError(f"asbp: {rows} rows for {messages} messages")
    return rate, messages / wall


def run_rate(spark: SparkSession, work: Path, messages: int) -> float:
    name = f"rate-{uuid.uuid4().hex[:8]}"
    frame = spark.readStream.format("rate").option("rowsPerSecond", "2000000").load()
    query = (
        frame.writeStream.format("noop")
        .option("checkpointLocation", str(work / name / "checkpoint"))
        .start()
    )
    seen: dict[int, dict[str, Any]] = {}
    try:
        while sum(int(p["numInputRows"]) for p in seen.values()) < messages:
            # A bench, not a test: wake up every second to read the progress.
            query.awaitTermination(1)
            progress_of(query, seen)
    finally:
        query.stop()
    return spark_rate(list(seen.values()))[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=30_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--payload", type=int, default=100)
    parser.add_argument("--prefetch", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="1 repeat of 5,000 messages")
    args = parser.parse_args()
    if args.quick:
        args.messages, args.repeats = 5_000, 1
    payload = b"x" * args.payload

    with tempfile.TemporaryDirectory(prefix="asbp-spark-bench-") as temporary:
        work = Path(temporary)
        with RedisServer(work / "redis") as redis, broker(redis.url, work, args.prefetch) as url:
            spark = session(
                "asbp-bench", master="local[2]", conf={"spark.ui.showConsoleProgress": "false"}
            )
            spark.sparkContext.setLogLevel("FATAL")
            register(spark)
            try:
                # Warm-up, not counted: the JVM's JIT and the Python workers' imports.
                run_asbp(spark, url, work, 1_000, payload, args.prefetch)
                run_rate(spark, work, 100_000)
                results: dict[str, list[float]] = {"asbp": [], "asbp wall": [], "rate": []}
                ratios: list[float] = []
                for repeat in range(args.repeats):
                    order = ["asbp", "rate"] if repeat % 2 == 0 else ["rate", "asbp"]
                    got: dict[str, float] = {}
                    for target in order:
                        if target == "asbp":
                            got["asbp"], got["asbp wall"] = run_asbp(
                                spark, url, work, args.messages, payload, args.prefetch
                            )
                        else:
                            got["rate"] = run_rate(spark, work, args.messages)
                    for key, value in got.items():
                        results[key].append(value)
                    ratios.append(got["asbp"] / got["rate"])
                    print(
                        f"repeat {repeat + 1}: asbp {got['asbp']:,.0f} rows/s"
                        f" (wall {got['asbp wall']:,.0f}), rate {got['rate']:,.0f} rows/s,"
                        f" ratio {ratios[-1]:.4f}",
                        flush=True,
                    )
            finally:
                spark.stop()

    print(
        f"\n{args.messages:,} messages of {args.payload} bytes, broker and source prefetch"
        f" {args.prefetch}, {args.repeats} repeats, medians:"
    )
    print(f"  asbp source   {statistics.median(results['asbp']):>12,.0f} rows/s (triggerExecution)")
    print(
        f"  asbp source   {statistics.median(results['asbp wall']):>12,.0f} rows/s"
        " (wall, start-up included)"
    )
    print(f"  rate source   {statistics.median(results['rate']):>12,.0f} rows/s (triggerExecution)")
    print(f"  ratio asbp/rate {statistics.median(ratios):.4f}")


if __name__ == "__main__":
    main()
