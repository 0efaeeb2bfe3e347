"""The analytics job against a known event log, on both stores, and on the bus.

The log is generated here, deterministically, from :class:`Event` values
serialised by the event log's own ``to_json``; every expected figure is
computed from those values in plain Python, never by Spark.
"""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import orjson
import pytest
import redis
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import DoubleType, LongType, StringType, TimestampType

from agents import FaultError, UserAgent
from agents.spark import analytics
from agents.spark.analytics import TimeWindow, run
from agents.spark.analytics_publish import SUMMARY_TOPIC, publish_summary
from agents.spark.events import (
    EVENT_SCHEMA,
    EventSource,
    EventSourceError,
    NdjsonSource,
    RedisStreamSource,
    id_ranges,
    read_events,
)
from gateway.acl import Acl, AclEntry, Action, DestinationType, Privilege, SecurityPolicy
from gateway.app import create_app
from gateway.config.model import GatewayConfig
from gateway.eventlog.schema import FIELDS, FILES_DIRECTORY, STREAM_FIELD, STREAM_KEY, Event
from tests.support import RedisServer, T
from tests.support.servers import serve_app
from tests.support.spark import Bus, BusFactory

#: A minute boundary (1763712000 = 2025-11-21T08:00:00Z), so minute m is T0 + 60 m.
T0 = 1_763_712_000.0
#: Five minutes of events, two a second.
COUNT = 600
COMMANDS: tuple[str | None, ...] = ("chat.send", "orders.create", "asbp.publish", None)
AGENTS: tuple[str | None, ...] = ("billing", "chat", None)
DESTINATIONS: tuple[tuple[str, str], ...] = (
    ("group", "friends"),
    ("group", "family"),
    ("group", "friends,family"),  # g=[friends,family]: one event, two groups
    ("topic", "/news/sport"),
    ("topic", "/news/tech"),
    ("topic", "/weather"),
    ("queue", "/jobs"),
    ("virtual_queue", "audit@/news/.*"),
    ("agent", "billing"),
    ("broker", "asbp.ping"),
)
FAULT_CODES = (2001, 3201, 2104)


