"""The analytics job: traffic, faults, latency and the busiest destinations.

::

    asbp analytics --events DATA_DIR/events --output out/
    spark-submit agents/spark/analytics.py --redis-url redis://r:6379/0 --output s3a://b/x/

Each figure is a function from the events DataFrame (:func:`read_events`) to a
result DataFrame, so a notebook or another job can take any one of them.
:func:`run` reads the log once (cached for the several aggregations), writes
every result as Parquet under the output directory, and returns a small JSON
summary, which the CLI publishes on the bus (``/system/stats/analytics``, see
:mod:`agents.spark.analytics_publish`).

Latency percentiles are ``percentile_approx`` (Greenwald-Khanna sketches), not
the exact ``percentile``: the sketch has bounded memory per group whatever the
number or spread of latencies and merges across partitions in one pass, while
the exact aggregate keeps every distinct value of every group. Its error is in
rank: the value returned for ``p`` has a rank within ``n / accuracy`` of
``p * n`` (``accuracy`` defaults to 10,000, so ±0.01 % of the events); for fewer
than ``accuracy`` events per group it is exact, the nearest-rank percentile
(the smallest latency with at least ``p * n`` events at or below it). Latency
is that of delivered Commands only: a fault is usually answered before any
routing, and a flood of refused frames would otherwise hide slow routing. Faults
have their own figures.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import orjson
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from agents.spark.events import EventSource, read_events

__all__ = [
    "DEFAULT_ACCURACY",
    "DEFAULT_TOP",
    "DESTINATION_KINDS",
    "PERCENTILES",
    "RESULTS",
    "SUMMARY_VERSION",
    "USED_COLUMNS",
    "TimeWindow",
    "busiest_destinations",
    "faults_by_code",
    "faults_by_minute",
    "latency",
    "latency_by_command",
    "main",
    "run",
    "summary",
    "traffic_by_agent",
    "traffic_by_command",
]

#: The percentiles of routing latency, as fractions.
PERCENTILES: Final = (0.5, 0.95, 0.99)
#: ``percentile_approx``'s accuracy: the rank error is at most ``n / accuracy``.
DEFAULT_ACCURACY: Final = 10_000
#: Destinations per kind kept by :func:`busiest_destinations` and in the summary.
DEFAULT_TOP: Final = 10
#: The destination kinds ranked by :func:`busiest_destinations`.
DESTINATION_KINDS: Final = ("group", "topic", "queue", "virtual_queue")
#: The event columns the results read; :func:`run` caches only these.
USED_COLUMNS: Final = (
    "time",
    "timestamp",
    "command",
    "agent",
    "outcome",
    "fault",
    "destination_kind",
    "destination",
    "header_bytes",
    "body_bytes",
    "latency_us",
)
#: Bumped when a summary field changes meaning or goes away.
SUMMARY_VERSION: Final = 1


def _minute() -> Column:
    return F.date_trunc("minute", F.col("timestamp")).alias("minute")


def _is_fault() -> Column:
    return (F.col("outcome") == "fault").cast("long")


def _traffic() -> list[Column]:
    return [
        F.count(F.lit(1)).alias("events"),
        F.sum(_is_fault()).alias("faults"),
        F.sum(F.col("header_bytes") + F.col("body_bytes")).alias("bytes"),
    ]


def traffic_by_command(events: DataFrame) -> DataFrame:
    """Per minute and Command-Name: ``minute, command, events, faults, bytes``.

    ``command`` is null for frames that never decoded.
    """
    return events.groupBy(_minute(), "command").agg(*_traffic())


def traffic_by_agent(events: DataFrame) -> DataFrame:
    """Per minute and Application-Agent: ``minute, agent, events, faults, bytes``.

    Only events with an agent on either end count.
    """
    return events.where(F.col("agent").isNotNull()).groupBy(_minute(), "agent").agg(*_traffic())


def faults_by_code(events: DataFrame) -> DataFrame:
    """Per fault code: ``fault, faults, rate``; ``rate`` is faults / all events."""
    total = events.agg(F.count(F.lit(1)).alias("total"))
    return (
        events.where(F.col("outcome") == "fault")
        .groupBy("fault")
        .agg(F.count(F.lit(1)).alias("faults"))
        .crossJoin(total)
        .select("fault", "faults", (F.col("faults") / F.col("total")).alias("rate"))
    )


def faults_by_minute(events: DataFrame) -> DataFrame:
    """Per minute: ``minute, events, faults, rate``."""
    return (
        events.groupBy(_minute())
        .agg(F.count(F.lit(1)).alias("events"), F.sum(_is_fault()).alias("faults"))
        .withColumn("rate", F.col("faults") / F.col("events"))
    )


def _latency(accuracy: int) -> list[Column]:
    quantiles = F.percentile_approx("latency_us", list(PERCENTILES), accuracy)
    return [
        F.count(F.lit(1)).alias("events"),
        quantiles[0].alias("p50_us"),
        quantiles[1].alias("p95_us"),
        quantiles[2].alias("p99_us"),
        F.max("latency_us").alias("max_us"),
        F.avg("latency_us").alias("mean_us"),
    ]


def latency(events: DataFrame, *, accuracy: int = DEFAULT_ACCURACY) -> DataFrame:
    """Routing latency of delivered Commands, one row: ``events, p50_us, p95_us,
    p99_us, max_us, mean_us`` (see the module docstring for the accuracy)."""
    return events.where(F.col("outcome") == "delivered").agg(*_latency(accuracy))


def latency_by_command(events: DataFrame, *, accuracy: int = DEFAULT_ACCURACY) -> DataFrame:
    """:func:`latency` per Command-Name: ``command, events, p50_us, ...``."""
    delivered = events.where(F.col("outcome") == "delivered")
    return delivered.groupBy("command").agg(*_latency(accuracy))


def busiest_destinations(events: DataFrame, *, top: int = DEFAULT_TOP) -> DataFrame:
    """The ``top`` destinations of each kind in :data:`DESTINATION_KINDS` by events.

    Columns: ``destination_kind, rank, destination, events, faults, bytes``; ties
    in events rank by name, so the result is deterministic. A Command sent to
    several groups counts once for each.
    """
    ranked = Window.partitionBy("destination_kind").orderBy(
        F.col("events").desc(), F.col("destination").asc()
    )
    # One Command to several groups (g) records them joined with ","; each counts.
    names = F.when(
        F.col("destination_kind") == "group", F.split(F.col("destination"), ",")
    ).otherwise(F.array(F.col("destination")))
    return (
        events.where(
            F.col("destination_kind").isin(*DESTINATION_KINDS) & F.col("destination").isNotNull()
        )
        .withColumn("destination", F.explode(names))
        .groupBy("destination_kind", "destination")
        .agg(*_traffic())
        .withColumn("rank", F.row_number().over(ranked))
        .where(F.col("rank") <= top)
        .select("destination_kind", "rank", "destination", "events", "faults", "bytes")
    )


@dataclass(frozen=True, slots=True)
class TimeWindow:
    """The time window asked for; either end may be open (None). Unix seconds."""

    since: float | None = None
    until: float | None = None


#: The results :func:`run` writes: directory name -> how it is computed.
RESULTS: Final[Mapping[str, Callable[[DataFrame, int, int], DataFrame]]] = {
    "traffic_by_command": lambda e, _top, _acc: traffic_by_command(e),
    "traffic_by_agent": lambda e, _top, _acc: traffic_by_agent(e),
    "faults_by_code": lambda e, _top, _acc: faults_by_code(e),
    "faults_by_minute": lambda e, _top, _acc: faults_by_minute(e),
    "latency": lambda e, _top, acc: latency(e, accuracy=acc),
    "latency_by_command": lambda e, _top, acc: latency_by_command(e, accuracy=acc),
    "busiest_destinations": lambda e, top, _acc: busiest_destinations(e, top=top),
}


def run(
    spark: SparkSession,
    source: EventSource | str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    window: TimeWindow = TimeWindow(),
    top: int = DEFAULT_TOP,
    accuracy: int = DEFAULT_ACCURACY,
) -> dict[str, Any]:
    """Compute every result, write each as Parquet under ``output``, return the summary.

    ``output/<name>/`` for each name in :data:`RESULTS` (overwritten), and
    ``output/summary.json`` when ``output`` is a local path.

    Raises:
        EventSourceError: the log cannot be read.
        ValueError: ``top`` or ``accuracy`` below 1.
    """
    if top < 1 or accuracy < 1:
        raise ValueError("top and accuracy must be at least 1")
    events = read_events(spark, source, since=window.since, until=window.until)
    # Every result scans the log: parse it once, and only the columns the
    # results use (the JSON reader then skips converting the others).
    events = events.select(*USED_COLUMNS).persist(StorageLevel.MEMORY_AND_DISK)
    out = os.fspath(output)
    # Aggregates are small: one file each, and kept for the summary rather than
    # read back. coalesce adds no shuffle; it only runs the final stage as one task.
    results = {
        name: make(events, top, accuracy).coalesce(1).persist(StorageLevel.MEMORY_AND_DISK)
        for name, make in RESULTS.items()
    }
    try:
        for name, result in results.items():
            result.write.mode("overwrite").parquet(f"{out.rstrip('/')}/{name}")
        report = summary(results, events, window=window, top=top)
    finally:
        for result in results.values():
            result.unpersist()
        events.unpersist()
    if "://" not in out or out.startswith("file:"):
        local = Path(out.removeprefix("file:"))
        (local / "summary.json").write_bytes(
            orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n"
        )
    return report


def summary(
    results: Mapping[str, DataFrame],
    events: DataFrame,
    *,
    window: TimeWindow = TimeWindow(),
    top: int = DEFAULT_TOP,
) -> dict[str, Any]:
    """The summary of a run, from its ``results`` (name -> DataFrame, as in
    :data:`RESULTS`) and the ``events`` they came from.

    Small enough to publish (a few kB): totals, the fault rate, fault counts by
    code, the latency percentiles, the ``top`` Command-Names, agents and
    destinations of each kind, and the window covered.
    """
    totals = events.agg(
        F.count(F.lit(1)).alias("events"),
        F.coalesce(F.sum(_is_fault()), F.lit(0)).alias("faults"),
        F.min("time").alias("first"),
        F.max("time").alias("last"),
    ).first()
    assert totals is not None  # an aggregate without grouping has one row
    count = int(totals["events"])
    faults = int(totals["faults"])
    overall = results["latency"].first()
    by_code = results["faults_by_code"].orderBy(F.col("faults").desc())
    commands = (
        results["traffic_by_command"]
        .groupBy("command")
        .agg(F.sum("events").alias("events"), F.sum("faults").alias("faults"))
        .orderBy(F.col("events").desc(), F.col("command").asc_nulls_last())
        .limit(top)
    )
    agents = (
        results["traffic_by_agent"]
        .groupBy("agent")
        .agg(F.sum("events").alias("events"), F.sum("faults").alias("faults"))
        .orderBy(F.col("events").desc(), F.col("agent").asc())
        .limit(top)
    )
    destinations: dict[str, list[dict[str, Any]]] = {kind: [] for kind in DESTINATION_KINDS}
    for row in (
        results["busiest_destinations"]
        .where(F.col("rank") <= top)
        .orderBy("destination_kind", "rank")
        .collect()
    ):
        destinations[row["destination_kind"]].append(
            {"destination": row["destination"], "events": row["events"], "faults": row["faults"]}
        )
    latency_us = {
        f"p{round(p * 100)}": None if overall is None else overall[f"p{round(p * 100)}_us"]
        for p in PERCENTILES
    }
    if overall is not None:
        latency_us["max"] = overall["max_us"]
    return {
        "version": SUMMARY_VERSION,
        "generated": _iso(datetime.now(UTC).timestamp()),
        "window": {
            "since": _iso(window.since),
            "until": _iso(window.until),
            "first_event": _iso(totals["first"]),
            "last_event": _iso(totals["last"]),
        },
        "events": count,
        "faults": faults,
        "fault_rate": faults / count if count else 0.0,
        "faults_by_code": {
            str(row["fault"]): row["faults"]
            for row in by_code.collect()
            if row["fault"] is not None
        },
        "latency_us": latency_us,
        "delivered": 0 if overall is None else overall["events"],
        "commands": [
            {"command": row["command"], "events": row["events"], "faults": row["faults"]}
            for row in commands.collect()
        ],
        "agents": [
            {"agent": row["agent"], "events": row["events"], "faults": row["faults"]}
            for row in agents.collect()
        ],
        "destinations": destinations,
    }


def _iso(seconds: float | None) -> str | None:
    """RFC 3339 in UTC with microseconds, or None."""
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def main(argv: list[str] | None = None) -> int:
    """``python -m agents.spark.analytics`` (and spark-submit): ``asbp analytics``."""
    # Imported here: the command line is the CLI module's, which imports this
    # module's run() only when the job starts.
    from agents.spark.analytics_cli import main as cli

    return cli(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
