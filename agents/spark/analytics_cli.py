"""``asbp analytics``: parse the options, run the job, print and publish the summary.

The job is the SDK's, so its command line is too: ``asbp analytics ARGS`` (the
broker's CLI, ``gateway.ops.cli``) and ``python -m agents.spark.analytics ARGS``
both hand ``ARGS`` to :func:`main`. The broker's CLI imports this module only
when the subcommand runs, and this module imports nothing from the broker, so
the SDK stands alone and the two never import each other. pyspark is imported
only once the options are known to be good; without it (no ``spark`` extra)
the command says how to install it instead of failing with a traceback.

Exit status: 0 when the results are written (and the summary published, if
asked); 2 for bad options; 1 when pyspark is missing, the log cannot be read
or the summary cannot be published (the Parquet results are written by then).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import ssl as ssl_module
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Final

import orjson

from agents.credentials import AgentCredentialSource
from agents.errors import AgentError
from asbp.eventlog import STREAM_KEY

__all__ = [
    "DESCRIPTION",
    "EXIT_FAILURE",
    "EXIT_USAGE",
    "INSTALL_HINT",
    "add_arguments",
    "analytics",
    "build_parser",
    "main",
    "parse_time",
]

#: Bad options (argparse's own status for usage errors).
EXIT_USAGE: Final = 2
#: The log could not be read, or the summary not published.
EXIT_FAILURE: Final = 1
#: Set by spark-submit for the Python driver it starts (the JVM is already up).
_UNDER_SPARK_SUBMIT: Final = "PYSPARK_GATEWAY_PORT"
#: How to get what the job needs (pyproject.toml's ``spark`` extra).
INSTALL_HINT: Final = "pip install 'asbp-gateway[spark]'"
#: The top-level modules of the ``spark`` extra: one of them missing means the
#: extra is not installed, and any other missing module is a real bug to show.
_SPARK_EXTRA: Final = frozenset({"pyspark", "py4j", "pyarrow", "pandas"})
#: What ``asbp --help`` and ``asbp analytics --help`` say the job does.
DESCRIPTION: Final = (
    "Read the event log, write traffic, fault, latency and busiest-destination "
    "figures as Parquet under --output, print a JSON summary and, given --bus-url, "
    "publish it to /system/stats/analytics. See docs/spark.md."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``asbp analytics`` to ``parser``."""
    source = parser.add_argument_group("the event log (one of)").add_mutually_exclusive_group(
        required=True
    )
    source.add_argument(
        "--events", metavar="PATH", help="NDJSON event files: a directory, a file or a glob"
    )
    source.add_argument("--redis-url", metavar="URL", help="read the Redis Stream at this URL")
    parser.add_argument(
        "--stream", default=STREAM_KEY, help="the stream's key (default: %(default)s)"
    )
    parser.add_argument(
        "--partitions", type=int, metavar="N", help="stream ID ranges read in parallel"
    )
    parser.add_argument(
        "--output", required=True, metavar="DIR", help="where the Parquet results go"
    )
    parser.add_argument(
        "--since", metavar="TIME", help="first time (ISO 8601 with a zone, or Unix seconds)"
    )
    parser.add_argument("--until", metavar="TIME", help="end of the window (exclusive)")
    parser.add_argument(
        "--top", type=int, default=10, help="destinations per kind kept (default: %(default)s)"
    )
    parser.add_argument(
        "--accuracy",
        type=int,
        default=10_000,
        help="percentile_approx accuracy: rank error <= events/accuracy (default: %(default)s)",
    )
    parser.add_argument(
        "--master", help="Spark master (default: $SPARK_MASTER, else local[2]; spark-submit's wins)"
    )
    bus = parser.add_argument_group("publishing the summary (optional)")
    bus.add_argument("--bus-url", metavar="URL", help="the broker's Tube URL, wss://host/tube")
    bus.add_argument("--identity", help="the job's Application-Agent identity")
    bus.add_argument("--key", metavar="FILE", help="the identity's private key (PEM)")
    bus.add_argument(
        "--audience", default="asbp-broker", help="the broker's audience (default: %(default)s)"
    )
    bus.add_argument("--cafile", metavar="FILE", help="CA certificates for wss://")
    bus.add_argument(
        "--insecure", action="store_true", help="allow a ws:// URL (development brokers only)"
    )
    bus.add_argument(
        "--timeout", type=float, default=10.0, help="seconds to publish (default: %(default)s)"
    )


def build_parser(prog: str = "asbp analytics") -> argparse.ArgumentParser:
    """The job's whole command line, named ``prog`` in usage and errors."""
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None, *, prog: str = "asbp analytics") -> int:
    """Parse ``argv`` (``sys.argv[1:]`` by default), run the job; return the exit status.

    Raises:
        SystemExit: argparse's, for ``--help`` and for options it cannot parse.
    """
    args = build_parser(prog).parse_args(argv)
    return analytics(args, prog=prog)


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
    try:
        from pyspark.sql import SparkSession

        from agents.spark.analytics import TimeWindow, run
        from agents.spark.events import (
            EventSource,
            EventSourceError,
            NdjsonSource,
            RedisStreamSource,
        )
        from agents.spark.session import session
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in _SPARK_EXTRA:
            raise
        print(f"{prog}: needs {exc.name}, which is not installed: {INSTALL_HINT}", file=sys.stderr)
        return EXIT_FAILURE

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
