"""``asbp analytics``: run the job from parsed options, print and publish the summary.

The options are defined beside the other subcommands
(:func:`gateway.ops.cli.add_analytics_arguments`); this module does the work, and
is imported only when the subcommand runs, so the broker never imports pyspark.

Exit status: 0 when the results are written (and the summary published, if
asked); 2 for bad options; 1 when the log cannot be read or the summary cannot
be published (the Parquet results are written by then).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import ssl as ssl_module
import sys
from datetime import datetime
from typing import Final

import orjson

from agents.credentials import AgentCredentialSource
from agents.errors import AgentError

__all__ = ["EXIT_FAILURE", "EXIT_USAGE", "analytics", "parse_time"]

#: Bad options (argparse's own status for usage errors).
EXIT_USAGE: Final = 2
#: The log could not be read, or the summary not published.
EXIT_FAILURE: Final = 1
#: Set by spark-submit for the Python driver it starts (the JVM is already up).
_UNDER_SPARK_SUBMIT: Final = "PYSPARK_GATEWAY_PORT"


def parse_time(text: str) -> float:
    """Unix seconds from ``1763712000`` or ``2025-11-21T08:00:00Z`` (a zone is required).

    Raises:
        ValueError: neither, or an ISO time without a zone.
    """
    try:
        return float(text)
    except ValueError:
        pass
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone (add Z or +00:00)")
    return moment.timestamp()


def analytics(args: argparse.Namespace, *, prog: str = "asbp analytics") -> int:
    """Run the job as ``args`` say; return the exit status."""

    def usage(message: str) -> int:
        print(f"{prog}: {message}", file=sys.stderr)
        return EXIT_USAGE

    try:
        since = None if args.since is None else parse_time(args.since)
        until = None if args.until is None else parse_time(args.until)
    except ValueError as exc:
        return usage(f"--since/--until: {exc}")
    if args.top < 1 or args.accuracy < 1:
        return usage("--top and --accuracy must be at least 1")
    if args.partitions is not None and args.partitions < 1:
        return usage("--partitions must be at least 1")
    credentials: AgentCredentialSource | None = None
    ssl: ssl_module.SSLContext | None = None
    if args.bus_url is not None:
        if args.identity is None or args.key is None:
            return usage("--bus-url needs --identity and --key")
        if args.bus_url.startswith("ws://") and not args.insecure:
            return usage("a ws:// Tube sends the credential in clear; use wss:// or --insecure")
        try:
            # Read the key before the job runs, so a bad key fails in a second, not after it.
            credentials = AgentCredentialSource.from_file(
                args.identity, args.key, audience=args.audience
            )
        except ValueError as exc:
            return usage(f"--key: {exc}")
        if args.cafile is not None:
            ssl = ssl_module.create_default_context(cafile=args.cafile)
    elif args.identity is not None or args.key is not None:
        return usage("--identity and --key are for publishing: give --bus-url too")

    # pyspark is imported only now that the options are known to be good.
    from pyspark.sql import SparkSession

    from agents.spark.analytics import TimeWindow, run
    from agents.spark.events import EventSource, EventSourceError, NdjsonSource, RedisStreamSource
    from agents.spark.session import session

    source: EventSource
    if args.events is not None:
        source = NdjsonSource(args.events)
    else:
        source = RedisStreamSource(args.redis_url, args.stream, partitions=args.partitions)
    conf = {"spark.sql.session.timeZone": "UTC"}
    if args.master is None and _UNDER_SPARK_SUBMIT in os.environ:
        # spark-submit has chosen the master; session() would set its own default
        # over it (builder options beat spark-submit's), so ask for nothing.
        builder = SparkSession.builder.appName("asbp-analytics")
        spark = builder.config("spark.sql.session.timeZone", "UTC").getOrCreate()
    else:
        spark = session("asbp-analytics", master=args.master, conf=conf)
    try:
        summary = run(
            spark,
            source,
            args.output,
            window=TimeWindow(since, until),
            top=args.top,
            accuracy=args.accuracy,
        )
    except EventSourceError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        spark.stop()
    body = orjson.dumps(summary)
    sys.stdout.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode() + "\n")
    sys.stdout.flush()
    if credentials is None:
        return 0

    from agents.spark.analytics_publish import publish_summary

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        message_id = asyncio.run(
            publish_summary(
                body, url=args.bus_url, credentials=credentials, ssl=ssl, timeout=args.timeout
            )
        )
    except (AgentError, TimeoutError, OSError) as exc:
        print(f"{prog}: the summary was not published: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    print(f"{prog}: published the summary as message {message_id}", file=sys.stderr)
    return 0