def known_events() -> list[Event]:
    """The known log: varied enough that every figure has several groups."""
    events = []
    for i in range(COUNT):
        kind, destination = DESTINATIONS[(i * i + i // 7) % len(DESTINATIONS)]
        fault = FAULT_CODES[i % 3] if i % 11 == 0 or i % 29 == 0 else None
        events.append(
            Event(
                time=T0 + i * 0.5 + (i % 5) * 0.001,
                broker="broker-a" if i % 2 else "broker-b",
                source_kind="channel" if i % 4 else "agent",
                source=f"source-{i % 13}",
                subject="alice" if i % 6 == 0 else None,
                command=COMMANDS[(i // 3) % len(COMMANDS)],
                header_bytes=40 + i % 17,
                body_bytes=(i * 37) % 500,
                destination_kind=kind,  # type: ignore[arg-type]  # one of DestinationKind
                destination=destination,
                agent=AGENTS[i % len(AGENTS)],
                outcome="fault" if fault is not None else "delivered",
                fault=fault,
                latency_us=(i * 7919) % 5000 + (50_000 if i % 97 == 0 else 0) + 1,
            )
        )
    return events


def write_ndjson(directory: Path, events: list[Event], *, files: int = 3) -> None:
    """The memory engine's layout: rotating files, plus the debris a crash leaves."""
    directory.mkdir(parents=True, exist_ok=True)
    size = math.ceil(len(events) / files)
    for index in range(files):
        chunk = events[index * size : (index + 1) * size]
        lines = [event.to_json() for event in chunk]
        if index == 0:
            lines.insert(3, b"this line is not JSON")
        path = directory / f"events-2025112108{index:02d}00000000Z.ndjson"
        tail = b'{"time": 1763712000.5, "broker": "brok' if index == files - 1 else b""
        path.write_bytes(b"\n".join(lines) + b"\n" + tail)
    (directory / "notes.txt").write_text("not an event file\n")


def minute(seconds: float) -> int:
    return int(seconds // 60 * 60)


def nearest_rank(values: list[int], p: float) -> int:
    """The smallest value with at least ``p`` of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(p * len(ordered))) - 1]


def rows(frame: DataFrame, *columns: str) -> list[tuple[Any, ...]]:
    """``columns`` of every row, timestamps as Unix seconds, sorted (None first)."""
    found = []
    for row in frame.collect():
        values = []
        for name in columns:
            value = row[name]
            values.append(int(value.timestamp()) if hasattr(value, "timestamp") else value)
        found.append(tuple(values))
    return sorted(found, key=lambda r: tuple((v is not None, v) for v in r))


def by_none_first(items: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return sorted(items, key=lambda r: tuple((v is not None, v) for v in r))


@pytest.fixture(scope="module")
def events() -> list[Event]:
    return known_events()


@pytest.fixture(scope="module")
def ndjson_log(tmp_path_factory: pytest.TempPathFactory, events: list[Event]) -> Path:
    directory = tmp_path_factory.mktemp("log") / "events"
    write_ndjson(directory, events)
    return directory


@pytest.fixture(scope="module")
def job(
    spark: SparkSession, ndjson_log: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, Any]]:
    """One run of the whole job over the NDJSON log: (output directory, summary)."""
    output = tmp_path_factory.mktemp("analytics")
    return output, run(spark, ndjson_log, output, top=2)


@pytest.fixture
def stream(spark_redis: RedisServer, events: list[Event]) -> Iterator[str]:
    """The known log as a Redis Stream (a fresh key), with IDs from the event times."""
    key = f"test:events:{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(spark_redis.url)
    try:
        sequence: Counter[int] = Counter()
        pipe = client.pipeline(transaction=False)
        for event in events:
            millisecond = int(event.time * 1000)
            pipe.xadd(
                key, {STREAM_FIELD: event.to_json()}, id=f"{millisecond}-{sequence[millisecond]}"
            )
            sequence[millisecond] += 1
        # Debris no reader should choke on, after the last event.
        last = int(events[-1].time * 1000) + 1
        pipe.xadd(key, {STREAM_FIELD: b"not json"}, id=f"{last}-0")
        pipe.xadd(key, {b"other": b"no e field"}, id=f"{last}-1")
        pipe.xadd(key, {STREAM_FIELD: b"\xff\xfe"}, id=f"{last}-2")
        pipe.execute()
        yield key
    finally:
        client.delete(key)
        client.close()


# -- the reader ------------------------------------------------------------------


def test_the_schema_is_the_event_record_field_for_field() -> None:
    assert tuple(EVENT_SCHEMA.fieldNames()) == FIELDS
    types = {field.name: field.dataType for field in EVENT_SCHEMA.fields}
    assert types["time"] == DoubleType()
    assert types["latency_us"] == types["header_bytes"] == types["fault"] == LongType()
    assert types["outcome"] == types["command"] == StringType()
    nullable = {field.name for field in EVENT_SCHEMA.fields if field.nullable}
    assert nullable == {"subject", "command", "destination_kind", "destination", "agent", "fault"}


def event_tuples(frame: DataFrame) -> list[tuple[Any, ...]]:
    return sorted(tuple(row[name] for name in FIELDS) for row in frame.collect())


def expected_tuples(events: list[Event]) -> list[tuple[Any, ...]]:
    return sorted(tuple(getattr(event, name) for name in FIELDS) for event in events)


def test_ndjson_files_read_back_as_written_and_debris_is_dropped(
    spark: SparkSession, ndjson_log: Path, events: list[Event]
) -> None:
    frame = read_events(spark, ndjson_log)
    assert frame.schema["timestamp"].dataType == TimestampType()
    assert event_tuples(frame) == expected_tuples(events)
    first = frame.orderBy("time").first()
    assert first is not None
    assert first["timestamp"].timestamp() == pytest.approx(T0, abs=1e-6)
    # One file, and a glob, name files directly.
    one = sorted(ndjson_log.glob("events-*.ndjson"))[1]
    assert read_events(spark, one).count() == 200
    assert read_events(spark, str(ndjson_log / "events-*00Z.ndjson")).count() == COUNT


def test_a_redis_stream_reads_the_same_events_in_id_ranges(
    spark: SparkSession, spark_redis: RedisServer, stream: str, events: list[Event]
) -> None:
    source = RedisStreamSource(spark_redis.url, stream, partitions=3, chunk=64)
    frame = read_events(spark, source)
    # Three ranges, each read in several XRANGE chunks.
    assert frame.rdd.getNumPartitions() == 3
    assert event_tuples(frame) == expected_tuples(events)


def test_the_window_keeps_since_up_to_until(
    spark: SparkSession, spark_redis: RedisServer, stream: str, events: list[Event]
) -> None:
    since, until = T0 + 60, T0 + 150.25
    inside = [e for e in events if since <= e.time < until]
    source = RedisStreamSource(spark_redis.url, stream, partitions=2)
    assert event_tuples(read_events(spark, source, since=since, until=until)) == (
        expected_tuples(inside)
    )


def test_an_empty_log_has_no_events_and_a_missing_one_is_an_error(
    spark: SparkSession, spark_redis: RedisServer, tmp_path: Path
) -> None:
    assert read_events(spark, tmp_path).count() == 0
    empty = RedisStreamSource(spark_redis.url, f"test:none:{uuid.uuid4().hex}")
    assert read_events(spark, empty).count() == 0
    with pytest.raises(EventSourceError, match="no event log at"):
        read_events(spark, tmp_path / "missing")
    with pytest.raises(EventSourceError, match="no event files match"):
        read_events(spark, NdjsonSource(str(tmp_path / "events-*.ndjson")))


def test_id_ranges_cover_every_id_once() -> None:
    ranges = id_ranges("1000-5", "1009-2", 4)
    assert [(r.start, r.end) for r in ranges] == [
        ("1000-5", f"1001-{2**64 - 1}"),
        ("1002-0", f"1004-{2**64 - 1}"),
        ("1005-0", f"1006-{2**64 - 1}"),
        ("1007-0", "1009-2"),
    ]
    # Never more ranges than milliseconds.
    assert [(r.start, r.end) for r in id_ranges("7-0", "7-9", 8)] == [("7-0", "7-9")]


# -- the figures -----------------------------------------------------------------


def traffic(events: list[Event], key: str) -> list[tuple[Any, ...]]:
    groups: dict[tuple[int, Any], list[int]] = defaultdict(lambda: [0, 0, 0])
    for event in events:
        if key == "agent" and event.agent is None:
            continue
        figures = groups[minute(event.time), getattr(event, key)]
        figures[0] += 1
        figures[1] += event.outcome == "fault"
        figures[2] += event.header_bytes + event.body_bytes
    return by_none_first([(m, name, *figures) for (m, name), figures in groups.items()])


def test_traffic_per_minute_per_command_and_per_agent(
    spark: SparkSession, job: tuple[Path, dict[str, Any]], events: list[Event]
) -> None:
    output, _ = job
    by_command = spark.read.parquet(str(output / "traffic_by_command"))
    assert rows(by_command, "minute", "command", "events", "faults", "bytes") == traffic(
        events, "command"
    )
    by_agent = spark.read.parquet(str(output / "traffic_by_agent"))
    assert rows(by_agent, "minute", "agent", "events", "faults", "bytes") == traffic(
        events, "agent"
    )
    assert len({m for m, *_ in traffic(events, "command")}) == 5


def test_fault_rates_by_code_and_by_minute(
    spark: SparkSession, job: tuple[Path, dict[str, Any]], events: list[Event]
) -> None:
    output, summary = job
    codes = Counter(e.fault for e in events if e.outcome == "fault")
    assert set(codes) == set(FAULT_CODES)
    found = rows(spark.read.parquet(str(output / "faults_by_code")), "fault", "faults", "rate")
    assert found == sorted((code, n, n / COUNT) for code, n in codes.items())
    per_minute: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for event in events:
        per_minute[minute(event.time)][0] += 1
        per_minute[minute(event.time)][1] += event.outcome == "fault"
    found = rows(
        spark.read.parquet(str(output / "faults_by_minute")), "minute", "events", "faults", "rate"
    )
    assert found == sorted((m, n, f, f / n) for m, (n, f) in per_minute.items())
    assert summary["faults"] == sum(codes.values())
    assert summary["fault_rate"] == sum(codes.values()) / COUNT
    assert summary["faults_by_code"] == {str(code): n for code, n in codes.items()}


def test_latency_percentiles_overall_and_per_command(
    spark: SparkSession, job: tuple[Path, dict[str, Any]], events: list[Event]
) -> None:
    output, summary = job
    delivered = [e for e in events if e.outcome == "delivered"]
    latencies = [e.latency_us for e in delivered]
    # Fewer events than the accuracy: exact, nearest-rank.
    expected = [nearest_rank(latencies, p) for p in analytics.PERCENTILES]
    overall = rows(
        spark.read.parquet(str(output / "latency")),
        "events",
        "p50_us",
        "p95_us",
        "p99_us",
        "max_us",
    )
    assert overall == [(len(delivered), *expected, max(latencies))]
    assert summary["latency_us"] == dict(zip(("p50", "p95", "p99"), expected, strict=True)) | {
        "max": max(latencies)
    }
    per_command: dict[str | None, list[int]] = defaultdict(list)
    for event in delivered:
        per_command[event.command].append(event.latency_us)
    found = rows(
        spark.read.parquet(str(output / "latency_by_command")),
        "command",
        "events",
        "p50_us",
        "p95_us",
        "p99_us",
    )
    assert found == by_none_first(
        [
            (command, len(values), *(nearest_rank(values, p) for p in analytics.PERCENTILES))
            for command, values in per_command.items()
        ]
    )


def test_the_percentile_error_stays_within_the_documented_rank_bound(
    spark: SparkSession, ndjson_log: Path, events: list[Event]
) -> None:
    accuracy = 20  # so coarse that the sketch must approximate 500-odd values
    row = analytics.latency(read_events(spark, ndjson_log), accuracy=accuracy).first()
    assert row is not None
    latencies = sorted(e.latency_us for e in events if e.outcome == "delivered")
    n = len(latencies)
    for p in analytics.PERCENTILES:
        value = row[f"p{round(p * 100)}_us"]
        # The ranks (1-based) this value occupies must come within n / accuracy
        # of the exact rank.
        low = latencies.index(value) + 1
        high = n - latencies[::-1].index(value)
        target = math.ceil(p * n)
        assert low - n / accuracy <= target <= high + n / accuracy, (p, value)


def test_the_busiest_groups_topics_and_queues(
    spark: SparkSession, job: tuple[Path, dict[str, Any]], events: list[Event]
) -> None:
    output, summary = job
    counts: Counter[tuple[str, str]] = Counter()
    faults: Counter[tuple[str, str]] = Counter()
    for e in events:
        if e.destination_kind in analytics.DESTINATION_KINDS and e.destination is not None:
            names = e.destination.split(",") if e.destination_kind == "group" else [e.destination]
            for name in names:
                counts[e.destination_kind, name] += 1
                faults[e.destination_kind, name] += e.outcome == "fault"
    expected = []
    for kind in analytics.DESTINATION_KINDS:
        ranked = sorted(
            ((name, n) for (k, name), n in counts.items() if k == kind),
            key=lambda item: (-item[1], item[0]),
        )[:2]
        expected += [
            (kind, rank, name, n, faults[kind, name]) for rank, (name, n) in enumerate(ranked, 1)
        ]
    found = rows(
        spark.read.parquet(str(output / "busiest_destinations")),
        "destination_kind",
        "rank",
        "destination",
        "events",
        "faults",
    )
    assert found == sorted(expected)
    assert {kind for kind, *_ in found} == set(analytics.DESTINATION_KINDS)
    # Three topics, the top two kept: the cut happened.
    assert len([1 for kind, *_ in found if kind == "topic"]) == 2
    assert summary["destinations"]["topic"] == [
        {"destination": name, "events": n, "faults": f}
        for kind, _, name, n, f in expected
        if kind == "topic"
    ]


def test_the_summary(job: tuple[Path, dict[str, Any]], events: list[Event]) -> None:
    output, summary = job
    assert orjson.loads((output / "summary.json").read_bytes()) == summary
    assert summary["version"] == analytics.SUMMARY_VERSION
    assert summary["events"] == COUNT
    assert summary["delivered"] == sum(e.outcome == "delivered" for e in events)
    assert summary["window"] == {
        "since": None,
        "until": None,
        "first_event": "2025-11-21T08:00:00Z",
        "last_event": "2025-11-21T08:04:59.504000Z",
    }
    commands = Counter(e.command for e in events)
    top = sorted(commands.items(), key=lambda item: (-item[1], item[0] is None, item[0] or ""))
    assert [(c["command"], c["events"]) for c in summary["commands"]] == top[:2]
    agents = Counter(e.agent for e in events if e.agent is not None)
    assert [(a["agent"], a["events"]) for a in summary["agents"]] == sorted(
        agents.items(), key=lambda item: (-item[1], item[0])
    )
    assert len(orjson.dumps(summary)) < 4096


def test_a_window_and_an_empty_result(
    spark: SparkSession, ndjson_log: Path, tmp_path: Path, events: list[Event]
) -> None:
    window = TimeWindow(T0 + 3600, T0 + 7200)  # after the log: nothing in it
    summary = run(spark, ndjson_log, tmp_path / "out", window=window)
    assert summary["events"] == summary["faults"] == summary["delivered"] == 0
    assert summary["fault_rate"] == 0.0
    assert summary["latency_us"] == {"p50": None, "p95": None, "p99": None, "max": None}
    assert summary["window"]["since"] == "2025-11-21T09:00:00Z"
    assert summary["window"]["first_event"] is None
    assert summary["destinations"] == {kind: [] for kind in analytics.DESTINATION_KINDS}


# -- on the bus ------------------------------------------------------------------

#: The least privilege for the job (docs/acl.md): its identity gets a policy that
#: inherits the default and PERMITs writing one system topic, above the built-in DENY.
ANALYTICS_ACL = Acl(
    [
        SecurityPolicy(
            "analytics",
            (
                AclEntry.of(
                    Action.PERMIT, DestinationType.TOPIC, "/system/stats/analytics", Privilege.WRITE
                ),
            ),
            parent="default",
        )
    ],
    agents={"analytics": "analytics"},
)


async def subscribed(bus: Bus) -> UserAgent:
    """A User-Agent subscribed to the summary topic."""
    ua = UserAgent.websocket(bus.channel_url)
    await ua.connect()
    await ua.request("asbp.subscribe", destination=SUMMARY_TOPIC, type="TOPIC", timeout=5 * T)
    return ua


def test_the_summary_reaches_a_subscriber_and_only_the_job_may_write_it(
    make_bus: BusFactory, job: tuple[Path, dict[str, Any]]
) -> None:
    _, summary = job
    bus = make_bus(acl=ANALYTICS_ACL)

    async def scenario() -> None:
        ua = await subscribed(bus)
        try:
            message_id = await publish_summary(
                summary, url=bus.tube_url, credentials=bus.credentials("analytics"), timeout=5 * T
            )
            notification = await ua.receive(timeout=5 * T)
            assert notification.name == "asbp.notification"
            assert notification.get("destination") == SUMMARY_TOPIC
            assert notification.get("id") == message_id
            assert notification.get("a") == "analytics"  # verified: it came from the job
            assert orjson.loads(notification.body) == summary
            # Another trusted agent is refused by the built-in /system/ entry...
            with pytest.raises(FaultError) as refused:
                await publish_summary(
                    summary, url=bus.tube_url, credentials=bus.credentials("spark"), timeout=5 * T
                )
            assert refused.value.code == 3201
            # ...and the job itself may write no other system topic.
            with pytest.raises(FaultError) as elsewhere:
                await publish_summary(
                    b"{}",
                    url=bus.tube_url,
                    credentials=bus.credentials("analytics"),
                    topic="/system/stats/other",
                    timeout=5 * T,
                )
            assert elsewhere.value.code == 3201
            # Nothing else reached the subscriber.
            with pytest.raises(TimeoutError):
                await ua.receive(timeout=0.2 * T)
        finally:
            await ua.close()

    asyncio.run(scenario())


def test_asbp_analytics_end_to_end(
    bus: Bus, ndjson_log: Path, tmp_path: Path, events: list[Event]
) -> None:
    key = tmp_path / "analytics.pem"
    key.write_text(bus.keys["analytics"])
    output = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "agents.spark.analytics",
        "--events",
        str(ndjson_log),
        "--output",
        str(output),
        "--since",
        "2025-11-21T08:01:00Z",
        "--until",
        str(T0 + 240),
        "--bus-url",
        bus.tube_url,
        "--identity",
        "analytics",
        "--key",
        str(key),
        "--insecure",
        "--master",
        "local[1]",
    ]
    inside = [e for e in events if T0 + 60 <= e.time < T0 + 240]

    async def scenario() -> tuple[int, bytes, bytes, dict[str, Any]]:
        ua = await subscribed(bus)
        try:
            process = await asyncio.create_subprocess_exec(
                *command, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            finished = asyncio.create_task(process.communicate())
            received = asyncio.create_task(ua.receive())
            try:
                # A job that fails ends before publishing: do not wait for the
                # notification then.
                await asyncio.wait(
                    {finished, received}, timeout=180 * T, return_when=asyncio.FIRST_COMPLETED
                )
                stdout, stderr = await asyncio.wait_for(finished, 60 * T)
                assert process.returncode == 0, stderr.decode()
                notification = await asyncio.wait_for(received, 5 * T)
            finally:
                received.cancel()
                if process.returncode is None:
                    process.kill()
                    await finished
            return process.returncode, stdout, stderr, orjson.loads(notification.body)
        finally:
            await ua.close()

    status, stdout, stderr, published = asyncio.run(scenario())
    assert status == 0, stderr.decode()
    printed = orjson.loads(stdout)
    assert printed == published
    assert printed["events"] == len(inside)
    assert printed["faults"] == sum(e.outcome == "fault" for e in inside)
    assert printed["window"]["since"] == "2025-11-21T08:01:00Z"
    assert printed["window"]["until"] == "2025-11-21T08:04:00Z"
    assert sorted(p.name for p in output.iterdir()) == sorted([*analytics.RESULTS, "summary.json"])
    assert b"published the summary" in stderr


# -- against the broker's own event log ------------------------------------------


@pytest.mark.parametrize("engine", ["redis", "memory"])
def test_the_figures_of_a_real_brokers_event_log(
    engine: Literal["memory", "redis"],
    spark: SparkSession,
    spark_redis: RedisServer,
    tmp_path: Path,
) -> None:
    """Traffic through a real broker, logged by its recorder, read by the job."""
    client = redis.Redis.from_url(spark_redis.url)
    try:
        client.delete(STREAM_KEY)
    finally:
        client.close()
    config = GatewayConfig(
        broker_id="broker-analytics",
        data_dir=tmp_path / "data",
        engine=engine,
        redis_url=spark_redis.url,
    )

    async def traffic(url: str) -> None:
        async with UserAgent.websocket(url) as ua:
            for _ in range(20):
                await ua.request("asbp.ping", timeout=5 * T)
            for topic, count in (("/news/a", 5), ("/news/b", 3)):
                for _ in range(count):
                    await ua.request("asbp.publish", b"x", destination=topic, timeout=5 * T)
            with pytest.raises(FaultError) as unserved:
                await ua.request("nobody.serves", timeout=5 * T)
            assert unserved.value.code == 2101

    # Leaving the block stops the broker, which writes out everything it recorded.
    with serve_app(create_app(config)) as running:
        asyncio.run(traffic(f"{running.ws_url}/asbp"))
    source: EventSource = (
        RedisStreamSource(spark_redis.url)
        if engine == "redis"
        else NdjsonSource(str(tmp_path / "data" / FILES_DIRECTORY))
    )
    summary = run(spark, source, tmp_path / "out", top=5)
    assert summary["events"] == 29
    assert summary["faults"] == 1 and summary["faults_by_code"] == {"2101": 1}
    assert [(c["command"], c["events"]) for c in summary["commands"]] == [
        ("asbp.ping", 20),
        ("asbp.publish", 8),
        ("nobody.serves", 1),
    ]
    assert summary["destinations"]["topic"] == [
        {"destination": "/news/a", "events": 5, "faults": 0},
        {"destination": "/news/b", "events": 3, "faults": 0},
    ]
    assert summary["delivered"] == 28
    assert summary["latency_us"]["p50"] > 0
