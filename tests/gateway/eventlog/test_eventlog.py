"""The event log: one record per routed Command, in rotating files or a Redis Stream.

End to end through a real broker (``make_gateway``): the files under ``data_dir/events``
or the Redis Stream ``asbp:events`` are read back and every line or entry parsed with
``Event.from_json``. The recorder and the two stores are also driven directly where a
condition cannot be arranged through a broker: a full buffer, a stop with events still
buffered, a Redis that is down.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union, cast

import msgspec
import orjson
import pytest
import redis.asyncio

import asbp
from asbp import Command
from asbp.eventlog import EVENT_FIELDS
from gateway.broker import Broker
from gateway.config import ConfigError, add_arguments, load_config
from gateway.config.model import EventLogConfig
from gateway.engines.redis.connection import connect
from gateway.eventlog.files import FileStore
from gateway.eventlog.recorder import CHUNK, Recorder
from gateway.eventlog.schema import (
    FIELDS,
    FILE_GLOB,
    STREAM_FIELD,
    STREAM_KEY,
    Event,
    to_ndjson,
)
from gateway.eventlog.stream import StreamStore
from tests.support import RedisServer, T
from tests.support.gateway import AGENTS, BROKER_ID, Gateway, GatewayFactory, assert_fault
from tests.support.redis_cluster import RedisCluster

pytestmark = pytest.mark.anyio


# --------------------------------------------------------------------------
# Helpers


async def flush(gateway: Gateway) -> None:
    """Have the broker write every event it recorded so far, in its own loop."""

    def start(broker: Broker) -> Any:
        assert broker.event_log is not None
        loop = asyncio.get_running_loop()
        return asyncio.run_coroutine_threadsafe(broker.event_log.flush(), loop)

    future = await gateway.call(start)
    await asyncio.wait_for(asyncio.wrap_future(future), 5 * T)


def read_files(directory: Path) -> list[Event]:
    """Every event in the NDJSON files of ``directory``, oldest file first."""
    events = []
    for path in sorted(directory.glob(FILE_GLOB)):
        for line in path.read_bytes().splitlines():
            event = Event.from_json(line)
            assert event.to_json() == line  # the one serialisation, byte for byte
            events.append(event)
    return events


def logged(tmp_path: Path) -> list[Event]:
    """The events a ``make_gateway`` broker wrote (its data_dir is tmp_path/data)."""
    return read_files(tmp_path / "data" / "events")


def only(events: list[Event], **fields: object) -> Event:
    """The one event with these field values."""
    found = [e for e in events if all(getattr(e, k) == v for k, v in fields.items())]
    assert len(found) == 1, (fields, found)
    return found[0]


def header_size(command: Command) -> int:
    return len(asbp.encode(command)) - len(command.body)


def row(number: int = 0, **fields: Any) -> dict[str, Any]:
    """The fields of the event ``record(recorder, number)`` records."""
    values: dict[str, Any] = {
        "time": 1763712000.5 + number,
        "broker": "b1",
        "source_kind": "channel",
        "source": "0" * 32,
        "subject": None,
        "command": f"c{number}",
        "header_bytes": 10,
        "body_bytes": 0,
        "destination_kind": "agent",
        "destination": "billing",
        "agent": "billing",
        "outcome": "delivered",
        "fault": None,
        "latency_us": 3,
    }
    values.update(fields)
    return values


def event(number: int = 0, **fields: Any) -> Event:
    return Event(**row(number, **fields))


def record(recorder: Recorder, number: int, command: str | None = None) -> None:
    """Record what ``row(number)`` holds (but its latency), as the router would."""
    recorder.record(
        1763712000_500000000 + number * 1_000_000_000,  # 1763712000.5 + number
        "channel",
        "0" * 32,
        None,
        f"c{number}" if command is None else command,
        None,
        10,
        0,
        ("agent", "billing", "billing"),
        None,
    )


# --------------------------------------------------------------------------
# What is recorded


#: How each JSON type of asbp.eventlog is annotated on the msgspec Struct.
_PYTHON_TYPES = {"string": str, "integer": int, "number": float}


def test_the_event_is_the_protocol_field_table() -> None:
    # The Spark reader builds its schema from asbp.eventlog.EVENT_FIELDS without
    # importing the broker; this holds the broker's Event to that same table.
    assert Event.__struct_fields__ == FIELDS
    hints = typing.get_type_hints(Event)
    for field in EVENT_FIELDS:
        annotation = hints[field.name]
        unions = (Union, types.UnionType)  # Literal[...] | None is the first, str | None the second
        members = typing.get_args(annotation) if typing.get_origin(annotation) in unions else ()
        if field.nullable:
            assert type(None) in members, field.name
            (annotation,) = [member for member in members if member is not type(None)]
        else:
            assert not members, field.name
        if field.values:
            assert typing.get_origin(annotation) is Literal, field.name
            assert typing.get_args(annotation) == field.values
        else:
            assert annotation is _PYTHON_TYPES[field.type], field.name


async def test_a_round_trip_is_one_event_each_way(
    make_gateway: GatewayFactory, tmp_path: Path
) -> None:
    gateway = await make_gateway()
    agent = await gateway.tube(serves=("echo",))
    user = await gateway.channel()
    before = time.time()
    await user.send(b"c=echo,u=7;hello")
    request = await agent.recv()
    answer = Command({"c": "echo.reply", "d": user.id, "u": 7}, b"world!")
    await agent.send(answer)
    assert (await user.recv()).name == "echo.reply"
    after = time.time()
    await flush(gateway)
    events = logged(tmp_path)

    sent = only(events, command="echo")
    assert sent == Event(
        time=sent.time,
        broker=BROKER_ID,
        source_kind="channel",
        source=user.id,
        subject=None,
        command="echo",
        header_bytes=len(b"c=echo,u=7;"),
        body_bytes=len(b"hello"),
        destination_kind="agent",
        destination="billing",
        agent="billing",
        outcome="delivered",
        fault=None,
        latency_us=sent.latency_us,
    )
    assert before <= sent.time <= after
    assert 0 <= sent.latency_us <= (after - before) * 1e6
    assert request.channel_id == user.id

    answered = only(events, command="echo.reply")
    assert answered == Event(
        time=answered.time,
        broker=BROKER_ID,
        source_kind="agent",
        source="billing",
        subject=None,
        command="echo.reply",
        header_bytes=header_size(answer),
        body_bytes=len(b"world!"),
        destination_kind="channel",
        destination=user.id,
        agent="billing",
        outcome="delivered",
        fault=None,
        latency_us=answered.latency_us,
    )
    assert sent.time <= answered.time <= after
    # The agent's registration was routed too: to the broker.
    registered = only(events, command="asbp.register")
    assert (registered.source_kind, registered.source, registered.agent) == (
        "agent",
        "billing",
        "billing",
    )
    assert (registered.destination_kind, registered.destination) == ("broker", "asbp.register")


async def test_an_http_channel_command_is_recorded(
    make_gateway: GatewayFactory, tmp_path: Path
) -> None:
    gateway = await make_gateway()
    await gateway.tube(serves=("echo",))
    http = await gateway.http_channel()
    # A quoted name: the header as sent is two bytes longer than the decoded
    # Command's own encoding, and the log has the size of the frame as sent.
    header = b"c='echo',i=%s,u=9;" % http.id.encode()
    command = asbp.decode(header + b"over http")
    assert len(header) == header_size(command) + 2
    status, reply = await http.post(header + b"over http")
    assert (status, reply.name) == (200, "asbp.accepted")
    await flush(gateway)

    event = only(logged(tmp_path), command="echo")
    assert (event.source_kind, event.source) == ("channel", http.id)
    assert (event.destination_kind, event.destination, event.agent) == (
        "agent",
        "billing",
        "billing",
    )
    assert (event.header_bytes, event.body_bytes) == (len(header), len(b"over http"))
    assert (event.outcome, event.fault) == ("delivered", None)


async def test_faults_are_recorded_with_their_code(
    make_gateway: GatewayFactory, tmp_path: Path
) -> None:
    gateway = await make_gateway()
    agent = await gateway.tube()
    user = await gateway.channel()

    no_respondent = await user.request(b"c=nobody,u=3;")
    assert_fault(no_respondent, 2101, u=3)
    malformed = b"c=echo,u=4,=x;body"
    not_decoded = await user.request(malformed)
    code = int(str(not_decoded.get("code")))
    from_agent = b"c=news,,;"
    agent_fault = await agent.request(from_agent)
    agent_code = int(str(agent_fault.get("code")))
    unknown = Command({"c": "news", "d": "0" * 32, "u": 6}, b"n")
    assert_fault(await agent.request(unknown), 2104, u=6)
    await flush(gateway)
    events = logged(tmp_path)

    nobody = only(events, command="nobody")
    assert (nobody.outcome, nobody.fault) == ("fault", 2101)
    assert (nobody.destination_kind, nobody.destination, nobody.agent) == (None, None, None)

    undecoded = [e for e in events if e.command is None]
    assert len(undecoded) == 2
    from_user = only(undecoded, source_kind="channel")
    assert from_user == Event(
        time=from_user.time,
        broker=BROKER_ID,
        source_kind="channel",
        source=user.id,
        subject=None,
        command=None,
        header_bytes=malformed.index(b";") + 1,
        body_bytes=len(b"body"),
        destination_kind=None,
        destination=None,
        agent=None,
        outcome="fault",
        fault=code,
        latency_us=from_user.latency_us,
    )
    from_tube = only(undecoded, source_kind="agent")
    assert (from_tube.source, from_tube.agent, from_tube.fault) == (
        "billing",
        "billing",
        agent_code,
    )
    assert (from_tube.header_bytes, from_tube.body_bytes) == (len(from_agent), 0)

    # Handed to no Channel: the fault is the outcome, the destination what was named.
    news = only(events, command="news", outcome="fault", fault=2104)
    assert (news.destination_kind, news.destination) == ("channel", "0" * 32)


async def test_built_ins_record_the_broker_and_messaging_its_destination(
    make_gateway: GatewayFactory, tmp_path: Path
) -> None:
    gateway = await make_gateway()
    billing = await gateway.tube()
    search = await gateway.tube("search", serves=("lookup",))
    user = await gateway.channel()
    http = await gateway.http_channel()

    assert (await user.request(Command(c="asbp.ping", u=1))).name == "asbp.pong"
    assert (await http.post(Command(c="asbp.ping", i=http.id, u=2)))[0] == 200
    requests = [
        Command(c="asbp.subscribe", destination="/news/.*", u=10),
        Command(c="asbp.subscribe", destination="jobs", type="QUEUE", u=11),
        Command(c="asbp.subscribe", destination="audit@/news/.*", type="VIRTUAL_QUEUE", u=12),
        Command(c="asbp.poll", destination="backlog", u=13),
    ]
    for request in requests:
        reply = await user.request(request)
        assert (reply.name, reply.command_id) == ("asbp.accepted", request.command_id), reply
    published = await billing.request(
        Command({"c": "asbp.publish", "destination": "/weather/a", "u": 14}, b"x")
    )
    assert published.name == "asbp.accepted", published
    joined = await billing.request(Command(c="asbp.join", groups="room", channels=user.id, u=15))
    assert joined.name == "asbp.accepted"
    await billing.send(Command(c="to.room", g="room"))
    assert (await user.recv()).name == "to.room"
    await billing.send(Command(c="lookup", u=16))
    assert (await search.recv()).name == "lookup"
    await flush(gateway)
    events = logged(tmp_path)

    def where(**fields: object) -> tuple[object, ...]:
        event = only(events, **fields)
        assert (event.outcome, event.fault) == ("delivered", None), event
        return (event.source_kind, event.destination_kind, event.destination, event.agent)

    assert where(command="asbp.ping", source=user.id) == ("channel", "broker", "asbp.ping", None)
    assert where(command="asbp.ping", source=http.id) == ("channel", "broker", "asbp.ping", None)
    subscriptions = {
        (e.destination_kind, e.destination) for e in events if e.command == "asbp.subscribe"
    }
    assert subscriptions == {
        ("topic", "/news/.*"),
        ("queue", "jobs"),
        ("virtual_queue", "audit@/news/.*"),
    }
    assert where(command="asbp.poll") == ("channel", "queue", "backlog", None)
    assert where(command="asbp.publish") == ("agent", "topic", "/weather/a", "billing")
    assert where(command="asbp.join") == ("agent", "broker", "asbp.join", "billing")
    assert where(command="to.room") == ("agent", "group", "room", "billing")
    # Between agents: the destination is the serving agent, ``agent`` the sender.
    assert where(command="lookup") == ("agent", "agent", "search", "billing")


async def test_a_subject_is_recorded(make_gateway: GatewayFactory, tmp_path: Path) -> None:
    agents = {i: {"public_key": f"{i}.pem", "serves": ["sign-in", "echo"]} for i in AGENTS}
    gateway = await make_gateway(authenticate_command="sign-in", agents=agents)
    agent = await gateway.tube(serves=("sign-in", "echo"))
    user = await gateway.channel()
    await user.send(Command(c="sign-in", u=1))
    asked = await agent.recv()
    subject = asked.subject_id
    assert subject is not None
    await agent.send(Command(c="asbp.authenticated", s=subject, roles=["reader"]))
    assert (await user.recv()).name == "asbp.authenticated"
    await user.send(Command(c="echo", s=subject, u=2))
    assert (await agent.recv()).subject_id == subject
    await flush(gateway)
    events = logged(tmp_path)

    echo = only(events, command="echo")
    assert (echo.subject, echo.destination, echo.outcome) == (subject, "billing", "delivered")
    sign_in = only(events, command="sign-in")
    assert (sign_in.destination_kind, sign_in.outcome) == ("agent", "delivered")


# --------------------------------------------------------------------------
# Files: rotation, retention, bounds


async def test_files_rotate_by_size_and_the_oldest_are_deleted(
    make_gateway: GatewayFactory, tmp_path: Path
) -> None:
    gateway = await make_gateway(event_log=EventLogConfig(file_bytes=1024, files=3))
    user = await gateway.channel()
    for n in range(40):
        assert (await user.request(Command(c="asbp.ping", u=n))).name == "asbp.pong"
        if n % 8 == 7:
            await flush(gateway)  # several batches, so files rotate between them too
    await flush(gateway)

    directory = tmp_path / "data" / "events"
    files = sorted(directory.glob(FILE_GLOB))
    assert len(files) == 3
    assert all(0 < path.stat().st_size <= 1024 for path in files)
    events = read_files(directory)
    # The oldest were deleted, the newest kept, in order across the files.
    assert 0 < len(events) < 40
    times = [e.time for e in events]
    assert times == sorted(times)
    assert all(e.command == "asbp.ping" for e in events)


async def test_file_store_splits_batches_at_lines_and_names_files_in_order(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path / "events", max_file_bytes=100, max_files=1000)
    lines = [b'{"n":%d,"pad":"%s"}\n' % (n, b"x" * 30) for n in range(60)]
    for start in range(0, 60, 6):
        # Two chunks a batch, of two and four lines.
        await store.write(
            [b"".join(lines[start : start + 2]), b"".join(lines[start + 2 : start + 6])], 6
        )
    huge = b'{"n":"huge","pad":"%s"}\n' % (b"y" * 300)
    await store.write([huge], 1)
    await store.write([lines[0]], 1)
    await store.close()

    files = store.files()
    contents = [path.read_bytes() for path in files]
    # Sorting the names sorts the files by time: their lines come back in order.
    assert b"".join(contents) == b"".join(lines) + huge + lines[0]
    assert len({path.name for path in files}) == len(files)
    assert all(c.endswith(b"\n") for c in contents)
    assert [len(c) <= 100 for c in contents].count(False) == 1  # the huge line, alone
    assert huge in contents


async def test_file_store_keeps_max_files_including_an_earlier_runs(tmp_path: Path) -> None:
    directory = tmp_path / "events"
    first = FileStore(directory, max_file_bytes=50, max_files=4)
    for n in range(3):
        await first.write([b'{"run":1,"n":%d,"pad":"..........................."}\n' % n], 1)
    await first.close()
    assert len(first.files()) == 3

    second = FileStore(directory, max_file_bytes=50, max_files=4)
    await second.write([b'{"run":2}\n'], 1)
    await second.write([b'{"run":2,"n":1,"pad":"..........................."}\n'], 1)
    await second.close()
    files = second.files()
    assert len(files) == 4
    assert files[-1].read_bytes().startswith(b'{"run":2')
    assert files[0].read_bytes() == b'{"run":1,"n":1,"pad":"..........................."}\n'


async def test_a_full_buffer_drops_and_counts_instead_of_growing(
    make_gateway: GatewayFactory,
) -> None:
    gateway = await make_gateway(event_log=EventLogConfig(buffer=16))
    user = await gateway.channel()

    def flood(broker: Broker) -> tuple[int, int, int, int]:
        # Routed in one turn of the broker's loop: the flusher cannot run meanwhile.
        recorder = broker.event_log
        assert recorder is not None
        channel = broker.channels.get(user.id)
        assert channel is not None
        buffered, dropped = recorder.buffered, recorder.dropped
        for n in range(100):
            broker.router.channel_frame(channel, b"c=asbp.ping,u=%d;" % n)
        return buffered, dropped, recorder.buffered, recorder.dropped

    buffered_before, dropped_before, buffered, dropped = await gateway.call(flood)
    assert buffered == 16
    assert dropped - dropped_before == 100 - (16 - buffered_before)
    warning = await gateway.events.wait("eventlog.missing")
    assert warning.levelno == logging.WARNING
    assert vars(warning)["dropped"] >= dropped - dropped_before
    # Routing went on: every ping was answered.
    for _ in range(100):
        assert (await user.recv()).name == "asbp.pong"


async def test_stopping_writes_what_is_buffered_and_later_events_are_dropped(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path / "events", max_file_bytes=1 << 20, max_files=2)
    # A flusher that would not wake for an hour: only stop() writes.
    recorder = Recorder(
        store, broker_id="b1", log=logging.getLogger("test.eventlog"), interval=3600
    )
    recorder.start()
    for n in range(10):
        record(recorder, n)
    await recorder.stop()
    events = read_files(tmp_path / "events")
    assert [e.command for e in events] == [f"c{n}" for n in range(10)]
    assert [msgspec.structs.replace(e, latency_us=3) for e in events] == [
        event(n) for n in range(10)
    ]
    assert (recorder.written, recorder.dropped, recorder.lost) == (10, 0, 0)
    record(recorder, 10)
    assert (recorder.buffered, recorder.dropped) == (0, 1)


async def test_events_are_written_in_chunks_as_they_are_recorded(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "events", max_file_bytes=1 << 24, max_files=2)
    recorder = Recorder(
        store,
        broker_id="b1",
        log=logging.getLogger("test.eventlog"),
        capacity=3 * CHUNK,
        batch_size=2 * CHUNK,
        interval=3600,
    )
    recorder.start()
    # Nothing awaits here, like the router: the Command that fills a chunk writes
    # it, and the buffer, counted in events, stops at capacity however they lie.
    for n in range(4 * CHUNK):
        record(recorder, n)
    assert (recorder.buffered, recorder.dropped) == (3 * CHUNK, CHUNK)
    await recorder.flush()
    assert (recorder.written, recorder.buffered) == (3 * CHUNK, 0)
    # Room again, and a chunk and a half more, of which the half is still a list.
    for n in range(3 * CHUNK // 2):
        record(recorder, 10_000 + n)
    assert recorder.buffered == 3 * CHUNK // 2
    await recorder.stop()
    events = read_files(tmp_path / "events")
    expected = list(range(3 * CHUNK)) + list(range(10_000, 10_000 + 3 * CHUNK // 2))
    assert [e.command for e in events] == [f"c{n}" for n in expected]
    assert (recorder.written, recorder.dropped, recorder.lost) == (len(expected), CHUNK, 0)


async def test_a_capacity_below_a_chunk_is_kept_exactly(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "events", max_file_bytes=1 << 20, max_files=2)
    recorder = Recorder(
        store, broker_id="b1", log=logging.getLogger("test.eventlog"), capacity=5, interval=3600
    )
    recorder.start()
    for n in range(8):
        record(recorder, n)
    assert (recorder.buffered, recorder.dropped) == (5, 3)
    await recorder.stop()
    assert [e.command for e in read_files(tmp_path / "events")] == [f"c{n}" for n in range(5)]


async def test_an_event_that_cannot_be_written_costs_its_chunk_not_the_router(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = FileStore(tmp_path / "events", max_file_bytes=1 << 20, max_files=2)
    recorder = Recorder(
        store,
        broker_id="b1",
        log=logging.getLogger("test.eventlog.encode"),
        capacity=8,
        interval=3600,
    )
    recorder.start()
    # A lone surrogate is not text: no UTF-8 for it, so no JSON. The router only
    # passes strings it decoded, but the log must survive one all the same.
    for n in range(8):
        record(recorder, n, command="\ud800" if n == 5 else None)  # fills the chunk
    record(recorder, 8)  # which it writes first: the 8 are lost, this one is kept
    assert (recorder.buffered, recorder.lost) == (1, 8)
    for n in range(9, 11):
        record(recorder, n)
    with caplog.at_level(logging.WARNING, logger="test.eventlog.encode"):
        await recorder.stop()
    assert [e.command for e in read_files(tmp_path / "events")] == ["c8", "c9", "c10"]
    assert (recorder.written, recorder.lost) == (3, 8)
    [warning] = [r for r in caplog.records if r.getMessage() == "eventlog.missing"]
    assert "UnicodeEncodeError" in str(vars(warning)["error"])


async def test_off_records_nothing(make_gateway: GatewayFactory, tmp_path: Path) -> None:
    gateway = await make_gateway(event_log=EventLogConfig(mode="off"))
    user = await gateway.channel()
    assert (await user.request(Command(c="asbp.ping", u=1))).name == "asbp.pong"
    assert await gateway.call(lambda broker: broker.event_log) is None
    assert not (tmp_path / "data" / "events").exists()


# --------------------------------------------------------------------------
# The Redis Stream


Entries = list[tuple[bytes, dict[bytes, bytes]]]


async def stream_entries(url: str, *, last: bool = False) -> Entries:
    """The stream's entries, oldest first; or only the newest."""
    client = redis.asyncio.Redis.from_url(url)
    try:
        if last:
            return cast(Entries, await client.xrevrange(STREAM_KEY, count=1))
        return cast(Entries, await client.xrange(STREAM_KEY))
    finally:
        await client.aclose()


