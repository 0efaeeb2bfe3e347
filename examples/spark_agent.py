"""A Spark job as an Application-Agent, and a User-Agent that queries it.

``serve`` runs the agent: ``analytics.query`` over a ``pages`` table (a small
built-in table of page views, or the broker's event log as ``events`` with
``--events``), plus a Spark Respondent of its own, ``analytics.top_pages``,
which takes ``{"n": 3}`` and answers with the ``n`` most viewed pages. ``ask``
sends a query and prints each part as it arrives (``o`` of ``t``), then the
reassembled rows::

    python -c "from agents import generate_agent_key as g; k, p = g(); \\
        open('analytics.key', 'w').write(k); open('analytics.pem', 'w').write(p)"
    asbp broker --insecure-dev-tubes ...   # with [agents.analytics] public_key = "analytics.pem"
    python examples/spark_agent.py serve --url ws://127.0.0.1:8080/tube --key-file analytics.key
    python examples/spark_agent.py ask --url ws://127.0.0.1:8080/asbp \\
        --query '{"table": "pages", "group_by": ["page"], "aggregate": [{"fn": "count"}]}'
    python examples/spark_agent.py ask --url ws://127.0.0.1:8080/asbp \\
        --name analytics.top_pages --query '{"n": 2}'

``serve`` stops gracefully on Ctrl-C or SIGTERM. It needs the ``spark`` extra
and Java 17; ``ask`` needs neither.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any, TextIO

from agents import AgentCredentialSource, Request, UserAgent
from agents.spark.parts import fetch
from agents.streams import StreamPart

#: The built-in table: (page, visitor, seconds on the page).
VIEWS = [
    ("/", "ann", 12.5),
    ("/", "bob", 3.0),
    ("/blog", "ann", 95.0),
    ("/", "cyd", 7.25),
    ("/about", "bob", 20.0),
    ("/blog", "cyd", 41.0),
    ("/", "dee", 1.5),
]


def serve(
    args: argparse.Namespace,
    *,
    spark: Any = None,
    stop: threading.Event | None = None,
    ready: threading.Event | None = None,
) -> int:
    """Run the agent until ``stop`` is set (or, without one, until SIGINT or SIGTERM)."""
    # Imported here: only the agent needs pyspark.
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F

    from agents.spark.agent import SparkApplicationAgent
    from agents.spark.query import QueryError
    from agents.spark.session import session

    spark = spark or session("spark-agent-example")
    tables: dict[str, DataFrame | str] = {
        "pages": spark.createDataFrame(VIEWS, "page string, visitor string, seconds double")
    }
    if args.events:
        from agents.spark.events import read_events

        tables["events"] = read_events(spark, args.events)
    credentials = AgentCredentialSource.from_file(
        args.identity, args.key_file, audience=args.audience
    )
    agent = SparkApplicationAgent(
        spark, args.identity, credentials, args.urls, tables=tables, rows_per_part=2
    )

    @agent.respondent("analytics.top_pages")
    def top_pages(spark: SparkSession, request: Request) -> DataFrame:
        n = json.loads(request.body or b"{}").get("n", 3)
        if type(n) is not int or not 0 < n <= 100:
            raise QueryError("'n' must be a whole number from 1 to 100")
        views = tables["pages"]
        assert isinstance(views, DataFrame)
        counted = views.groupBy("page").agg(F.count(F.lit(1)).alias("views"))
        return counted.orderBy(F.col("views").desc(), "page").limit(n)

    if stop is None:
        print(f"serving {sorted(tables)} at {', '.join(args.urls)}", file=sys.stderr)
        agent.run()
        return 0
    with agent:
        agent.wait_registered(30)
        if ready is not None:
            ready.set()
        stop.wait()
    return 0


async def ask(args: argparse.Namespace, out: TextIO) -> int:
    """Send one query; print the parts as they come, then the rows."""

    def progress(part: StreamPart) -> None:
        print(f"part {part.position} of {part.total}", file=out)

    async with UserAgent.websocket(args.url) as ua:
        result = await fetch(ua, json.loads(args.query), name=args.name, progress=progress)
    print(" | ".join(column.name for column in result.columns), file=out)
    for row in result.rows:
        print(" | ".join(str(value) for value in row.values()), file=out)
    if result.truncated:
        print("(truncated)", file=out)
    return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    env = os.environ
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    agent = commands.add_parser("serve", help="run the Spark agent")
    agent.add_argument("--url", action="append", dest="urls", help="a broker's Tube URL")
    agent.add_argument("--identity", default=env.get("ASBP_AGENT_ID", "analytics"))
    agent.add_argument("--key-file", default=env.get("ASBP_AGENT_KEY_FILE"))
    agent.add_argument("--audience", default=env.get("ASBP_AUDIENCE", "asbp-broker"))
    agent.add_argument("--events", help="also serve the event log (NDJSON files or redis://)")
    client = commands.add_parser("ask", help="query the agent as a User-Agent")
    client.add_argument("--url", default=env.get("ASBP_URL", "ws://127.0.0.1:8080/asbp"))
    client.add_argument("--name", default="analytics.query")
    client.add_argument("--query", default='{"table": "pages"}')
    args = parser.parse_args(argv)
    if args.command == "serve":
        args.urls = args.urls or ["ws://127.0.0.1:8080/tube"]
        if not args.key_file:
            parser.error("--key-file (or ASBP_AGENT_KEY_FILE) is required")
    return args


def main(
    argv: Sequence[str] | None = None,
    *,
    spark: Any = None,
    stop: threading.Event | None = None,
    ready: threading.Event | None = None,
    out: TextIO = sys.stdout,
) -> int:
    """``serve`` or ``ask``; the keywords let a test share its SparkSession and stop it."""
    args = parse_args(argv)
    if args.command == "serve":
        return serve(args, spark=spark, stop=stop, ready=ready)
    return asyncio.run(ask(args, out))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    raise SystemExit(main())
