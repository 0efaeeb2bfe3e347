"""SparkApplicationAgent end to end: a User-Agent's query through a real broker on
Redis, answered by Spark (local[2]) in parts carrying ``t`` and ``o``."""

from __future__ import annotations

import asyncio
import datetime
import importlib.util
import io
import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from contextlib import aclosing
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from agents import FaultError, Request, UserAgent
from agents.backoff import Backoff
from agents.spark.agent import SparkApplicationAgent
from agents.spark.agent_cli import parse_args
from agents.spark.parts import QueryResult, fetch, json_row
from agents.spark.query import MAX_ITEMS, Order, Query, QueryError
from agents.streams import StreamError, StreamPart, ordered_parts, reassemble
from asbp import Command, FaultCode
from tests.support import T
from tests.support.agents import TcpProxy
from tests.support.spark import Bus, BusFactory

pytestmark = pytest.mark.anyio

#: Seconds a User-Agent waits for each part: Spark jobs on two shared cores are slow.
WAIT = 30 * T
FAST = Backoff(initial=0.02 * T, maximum=0.2 * T)
PAGES = ("/", "/about", "/blog", "/contact")
AgentFactory = Callable[..., SparkApplicationAgent]


@pytest.fixture(scope="module")
def traffic(spark: SparkSession) -> DataFrame:
    """23 page views over four pages and three days, with a null latency."""
    rows = [
        (
            PAGES[n % 4],
            n,
            None if n == 7 else n * 1.5,
            datetime.date(2026, 11, 1 + n % 3),
            n % 5 != 0,
            datetime.datetime(2026, 11, 1, n),
        )
        for n in range(23)
    ]
    schema = "page string, hits long, latency double, day date, ok boolean, at timestamp"
    frame = spark.createDataFrame(rows, schema).cache()
    frame.count()  # materialise the cache now: a test's deadline should not pay for it
    return frame


@pytest.fixture
def make_agent(spark: SparkSession, bus: Bus, traffic: DataFrame) -> Iterator[AgentFactory]:
    """Start SparkApplicationAgents (in their own threads) serving ``traffic``."""
    started: list[SparkApplicationAgent] = []

    def start(
        *, urls: list[str] | None = None, register: bool = True, **options: Any
    ) -> SparkApplicationAgent:
        options.setdefault("tables", {"traffic": traffic})
        options.setdefault("backoff", FAST)
        options.setdefault("timeout", 5 * T)
        agent = SparkApplicationAgent(
            spark, "spark", bus.credentials("spark"), urls or [bus.tube_url], **options
        )
        started.append(agent)
        agent.start()
        if register:
            agent.wait_registered(10 * T)
        return agent

    try:
        yield start
    finally:
        for agent in started:
            agent.close(timeout=5 * T)


def expected_rows(frame: DataFrame) -> list[dict[str, Any]]:
    """What the agent must send for ``frame``: Spark's own answer, as JSON rows."""
    return [json_row(row) for row in frame.collect()]


async def raw_parts(bus: Bus, name: str, body: str) -> list[Command]:
    """Every Command answering one request, as the User-Agent's stream yields them."""
    async with (
        UserAgent.websocket(bus.channel_url) as ua,
        aclosing(ua.stream(name, body, timeout=WAIT)) as stream,
    ):
        return [part async for part in stream]


async def query(bus: Bus, document: dict[str, Any], **options: Any) -> QueryResult:
    async with UserAgent.websocket(bus.channel_url) as ua:
        return await fetch(ua, document, timeout=WAIT, **options)


# -- the t/o stream ------------------------------------------------------------