async def test_on_the_redis_engine_events_go_to_the_stream(
    make_gateway: GatewayFactory, tmp_path: Path
) -> None:
    with RedisServer(tmp_path / "redis") as server:
        gateway = await make_gateway(engine="redis", redis_url=server.url)
        agent = await gateway.tube(serves=("echo",))
        user = await gateway.channel()
        await user.send(b"c=echo,u=1;hi")
        await agent.recv()
        await flush(gateway)
        entries = await stream_entries(server.url)

    assert not (tmp_path / "data" / "events").exists()
    events = []
    for _, fields in entries:
        assert list(fields) == [STREAM_FIELD]
        event = Event.from_json(fields[STREAM_FIELD])
        assert event.to_json() == fields[STREAM_FIELD]
        events.append(event)
    echo = only(events, command="echo")
    assert (echo.broker, echo.source, echo.destination) == (BROKER_ID, user.id, "billing")
    assert (echo.header_bytes, echo.body_bytes) == (len(b"c=echo,u=1;"), 2)
    assert only(events, command="asbp.register").source == "billing"


async def test_the_stream_is_capped(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "redis") as server:
        client = redis.asyncio.Redis.from_url(server.url)
        try:
            # Redis trims whole nodes ("MAXLEN ~"): small nodes make the cap tight.
            await client.config_set("stream-node-max-entries", 10)
            store = StreamStore(server.url, max_events=50)
            for start in range(0, 1000, 100):
                chunks = [
                    to_ndjson([event(n) for n in range(at, at + 50)]) for at in (start, start + 50)
                ]
                await store.write(chunks, 100)
            await store.close()
            length = await client.xlen(STREAM_KEY)
        finally:
            await client.aclose()
        [(_, newest)] = await stream_entries(server.url, last=True)
    assert 50 <= length <= 60
    assert Event.from_json(newest[STREAM_FIELD]).command == "c999"


