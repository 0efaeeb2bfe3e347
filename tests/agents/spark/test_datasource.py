"""The ``asbp`` Data Source in local[2] Spark against a real broker on a real Redis.

The streaming tests stop and restart queries from their checkpoints and count
exactly: every message published appears once, none twice, none lost.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import StructType

from agents.messaging import Message, MessagingClient, Publication, publish_all
from agents.spark.datasource import register
from agents.spark.source_options import OptionError, SinkOptions, SourceOptions
from agents.spark.source_reader import AsbpStreamReader
from agents.spark.source_wal import MAX_TOMBSTONES, WalError, WriteAheadLog
from tests.support import T
from tests.support.spark import Bus


@pytest.fixture(scope="module", autouse=True)
def asbp_format(spark: SparkSession) -> None:
    register(spark)


# -- helpers -----------------------------------------------------------------------


def publish(bus: Bus, destination: str, payloads: list[str], *, kind: str = "QUEUE") -> None:
    async def run() -> None:
        async with MessagingClient.websocket(bus.channel_url, timeout=5 * T) as client:
            await publish_all(
                client,
                (
                    Publication(destination, p, type="QUEUE" if kind == "QUEUE" else "TOPIC")
                    for p in payloads
                ),
            )

    asyncio.run(run())


def drain(bus: Bus, queue: str, expected: int) -> list[Message]:
    """Take and acknowledge ``expected`` messages, then check that the queue is empty.

    The last poll waits ``T``: a message still leased to a closed Channel comes back
    within it, so "empty" means nothing is left unacknowledged either.
    """

    async def run() -> list[Message]:
        taken: list[Message] = []
        async with MessagingClient.websocket(bus.channel_url, timeout=5 * T) as client:
            while len(taken) < expected:
                batch = await client.poll(queue, count=16, wait=5 * T, timeout=5 * T)
                assert batch, f"only {len(taken)} of {expected} messages came"
                await client.ack(queue, [m.receipt for m in batch if m.receipt])
                taken += batch
            assert await client.poll(queue, count=16, wait=T, timeout=5 * T) == []
        return taken

    return asyncio.run(run())


def leftover(bus: Bus, queue: str) -> list[Message]:
    """What a queue still holds (taken, not acknowledged: the Channel's close releases it)."""

    async def run() -> list[Message]:
        async with MessagingClient.websocket(bus.channel_url, timeout=5 * T) as client:
            return await client.poll(queue, count=16, wait=T, timeout=5 * T)

    return asyncio.run(run())


def source(spark: SparkSession, bus: Bus, wal: Path, **options: str) -> DataFrame:
    reader = spark.readStream.format("asbp").option("url", bus.channel_url)
    reader = reader.option("walPath", str(wal)).option("payloadFormat", "string")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


@dataclass
class Batches:
    """A foreachBatch sink that keeps every attempt of every batch, and can fail one."""

    attempts: dict[int, list[list[tuple[Any, ...]]]] = field(default_factory=dict)
    fail_on: str | None = None

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        rows = sorted(
            (r["offset"], r["id"], r["payload"], r["deliveries"]) for r in frame.collect()
        )
        self.attempts.setdefault(batch_id, []).append(rows)
        if self.fail_on is not None and any(p == self.fail_on for _, _, p, _ in rows):
            raise RuntimeError(f"batch {batch_id} failed on purpose")

    def rows(self) -> list[tuple[Any, ...]]:
        """The rows of the last attempt of each batch: what the sink keeps."""
        return [row for runs in self.attempts.values() for row in runs[-1]]


def start(
    frame: DataFrame, sink: Callable[[DataFrame, int], None], checkpoint: Path
) -> StreamingQuery:
    return (
        frame.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint)).start()
    )


# -- streaming reads ---------------------------------------------------------------