async def test_a_query_is_answered_in_parts_with_t_on_the_first_and_o_in_order(
    make_agent: AgentFactory, bus: Bus, traffic: DataFrame
) -> None:
    make_agent(rows_per_part=5)
    document = {"table": "traffic", "order_by": ["hits"]}
    parts = await raw_parts(bus, "analytics.query", json.dumps(document))

    assert [p.of_total for p in parts] == [1, 2, 3, 4, 5]  # 23 rows, 5 a part
    assert [p.total for p in parts] == [5, None, None, None, None]
    assert {(p.name, p.encoding, p.mime_type) for p in parts} == {
        ("analytics.query.reply", "UTF-8", "application/json")
    }
    bodies = [json.loads(p.body) for p in parts]
    assert [len(b["rows"]) for b in bodies] == [5, 5, 5, 5, 3]
    assert bodies[0]["columns"] == [
        {"name": "page", "type": "string"},
        {"name": "hits", "type": "bigint"},
        {"name": "latency", "type": "double"},
        {"name": "day", "type": "date"},
        {"name": "ok", "type": "boolean"},
        {"name": "at", "type": "timestamp"},
    ]
    assert (bodies[0]["row_count"], bodies[0]["truncated"]) == (23, False)
    assert all(set(b) == {"rows"} for b in bodies[1:])
    rows = [row for b in bodies for row in b["rows"]]
    assert rows == expected_rows(traffic.orderBy("hits"))
    assert rows[7]["latency"] is None and rows[1]["day"] == "2026-11-02"
    assert rows[1]["at"] == "2026-11-01T01:00:00"


