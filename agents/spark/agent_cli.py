"""``python -m agents.spark.agent``: serve ``analytics.query`` over the bus from a Spark job.

The command line of :class:`~agents.spark.agent.SparkApplicationAgent` (docs/spark.md,
"Spark jobs as Application-Agents"): which table to serve, from the event log or from
Parquet, and which brokers to dial. ``agents/spark/agent.py`` runs :func:`run` when it is
the main module, so ``spark-submit agents/spark/agent.py`` works too.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession

from agents.credentials import AgentCredentialSource
from agents.spark.agent import QUERY, SparkApplicationAgent

__all__ = ["main", "parse_args", "run"]


def _read_events(spark: SparkSession, source: str) -> DataFrame:
    """The event log: NDJSON files under a path, or a Redis Stream at a ``redis://`` URL."""
    # Only the entry point needs the reader (and its optional Data Source).
    from agents.spark.events import RedisStreamSource, read_events

    if source.startswith(("redis://", "rediss://", "unix://")):
        return read_events(spark, RedisStreamSource(source))
    return read_events(spark, source)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    env = os.environ
    parser = argparse.ArgumentParser(
        prog="python -m agents.spark.agent",
        description="Serve analytics.query over the bus from a Spark job.",
    )
    parser.add_argument(
        "--url",
        action="append",
        dest="urls",
        help="a broker's Tube URL; repeat for several (env ASBP_TUBE_URLS, comma-separated)",
    )
    parser.add_argument("--identity", default=env.get("ASBP_AGENT_ID", "analytics"))
    parser.add_argument("--key-file", default=env.get("ASBP_AGENT_KEY_FILE"))
    parser.add_argument("--audience", default=env.get("ASBP_AUDIENCE", "asbp-broker"))
    parser.add_argument(
        "--events",
        metavar="SOURCE",
        help="serve the event log: NDJSON files (a directory) or a redis:// URL (its stream)",
    )
    parser.add_argument("--parquet", metavar="PATH", help="serve the Parquet data at PATH")
    parser.add_argument("--table", default="events", help="the table's name in queries")
    parser.add_argument("--rows-per-part", type=int, default=500)
    parser.add_argument("--max-rows", type=int, default=100_000)
    parser.add_argument("--master", help="the Spark master (default: $SPARK_MASTER, local[2])")
    args = parser.parse_args(argv)
    if not args.urls:
        urls = env.get("ASBP_TUBE_URLS", "ws://127.0.0.1:8080/tube")
        args.urls = [url.strip() for url in urls.split(",") if url.strip()]
    if not args.key_file:
        parser.error("--key-file (or ASBP_AGENT_KEY_FILE) is required")
    if (args.events is None) == (args.parquet is None):
        parser.error("give one of --events SOURCE and --parquet PATH")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Serve one table until SIGINT or SIGTERM."""
    from agents.spark.session import session

    args = parse_args(argv)
    spark = session("asbp-spark-agent", master=args.master)
    if args.events is not None:
        table = _read_events(spark, args.events)
    else:
        table = spark.read.parquet(args.parquet)
    credentials = AgentCredentialSource.from_file(
        args.identity, args.key_file, audience=args.audience
    )
    agent = SparkApplicationAgent(
        spark,
        args.identity,
        credentials,
        args.urls,
        tables={args.table: table},
        rows_per_part=args.rows_per_part,
        max_rows=args.max_rows,
    )
    print(f"serving {QUERY} on table {args.table!r} at {', '.join(args.urls)}", file=sys.stderr)
    agent.run()
    return 0


def run() -> int:
    """``main`` with logging set up, as ``python -m agents.spark.agent`` runs it."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    return main()


if __name__ == "__main__":
    raise SystemExit(run())