def test_a_streaming_read_restarted_from_its_checkpoint_counts_exactly(
    spark: SparkSession, bus: Bus, tmp_path: Path
) -> None:
    publish(bus, "orders", [f"m{n}" for n in range(300)])
    sink = Batches(fail_on="m200")
    options = {"type": "QUEUE", "destination": "orders", "maxRecordsPerBatch": "150"}
    frame = source(spark, bus, tmp_path / "wal", **options)

    # Run 1: batch 0 commits; batch 1 (m150..m299) was read, then the sink fails it.
    query = start(frame, sink, tmp_path / "checkpoint")
    with pytest.raises(PySparkException, match="failed on purpose"):
        query.awaitTermination(int(60 * T))
    assert sorted(sink.attempts) == [0, 1]
    assert [p for _, _, p, _ in sink.attempts[0][0]] == [f"m{n}" for n in range(150)]

    # Messages published while the query is down wait in the queue.
    publish(bus, "orders", [f"m{n}" for n in range(300, 500)])

    # Run 2, from the checkpoint: batch 1 again, the same rows (the log replays them;
    # the broker's redelivery of the same messages is recognised by id), then the rest.
    sink.fail_on = None
    query = start(source(spark, bus, tmp_path / "wal", **options), sink, tmp_path / "checkpoint")
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert len(sink.attempts[1]) == 2
    assert sink.attempts[1][0] == sink.attempts[1][1]
    assert {d for _, _, _, d in sink.attempts[1][1]} == {1}  # rows keep their first delivery

    rows = sink.rows()
    assert sorted(p for _, _, p, _ in rows) == sorted(f"m{n}" for n in range(500))
    assert len({message_id for _, message_id, _, _ in rows}) == 500
    assert sorted(offset for offset, _, _, _ in rows) == list(range(500))
    assert [len(runs[-1]) for runs in sink.attempts.values()] == [150, 150, 150, 50]
    # Everything Spark committed was acknowledged: the queue holds nothing.
    assert leftover(bus, "orders") == []


def test_uncommitted_messages_stay_in_the_queue_until_spark_commits(
    spark: SparkSession, bus: Bus, tmp_path: Path
) -> None:
    publish(bus, "jobs", [f"j{n}" for n in range(40)])
    sink = Batches(fail_on="j0")
    query = start(
        source(spark, bus, tmp_path / "wal", type="QUEUE", destination="jobs"),
        sink,
        tmp_path / "cp",
    )
    with pytest.raises(PySparkException, match="failed on purpose"):
        query.awaitTermination(int(60 * T))
    assert len(sink.attempts[0][0]) == 40
    # The batch was read but never committed: no message was acknowledged, and the
    # query's Channel closing gave every one back to the queue.
    back = drain(bus, "jobs", 40)
    assert sorted(m.payload.decode() for m in back) == sorted(f"j{n}" for n in range(40))
    assert {m.deliveries for m in back} == {2}


def test_a_topic_is_read_through_a_durable_virtual_queue(
    spark: SparkSession, bus: Bus, tmp_path: Path
) -> None:
    options = {"type": "TOPIC", "destination": "/sensors/.*", "subscriber": "dash"}
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run(then: Callable[[], None]) -> None:
        frame = source(spark, bus, tmp_path / "wal", **options).select(
            "id", "destination", "payload"
        )
        writer = frame.writeStream.format("parquet").option("path", str(out))
        query = writer.option("checkpointLocation", str(checkpoint)).start()
        try:
            query.processAllAvailable()  # the reader is up: the virtual queue exists
            then()
            query.processAllAvailable()
        finally:
            query.stop()

    run(lambda: publish(bus, "/sensors/a", [f"a{n}" for n in range(100)], kind="TOPIC"))
    # While the query is down, its virtual queue keeps the topic's messages.
    publish(bus, "/sensors/b", [f"b{n}" for n in range(60)], kind="TOPIC")
    publish(bus, "/other", ["x"], kind="TOPIC")
    run(lambda: None)

    rows = spark.read.parquet(str(out)).collect()
    assert len(rows) == 160
    assert len({r["id"] for r in rows}) == 160
    assert sorted(r["payload"] for r in rows) == sorted(
        [f"a{n}" for n in range(100)] + [f"b{n}" for n in range(60)]
    )
    assert {r["destination"] for r in rows} == {"/sensors/a", "/sensors/b"}
    assert leftover(bus, "spark-dash@/sensors/.*") == []


def test_available_now_reads_what_is_queued_and_stops(
    spark: SparkSession, bus: Bus, tmp_path: Path
) -> None:
    publish(bus, "backlog", [f"k{n}" for n in range(250)])
    sink = Batches()
    frame = source(
        spark,
        bus,
        tmp_path / "wal",
        type="QUEUE",
        destination="backlog",
        maxRecordsPerBatch="64",
        numPartitions="3",
    )
    writer = frame.writeStream.foreachBatch(sink).trigger(availableNow=True)
    query = writer.option("checkpointLocation", str(tmp_path / "cp")).start()
    assert query.awaitTermination(int(60 * T))
    assert sorted(p for _, _, p, _ in sink.rows()) == sorted(f"k{n}" for n in range(250))
    assert len(sink.attempts) == 4  # 64 + 64 + 64 + 58
    # The last batch is acknowledged by the next run's first call (or its commit).
    publish(bus, "backlog", ["late"])
    query = writer.option("checkpointLocation", str(tmp_path / "cp")).start()
    assert query.awaitTermination(int(60 * T))
    assert sink.rows()[-1][2] == "late"
    assert len(sink.rows()) == 251
    assert leftover(bus, "backlog") == []