async def test_fetch_reassembles_and_reports_progress(
    make_agent: AgentFactory, bus: Bus, traffic: DataFrame
) -> None:
    make_agent(rows_per_part=4)
    seen: list[tuple[int, int]] = []

    def progress(part: StreamPart) -> None:
        seen.append((part.position, part.total))

    document = {
        "table": "traffic",
        "select": ["page", "hits"],
        "where": [
            {"column": "ok", "op": "=", "value": True},
            {"column": "page", "op": "in", "value": ["/", "/blog"]},
            {"column": "day", "op": ">=", "value": "2026-11-02"},
            {"column": "at", "op": "<", "value": "2026-11-01T20:00:00"},
        ],
        "order_by": [{"column": "hits", "desc": True}],
    }
    result = await query(bus, document, progress=progress)

    direct = (
        traffic.where(
            F.col("ok")
            & F.col("page").isin("/", "/blog")
            & (F.col("day") >= "2026-11-02")
            & (F.col("at") < "2026-11-01 20:00:00")
        )
        .select("page", "hits")
        .orderBy(F.col("hits").desc())
    )
    assert list(result.rows) == expected_rows(direct)
    assert [c.name for c in result.columns] == ["page", "hits"]
    total = -(-len(result.rows) // 4)
    assert total > 1 and result.parts == total and not result.truncated
    assert seen == [(n, total) for n in range(1, total + 1)]


async def test_a_grouped_query_equals_what_spark_computes(
    make_agent: AgentFactory, bus: Bus, traffic: DataFrame
) -> None:
    make_agent()
    document = {
        "table": "traffic",
        "where": [{"column": "latency", "op": "is not null"}],
        "group_by": ["page"],
        "aggregate": [
            {"fn": "count", "as": "views"},
            {"fn": "sum", "column": "hits"},
            {"fn": "avg", "column": "latency", "as": "mean_latency"},
            {"fn": "max", "column": "day", "as": "last_day"},
            {"fn": "count_distinct", "column": "day", "as": "days"},
        ],
        "order_by": [{"column": "views", "desc": True}, "page"],
        "limit": 3,
    }
    result = await query(bus, document)

    direct = (
        traffic.where(F.col("latency").isNotNull())
        .groupBy("page")
        .agg(
            F.count(F.lit(1)).alias("views"),
            F.sum("hits").alias("sum_hits"),
            F.avg("latency").alias("mean_latency"),
            F.max("day").alias("last_day"),
            F.count_distinct("day").alias("days"),
        )
        .orderBy(F.col("views").desc(), "page")
        .limit(3)
    )
    assert list(result.rows) == expected_rows(direct)
    assert [c.name for c in result.columns] == [
        "page",
        "views",
        "sum_hits",
        "mean_latency",
        "last_day",
        "days",
    ]
    assert result.parts == 1 and len(result.rows) == 3


async def test_an_empty_result_is_one_part_with_its_columns(
    make_agent: AgentFactory, bus: Bus
) -> None:
    make_agent()
    document = {"table": "traffic", "where": [{"column": "hits", "op": ">", "value": 10**6}]}
    (part,) = await raw_parts(bus, "analytics.query", json.dumps(document))
    assert (part.total, part.of_total) == (1, 1)
    body = json.loads(part.body)
    assert body["rows"] == [] and body["row_count"] == 0 and len(body["columns"]) == 6


async def test_max_rows_cuts_a_large_result_short_and_says_so(
    make_agent: AgentFactory, bus: Bus, spark: SparkSession
) -> None:
    numbers = spark.range(0, 5000, numPartitions=8)
    make_agent(tables={"numbers": numbers}, rows_per_part=100, max_rows=250)
    parts = await raw_parts(
        bus, "analytics.query", json.dumps({"table": "numbers", "order_by": ["id"]})
    )
    assert [(p.total, p.of_total) for p in parts] == [(3, 1), (None, 2), (None, 3)]
    bodies = [json.loads(p.body) for p in parts]
    assert (bodies[0]["row_count"], bodies[0]["truncated"]) == (250, True)
    assert [row["id"] for b in bodies for row in b["rows"]] == list(range(250))

    # A limit under max_rows is not a truncation.
    result = await query(bus, {"table": "numbers", "order_by": ["id"], "limit": 200})
    assert (len(result.rows), result.parts, result.truncated) == (200, 2, False)


# -- faults ---------------------------------------------------------------------


BAD_QUERIES = [
    ("not json", "not JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"table": "nope"}', "no table 'nope'"),
    ('{"table": "traffic", "select": ["nope"]}', "no column 'nope'"),
    ('{"table": "traffic", "drop": true}', "unknown query keys ['drop']"),
    ('{"table": "traffic", "where": [{"column": "hits", "op": "=", "value": "1"}]}', "numeric"),
    ('{"table": "traffic", "where": [{"column": "hits", "op": "~", "value": 1}]}', "'op'"),
    ('{"table": "traffic", "where": [{"column": "day", "op": "=", "value": "x"}]}', "ISO 8601"),
    ('{"table": "traffic", "select": ["page"], "group_by": ["page"]}', "cannot be combined"),
    ('{"table": "traffic", "aggregate": [{"fn": "sum", "column": "page"}]}', "numeric"),
    ('{"table": "traffic", "order_by": ["nope"]}', "cannot order by 'nope'"),
    ('{"table": "traffic", "limit": -1}', "'limit'"),
    ('{"table": "traffic", "where": [{"column": "page", "op": "= 1 OR 1=1"}]}', "'op'"),
]


async def test_bad_queries_get_a_clear_fault_and_the_agent_keeps_serving(
    make_agent: AgentFactory, bus: Bus
) -> None:
    make_agent()
    async with UserAgent.websocket(bus.channel_url) as ua:
        for body, message in BAD_QUERIES:
            with pytest.raises(FaultError) as caught:
                await ua.request("analytics.query", body, timeout=WAIT)
            assert caught.value.code == FaultCode.INVALID_MESSAGE_FORMAT, body
            assert message in caught.value.message, (body, caught.value.message)
            assert caught.value.cause == "analytics.query"
        result = await fetch(ua, {"table": "traffic", "select": ["page"]}, timeout=WAIT)
        assert len(result.rows) == 23


async def test_a_part_over_max_part_bytes_is_fault_1101(make_agent: AgentFactory, bus: Bus) -> None:
    make_agent(rows_per_part=10, max_part_bytes=400)
    async with UserAgent.websocket(bus.channel_url) as ua:
        with pytest.raises(FaultError) as caught:
            await fetch(ua, {"table": "traffic"}, timeout=WAIT)
        assert caught.value.code == FaultCode.INVALID_MESSAGE_SIZE
        assert "over this agent's limit of 400" in caught.value.message
        small = await fetch(ua, {"table": "traffic", "select": ["hits"]}, timeout=WAIT)
        assert len(small.rows) == 23


def test_query_parse_rules_without_spark() -> None:
    query = Query.parse(
        b'{"table": "t", "group_by": ["a"], "aggregate": [{"fn": "count"}, '
        b'{"fn": "max", "column": "b"}], "order_by": ["a", {"column": "count", "desc": true}]}'
    )
    assert [a.alias for a in query.aggregate] == ["count", "max_b"]
    assert query.output_columns(["a", "b", "c"]) == ("a", "count", "max_b")
    assert query.order_by == (Order("a", False), Order("count", True))
    many = [{"column": "a", "op": "is null"}] * (MAX_ITEMS + 1)
    for document, message in [
        ({"table": "t", "where": many}, "more than 64 items"),
        ({"table": "t", "where": [{"column": "a", "op": "in", "value": [1] * 1001}]}, "at most"),
        ({"table": "t", "where": [{"column": "a", "op": "is null", "value": 1}]}, "no 'value'"),
        ({"table": "t", "where": [{"column": "a", "op": "=", "value": None}]}, "is null"),
        ({"table": "t", "where": [{"column": "a", "op": "=", "value": [1]}]}, "values must"),
        ({"table": "t", "aggregate": [{"fn": "sum"}]}, "needs a 'column'"),
        ({"table": "t", "aggregate": [{"fn": "count", "as": "a b"}]}, "'as' must"),
        ({"table": "t", "group_by": ["n"], "aggregate": [{"fn": "count", "as": "n"}]}, "twice"),
        ({"table": "t", "select": ["a", "a"]}, "names a column twice"),
        ({"table": "t", "limit": True}, "'limit'"),
        ({"table": ""}, "'table'"),
    ]:
        with pytest.raises(QueryError, match=message):
            Query.from_json(document)


# -- Spark Respondents --------------------------------------------------------


async def test_spark_respondents_answer_with_dataframes_rows_and_faults(
    make_agent: AgentFactory, bus: Bus, spark: SparkSession
) -> None:
    agent = make_agent(rows_per_part=3, register=False)

    @agent.respondent("analytics.squares")
    def squares(session: SparkSession, request: Request) -> DataFrame:
        upto = json.loads(request.body)["upto"]
        return session.range(1, upto + 1).select((F.col("id") * F.col("id")).alias("square"))

    @agent.respondent("analytics.echo_rows")
    def echo_rows(session: SparkSession, request: Request) -> list[dict[str, Any]]:
        return [{"n": n, "text": request.body.decode()} for n in range(4)]

    @agent.respondent("analytics.refuse")
    def refuse(session: SparkSession, request: Request) -> DataFrame:
        raise QueryError("not today", FaultCode.ACCESS_DENIED)

    @agent.respondent("analytics.crash")
    def crash(session: SparkSession, request: Request) -> DataFrame:
        return session.range(3).select(F.raise_error("boom"))

    @agent.respondent("analytics.crash_midway")
    def crash_midway(session: SparkSession, request: Request) -> DataFrame:
        # One row a partition, three a part: the fifth row fails after part 1 went out.
        numbers = session.range(0, 5, numPartitions=5)
        return numbers.select(F.when(F.col("id") == 4, F.raise_error("boom")).otherwise("id"))

    agent.wait_registered(10 * T)
    async with UserAgent.websocket(bus.channel_url) as ua:
        result = await fetch(ua, {"upto": 7}, name="analytics.squares", timeout=WAIT)
        assert [row["square"] for row in result.rows] == [n * n for n in range(1, 8)]
        assert result.parts == 3 and result.columns[0].type == "bigint"

        rows = await fetch(ua, {}, name="analytics.echo_rows", timeout=WAIT)
        assert [row["n"] for row in rows.rows] == [0, 1, 2, 3]
        assert rows.rows[0]["text"] == "{}" and rows.parts == 2
        assert [c.name for c in rows.columns] == ["n", "text"]

        with pytest.raises(FaultError) as refused:
            await ua.request("analytics.refuse", timeout=WAIT)
        assert (refused.value.code, refused.value.message) == (3201, "not today")

        with pytest.raises(FaultError) as crashed:
            await ua.request("analytics.crash", timeout=WAIT)
        assert crashed.value.code == FaultCode.RESPONDENT_FAILED
        assert "boom" not in crashed.value.message  # nothing of the exception leaks

        # A failure after some parts were sent ends the stream with the fault.
        seen: list[int] = []
        with pytest.raises(FaultError) as midway:
            await fetch(
                ua,
                {},
                name="analytics.crash_midway",
                timeout=WAIT,
                progress=lambda part: seen.append(part.position),
            )
        assert midway.value.code == FaultCode.RESPONDENT_FAILED and seen == [1]

        # Still serving, the built-in query included.
        assert len((await fetch(ua, {"table": "traffic"}, timeout=WAIT)).rows) == 23
    assert agent.application_agent.respondent_names == {
        "analytics.query",
        "analytics.squares",
        "analytics.echo_rows",
        "analytics.refuse",
        "analytics.crash",
        "analytics.crash_midway",
    }


# -- life cycle ---------------------------------------------------------------


async def test_the_agent_reconnects_and_serves_after_its_broker_is_replaced(
    make_agent: AgentFactory, make_bus: BusFactory, bus: Bus
) -> None:
    async with TcpProxy() as proxy:
        proxy.target = bus.server.port
        agent = make_agent(urls=[proxy.url], register=False)
        # The proxy runs on this loop: block in a thread, never on the loop.
        await asyncio.to_thread(agent.wait_registered, 10 * T)
        assert len((await query(bus, {"table": "traffic"})).rows) == 23

        second = make_bus()
        proxy.cut()
        proxy.target = second.server.port
        await proxy.wait_forwarded(2)
        await asyncio.to_thread(agent.wait_registered, 10 * T)
        (tube,) = agent.application_agent.tubes
        assert tube.broker_id == second.broker_id and tube.sessions_opened == 2
        assert len((await query(second, {"table": "traffic"})).rows) == 23
        await asyncio.to_thread(agent.close, 5 * T)


def test_close_unregisters_and_a_closed_agent_does_not_serve_again(
    make_agent: AgentFactory, bus: Bus
) -> None:
    agent = make_agent()

    async def served() -> list[str]:
        async with UserAgent.websocket(bus.channel_url) as ua:
            names: list[str] = json.loads((await ua.request("asbp.commands", timeout=5 * T)).body)
            return names

    assert "analytics.query" in asyncio.run(served())
    agent.close(timeout=5 * T)
    assert "analytics.query" not in asyncio.run(served())
    agent.close()  # twice is fine
    with pytest.raises(Exception, match="serves once"):
        agent.start()


def test_the_command_line_needs_a_key_and_one_table(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("ASBP_TUBE_URLS", "ASBP_AGENT_ID", "ASBP_AGENT_KEY_FILE", "ASBP_AUDIENCE"):
        monkeypatch.delenv(name, raising=False)
    args = parse_args(["--key-file", "k", "--parquet", "p", "--url", "ws://a/tube"])
    assert (args.urls, args.table, args.rows_per_part) == (["ws://a/tube"], "events", 500)
    for argv, message in [
        (["--parquet", "p"], "--key-file"),
        (["--key-file", "k"], "one of --events"),
        (["--key-file", "k", "--events", "e", "--parquet", "p"], "one of --events"),
    ]:
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert message in capsys.readouterr().err


# -- agents.streams: reassembly without a broker --------------------------------


def part(position: int | None, total: int | None = None) -> Command:
    keys: dict[str, Any] = {"c": "x.reply", "u": 1}
    if position is not None:
        keys["o"] = position
    if total is not None:
        keys["t"] = total
    return Command(keys, b"")


def test_reassemble_orders_parts_and_checks_the_sequence() -> None:
    parts = reassemble([part(3), part(1, 3), part(2)])
    assert [(p.position, p.total, p.last) for p in parts] == [
        (1, 3, False),
        (2, 3, False),
        (3, 3, True),
    ]
    assert parts[1].progress == pytest.approx(2 / 3)
    assert [(p.position, p.total) for p in reassemble([part(None)])] == [(1, 1)]
    for broken, message in [
        ([part(1), part(2)], "does not carry t"),
        ([part(1, 2), part(2, 3)], "t=3"),
        ([part(1, 3), part(3)], "expected part 2"),
        ([part(1, 2)], "ended after 1 of 2"),
        ([part(1, 2), part(2), part(3)], "part 3 of a 2-part stream"),
        ([part(1, 2), part(2), part(2)], "expected part 3"),
        ([part(None, 0)], "at least one part"),
        ([], "no parts"),
    ]:
        with pytest.raises(StreamError, match=message):
            reassemble(broken)


async def test_ordered_parts_checks_a_live_stream() -> None:
    async def stream(*commands: Command) -> Any:
        for command in commands:
            yield command

    got = [p.position async for p in ordered_parts(stream(part(1, 2), part(2), part(3)))]
    assert got == [1, 2]  # it stops at t
    with pytest.raises(StreamError, match="ended after 1 of 2"):
        async for _ in ordered_parts(stream(part(1, 2))):
            pass


# -- examples/spark_agent.py ----------------------------------------------------


def load_example() -> ModuleType:
    path = Path(__file__).resolve().parents[3] / "examples" / "spark_agent.py"
    spec = importlib.util.spec_from_file_location("examples_spark_agent", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_serves_and_asks(spark: SparkSession, bus: Bus, tmp_path: Path) -> None:
    example = load_example()
    key_file = tmp_path / "analytics.key"
    key_file.write_text(bus.keys["analytics"])
    stop, ready = threading.Event(), threading.Event()
    argv = ["serve", "--url", bus.tube_url, "--key-file", str(key_file)]
    with ThreadPoolExecutor(2) as pool:
        serving = pool.submit(example.main, argv, spark=spark, stop=stop, ready=ready)
        try:
            # Whichever comes first: registered, or main() failed.
            done, _ = wait([serving, pool.submit(ready.wait, WAIT)], WAIT, FIRST_COMPLETED)
            if serving in done:
                serving.result()
            assert ready.is_set(), "the example did not register in time"
            out = io.StringIO()
            query = '{"table": "pages", "select": ["visitor"], "order_by": ["visitor"]}'
            assert example.main(["ask", "--url", bus.channel_url, "--query", query], out=out) == 0
            assert out.getvalue().splitlines() == [
                "part 1 of 4",
                "part 2 of 4",
                "part 3 of 4",
                "part 4 of 4",
                "visitor",
                *sorted(row[1] for row in example.VIEWS),
            ]
            out = io.StringIO()
            top = ["ask", "--url", bus.channel_url, "--name", "analytics.top_pages"]
            assert example.main([*top, "--query", '{"n": 2}'], out=out) == 0
            assert out.getvalue().splitlines()[-3:] == ["page | views", "/ | 4", "/blog | 2"]
            with pytest.raises(FaultError, match="'n' must be"):
                example.main([*top, "--query", '{"n": 0}'], out=io.StringIO())
        finally:
            stop.set()
        assert serving.result(timeout=WAIT) == 0