async def test_a_batch_of_chunks_becomes_entries_in_order(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "redis") as server:
        store = StreamStore(server.url, max_events=100_000)
        recorder = Recorder(store, broker_id="b1", log=logging.getLogger("test.eventlog"))
        recorder.start()
        try:
            count = 2 * CHUNK + 7  # two full chunks and a partial one
            for n in range(count):
                record(recorder, n, command=TEXTS[n % len(TEXTS)] if n % 100 == 0 else None)
            await asyncio.wait_for(recorder.flush(), 5 * T)
            entries = await stream_entries(server.url)
        finally:
            await recorder.stop()
    assert recorder.written == count
    stored = [fields[STREAM_FIELD] for _, fields in entries]
    assert len(stored) == count
    events = [Event.from_json(line) for line in stored]
    assert [e.to_json() for e in events] == stored  # byte for byte
    expected = [f"c{n}" if n % 100 else TEXTS[n % len(TEXTS)] for n in range(count)]
    assert [e.command for e in events] == expected


async def test_a_redis_that_is_down_loses_batches_and_nothing_else(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = RedisServer(tmp_path / "redis")
    store = StreamStore(server.url, max_events=1000)  # Redis is not running
    recorder = Recorder(store, broker_id="b1", log=logging.getLogger("test.eventlog.redis"))
    recorder.start()
    try:
        with caplog.at_level(logging.WARNING, logger="test.eventlog.redis"):
            for n in range(5):
                record(recorder, n)
            await asyncio.wait_for(recorder.flush(), 5 * T)
        assert (recorder.written, recorder.lost, recorder.buffered) == (0, 5, 0)
        [warning] = [r for r in caplog.records if r.getMessage() == "eventlog.missing"]
        assert "ConnectionError" in str(vars(warning)["error"])

        with server:  # Redis is back: the next batch goes through
            for n in range(3):
                record(recorder, n)
            await asyncio.wait_for(recorder.flush(), 5 * T)
            assert (recorder.written, recorder.lost) == (3, 5)
            entries = await stream_entries(server.url)
            assert len(entries) == 3
            await recorder.stop()
    finally:
        await recorder.stop()


# --------------------------------------------------------------------------
# The serialisation and the settings


TEXTS = ['},{"time":1', 'quote " and \\ backslash', "new\nline", "caf\u00e9 \u2603", "\x00\x1f\x7f"]


@pytest.mark.parametrize("text", TEXTS)
def test_ndjson_lines_are_the_events_to_json(text: str) -> None:
    events = [
        event(0, command=text, destination=text),
        event(1, subject=text, agent=text, outcome="fault", fault=2101),
        event(2, source=text),
    ]
    lines = to_ndjson(events).split(b"\n")
    assert lines[-1] == b""
    assert lines[:-1] == [e.to_json() for e in events]
    assert [Event.from_json(line) for line in lines[:-1]] == events


def test_the_bytes_are_those_orjson_wrote_before() -> None:
    # Event.to_json() was orjson.dumps of the event; logs written then and now must
    # not differ, for every value an event holds: event times of any clock reading
    # (the shortest round-trip form of each float), sizes, codes, escaped text.
    clock = time.time_ns()
    times = [(clock + n * 7_654_321) / 1e9 for n in range(20_000)]
    times += [1763712000.0, 1763712000.5, 0.0, 1e-7, 9999999999999998.0]
    for n, when in enumerate(times):
        text = TEXTS[n % len(TEXTS)]
        fields = row(n, time=when, subject=text, latency_us=n * 977, fault=n % 3 or None)
        assert Event(**fields).to_json() == orjson.dumps(fields)
    # Only past 1e16 (no event time comes near: that is the year 3e8) does msgspec
    # leave out the exponent's "+"; any JSON reader reads the same number.
    far = Event(**row(time=1e16)).to_json()
    assert b'"time":1e16,' in far
    assert far == orjson.dumps(row(time=1e16)).replace(b"1e+16", b"1e16")
    assert Event.from_json(far) == Event(**row(time=1e16))


def test_fields_in_order() -> None:
    assert FIELDS == tuple(Event.__annotations__) == tuple(row())


def test_from_json_refuses_what_is_not_an_event() -> None:
    with pytest.raises(TypeError, match="object"):
        Event.from_json(b"[1]")
    with pytest.raises(TypeError, match="latency_us"):
        Event.from_json(orjson.dumps({k: v for k, v in row().items() if k != "latency_us"}))
    extra = Event.from_json(orjson.dumps({**row(), "later": "ignored"}))
    assert extra == event()


def test_event_log_settings() -> None:
    assert load_config(environ={}).event_log == EventLogConfig()
    config = load_config(
        {"event_log.mode": "off", "event_log.buffer": "5"},
        environ={"ASBP_EVENT_LOG__FILES": "3", "ASBP_EVENT_LOG__MAX_EVENTS": "10"},
    )
    assert config.event_log == EventLogConfig(mode="off", buffer=5, files=3, max_events=10)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags = load_config(parser.parse_args(["--event-log", "off"]), environ={})
    assert flags.event_log.mode == "off"
    with pytest.raises(ConfigError, match="ASBP_EVENT_LOG__BUFFER: must be positive"):
        load_config(environ={"ASBP_EVENT_LOG__BUFFER": "0"})
    with pytest.raises(ConfigError, match="must be one of 'on' or 'off'"):
        load_config({"event_log.mode": "files"}, environ={})


def test_event_log_table_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text('[event_log]\nmode = "on"\nfile_bytes = 4096\nfiles = 2\n')
    config = load_config({"config": str(path)}, environ={})
    assert config.event_log == EventLogConfig(file_bytes=4096, files=2)


# --------------------------------------------------------------------------
# The Redis Stream on a Redis Cluster


async def cluster_entries(url: str) -> Entries:
    """The stream's entries on a cluster, oldest first (the client follows the slot)."""
    client = cluster_client(url)
    try:
        return cast(Entries, await client.xrange(STREAM_KEY))
    finally:
        await client.aclose()


def cluster_client(url: str) -> redis.asyncio.RedisCluster:
    client = connect(url, connect_timeout=T, command_timeout=5 * T)
    assert isinstance(client, redis.asyncio.RedisCluster)
    return client


async def test_on_a_cluster_a_batch_of_chunks_becomes_entries_in_order(
    redis_cluster: RedisCluster,
) -> None:
    redis_cluster.flush()
    store = StreamStore(redis_cluster.url, max_events=100_000)
    recorder = Recorder(store, broker_id="b1", log=logging.getLogger("test.eventlog"))
    recorder.start()
    try:
        count = 2 * CHUNK + 7
        for n in range(count):
            record(recorder, n)
        await asyncio.wait_for(recorder.flush(), 5 * T)
    finally:
        await recorder.stop()
    entries = await cluster_entries(redis_cluster.url)
    assert recorder.written == count
    assert [Event.from_json(f[STREAM_FIELD]).command for _, f in entries] == [
        f"c{n}" for n in range(count)
    ]


async def test_on_a_cluster_the_redis_engine_logs_to_the_stream(
    make_gateway: GatewayFactory, redis_cluster: RedisCluster
) -> None:
    redis_cluster.flush()
    gateway = await make_gateway(engine="redis", redis_url=redis_cluster.url)
    agent = await gateway.tube(serves=("echo",))
    user = await gateway.channel()
    await user.send(b"c=echo,u=1;hi")
    await agent.recv()
    await flush(gateway)
    events = [Event.from_json(f[STREAM_FIELD]) for _, f in await cluster_entries(redis_cluster.url)]
    echo = only(events, command="echo")
    assert (echo.broker, echo.source, echo.destination) == (BROKER_ID, user.id, "billing")