def test_the_backlog_is_bounded_in_messages_and_bytes(bus: Bus, tmp_path: Path) -> None:
    # The driver side, called as Spark calls it, in this process.
    publish(bus, "big", ["x" * 1024] * 40)
    options = {"url": bus.channel_url, "type": "QUEUE", "destination": "big"}
    options |= {"walPath": str(tmp_path), "prefetch": "4", "parallelPolls": "1"}
    reader = AsbpStreamReader(
        SourceOptions.parse({**options, "maxBacklogBytes": "10240"}), StructType([])
    )
    try:
        start = reader.initialOffset()
        assert start == {"seq": 0}
        # Polls of 4 until 10 KiB are held: 4, 8, then 12 KiB.
        first = reader.latestOffset(start, ReadAllAvailable())
        assert first == {"seq": 12}
        assert reader.latestOffset(start, ReadAllAvailable()) == first  # still full
        second = reader.latestOffset(first, ReadAllAvailable())  # commits the first 12
        assert second == {"seq": 24}
        assert reader.latestOffset(second, ReadMaxRows(5)) == {"seq": 29}
        assert reader.reportLatestOffset() == {"seq": 32}  # one poll of 4 taken
    finally:
        reader.stop()
    # Stopped uncommitted: 24..31 go back to the queue, 0..23 were acknowledged.
    assert len(drain(bus, "big", 16)) == 16


# -- writes ------------------------------------------------------------------------


def test_a_batch_write_publishes_every_row_before_it_returns(spark: SparkSession, bus: Bus) -> None:
    frame = spark.range(300).selectExpr("concat('w', cast(id AS STRING)) AS payload").repartition(3)
    writer = frame.write.format("asbp").option("url", bus.channel_url)
    writer.option("destination", "written").option("type", "QUEUE").mode("append").save()
    got = drain(bus, "written", 300)
    assert sorted(m.payload.decode() for m in got) == sorted(f"w{n}" for n in range(300))


def test_a_write_routes_rows_by_their_destination_column(spark: SparkSession, bus: Bus) -> None:
    frame = spark.createDataFrame(
        [(b"\x00\xff", "left", 9), (b"r", "right", None)],
        "payload BINARY, destination STRING, priority INT",
    )
    frame.write.format("asbp").option("url", bus.channel_url).option("type", "QUEUE").mode(
        "append"
    ).save()
    [left] = drain(bus, "left", 1)
    [right] = drain(bus, "right", 1)
    assert (left.payload, left.priority) == (b"\x00\xff", 9)
    assert (right.payload, right.priority) == (b"r", 4)


def test_a_streaming_write_publishes_each_micro_batch(
    spark: SparkSession, bus: Bus, tmp_path: Path
) -> None:
    publish(bus, "in", [f"s{n}" for n in range(150)])
    frame = source(spark, bus, tmp_path / "wal", type="QUEUE", destination="in").select("payload")
    query = (
        frame.writeStream.format("asbp")
        .option("url", bus.channel_url)
        .option("destination", "out")
        .option("type", "QUEUE")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    got = drain(bus, "out", 150)
    assert sorted(m.payload.decode() for m in got) == sorted(f"s{n}" for n in range(150))
    assert leftover(bus, "in") == []


# -- bad input ---------------------------------------------------------------------


def test_bad_options_fail_the_query_with_a_clear_reason(
    spark: SparkSession, bus: Bus, tmp_path: Path
) -> None:
    reader = spark.readStream.format("asbp").option("url", bus.channel_url)
    frame = reader.option("type", "QUEUE").option("destination", "q").load()
    query = frame.writeStream.format("noop").option("checkpointLocation", str(tmp_path)).start()
    with pytest.raises(PySparkException, match="walPath"):
        query.awaitTermination(int(60 * T))
    with pytest.raises(PySparkException, match="payload required"):
        spark.range(1).write.format("asbp").option("url", bus.channel_url).option(
            "destination", "q"
        ).mode("append").save()


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({}, "'destination' is required"),
        ({"destination": "t"}, "'subscriber' is required"),
        ({"destination": "t", "subscriber": "a@b"}, "must not contain '@'"),
        ({"destination": "q", "type": "queue"}, "'type' must be one of"),
        ({"destination": "q", "type": "QUEUE"}, "'url' is required"),
        ({"destination": "q", "type": "QUEUE", "url": "ws://x"}, "'walPath' is required"),
        (
            {"destination": "q", "type": "QUEUE", "url": "u", "walPath": "w", "prefetch": "0"},
            "1 to",
        ),
        (
            {"destination": "q", "type": "QUEUE", "url": "u", "walPath": "w", "pollWait": "x"},
            "number",
        ),
        (
            {"destination": "q", "type": "QUEUE", "url": "u", "walPath": "w", "walFsync": "1"},
            "true or false",
        ),
        (
            {"destination": "q", "type": "QUEUE", "url": "u", "walPath": "w", "payloadFormat": "j"},
            "binary or string",
        ),
        (
            {"destination": "q", "type": "QUEUE", "url": "u", "walPath": "w", "numPartitions": "a"},
            "integer",
        ),
        (
            {"destination": "q", "type": "QUEUE", "prefetch": "100", "parallelPolls": "8"},
            "at most 512",
        ),
    ],
)
def test_source_options_are_checked(options: dict[str, str], reason: str) -> None:
    with pytest.raises(OptionError, match=reason):
        SourceOptions.parse(options)


def test_sink_options_are_checked() -> None:
    with pytest.raises(OptionError, match="destination"):
        SinkOptions.parse({"url": "u"}, ("payload",))
    with pytest.raises(OptionError, match="virtual queue"):
        SinkOptions.parse({"url": "u", "destination": "d", "type": "VIRTUAL_QUEUE"}, ("payload",))
    with pytest.raises(OptionError, match="got payload, extra"):
        SinkOptions.parse({"url": "u", "destination": "d"}, ("payload", "extra"))
    parsed = SinkOptions.parse({"url": "u"}, ("payload", "destination", "priority", "ttl"))
    assert (parsed.destination, parsed.type, parsed.window) == (None, "TOPIC", 128)


# -- the write-ahead log -----------------------------------------------------------


def message(n: int, receipt: str | None = "r") -> Message:
    return Message(
        destination="q",
        subscription="q",
        type="QUEUE",
        id=f"{n:032x}",
        timestamp=1_763_712_000_000 + n,
        expiration=None,
        priority=4,
        receipt=None if receipt is None else f"{receipt}{n}",
        deliveries=1,
        keys={"m": "text/plain"},
        payload=bytes([n % 256]) * 3,
    )


def test_the_log_replays_uncommitted_entries_after_a_restart(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path)
    assert wal.add(message(n) for n in range(5)) == []
    wal.sync()
    wal.commit(2, unconfirmed=[message(1).id])
    wal.close()

    again = WriteAheadLog(tmp_path)
    assert (again.base, again.end) == (2, 5)
    entries = again.entries(2, 5)
    assert [e.message for e in entries] == [
        dataclasses.replace(message(n), receipt=None) for n in range(2, 5)
    ]
    assert all(e.receipt is None for e in entries)  # the old Channel's leases are gone
    # Redeliveries: an uncommitted one refreshes its receipt, a tombstoned one comes back
    # to be acknowledged, a committed and confirmed one would be new (never redelivered).
    assert again.add([message(3, "new"), message(1, "new"), message(9)]) == [message(1, "new")]
    assert again.entries(3, 4)[0].receipt == "new3"
    assert again.end == 6
    again.forget([message(1).id])
    assert again.add([message(1)]) == []  # forgotten: now new
    with pytest.raises(WalError, match="not in the log"):
        again.entries(0, 3)
    again.close()


def test_a_torn_last_line_is_dropped_and_a_corrupt_one_is_refused(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path)
    wal.add([message(0), message(1)])
    wal.close()
    path = tmp_path / "wal.jsonl"
    path.write_bytes(path.read_bytes() + b'{"m": {"seq": 2')
    torn = WriteAheadLog(tmp_path)
    assert torn.end == 2
    torn.add([message(2)])
    torn.close()
    reopened = WriteAheadLog(tmp_path)
    assert reopened.end == 3
    reopened.close()
    path.write_text(path.read_text().replace('"seq":1', '"seq":7'))
    with pytest.raises(WalError, match="sequence 7"):
        WriteAheadLog(tmp_path)
    path.write_text('{"m": {"seq": 0}}\n')
    with pytest.raises(WalError, match="corrupt"):
        WriteAheadLog(tmp_path, fsync=False)


def test_one_log_serves_one_query_at_a_time(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path)
    with pytest.raises(WalError, match="in use by another query"):
        WriteAheadLog(tmp_path, lock_timeout=0)
    wal.close()
    WriteAheadLog(tmp_path, lock_timeout=0).close()


def test_tombstones_are_bounded_and_a_lost_log_fast_forwards(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path, fsync=False)
    wal.commit(MAX_TOMBSTONES + 5, unconfirmed=(f"{n:032x}" for n in range(MAX_TOMBSTONES + 5)))
    lines = (tmp_path / "wal.jsonl").read_text().splitlines()
    assert json.loads(lines[0]) == {"base": MAX_TOMBSTONES + 5}
    assert len(lines) == 1 + MAX_TOMBSTONES
    assert json.loads(lines[1]) == {"t": f"{5:032x}"}  # the oldest went first
    assert wal.end == MAX_TOMBSTONES + 5
    wal.close()
