"""WebSocket Channels that resume on any broker of a bus (gateway.connections.resume).

Brokers on one private redis-server (Hypercorn in this process, or ``python -m
gateway`` processes where one is SIGKILLed); the Application-Agent is the SDK's,
connected to one broker only; the User-Agent is a plain ``websockets`` client
that counts the frames it received after its greeting and resumes with that count.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import anyio
import pytest
import redis.asyncio
from websockets.exceptions import ConnectionClosed

from agents import ApplicationAgent
from asbp import Command
from gateway.app import create_app
from gateway.config.model import ChannelLimits
from gateway.plane.redis.plane import PREFIX
from tests.gateway.engines._broker_process import BrokerProcess, abandon, broker_process
from tests.support import RedisServer, RunningServer, T, serve_app_async
from tests.support.agents import make_agent, make_credentials
from tests.support.bus import (
    DIRECTORY,
    client_for,
    flush,
    frame,
    kept_holds,
    until_in_directory,
)
from tests.support.keyspace import until_keys
from tests.support.redis_cluster import RedisCluster
from tests.support.resume_bus import (
    LEASE,
    bus,
    config,
    log_holds,
    open_channel,
    redis_server,
    resume,
)

pytestmark = pytest.mark.anyio

__all__ = ["bus", "redis_server"]  # fixtures, used by name


async def test_commands_sent_while_away_arrive_at_another_broker_in_order_once(
    bus: tuple[RunningServer, RunningServer, ApplicationAgent], redis_server: RedisServer
) -> None:
    a, b, agent = bus
    connection, channel_id, secret = await open_channel(a.ws_url + "/asbp")
    await until_in_directory(redis_server.url, "ch", channel_id)
    await agent.send(Command({"c": "news", "d": channel_id, "u": 1}, b"before"), confirm=0.5 * T)
    first = await frame(connection)
    assert (first.name, first.body) == ("news", b"before")
    await connection.close()
    # Gone from the directory: what the agent sends now goes into the log.
    await until_in_directory(redis_server.url, "ch", channel_id, present=False)
    for u in range(2, 102):
        await agent.send(Command({"c": "news", "d": channel_id, "u": u}, b"m%d" % u))
    await log_holds(redis_server.url, channel_id, 101)
    resumed, answer = await resume(b.ws_url + "/asbp", channel_id, secret, received=1)
    assert (answer.name, answer.get("i"), answer.get("b")) == (
        "asbp.resumed",
        channel_id,
        "broker-b",
    )
    assert (answer.get("received"), answer.get("lost")) == ("1", "0")
    got = [await frame(resumed) for _ in range(100)]
    assert [c.command_id for c in got] == list(range(2, 102))
    assert [c.body for c in got] == [b"m%d" % u for u in range(2, 102)]
    # Then it carries on, held at B: a Command routed now arrives once, live.
    await agent.send(Command({"c": "news", "d": channel_id, "u": 102}, b"live"), confirm=0.5 * T)
    live = await frame(resumed)
    assert (live.command_id, live.body) == (102, b"live")
    await resumed.send(f"c=asbp.ping,i={channel_id},u=7;")
    pong = await frame(resumed)
    assert (pong.name, pong.command_id) == ("asbp.pong", 7)
    await resumed.close()


async def test_a_wrong_secret_is_refused_as_an_unknown_channel_is(
    bus: tuple[RunningServer, RunningServer, ApplicationAgent],
) -> None:
    a, b, _ = bus
    connection, channel_id, secret = await open_channel(a.ws_url + "/asbp")
    await connection.close()
    answers = []
    for who, key in ((channel_id, "x" * len(secret)), ("f" * 32, secret), (channel_id, "")):
        refused, answer = await resume(b.ws_url + "/asbp", who, key, received=0)
        with pytest.raises(ConnectionClosed) as closed:
            await frame(refused)
        assert closed.value.rcvd is not None
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (
            1008,
            "2110 No Channel to resume",
        )
        answers.append((answer.name, answer.get("code"), answer.body.replace(who.encode(), b"")))
    # The same fault, word for word but for the identifier it names.
    assert answers[0] == answers[1] == answers[2]
    assert answers[0][:2] == ("asbp.fault", "2110")


async def test_the_old_connection_is_closed_when_the_channel_resumes_elsewhere(
    bus: tuple[RunningServer, RunningServer, ApplicationAgent], redis_server: RedisServer
) -> None:
    a, b, agent = bus
    old, channel_id, secret = await open_channel(a.ws_url + "/asbp")
    await log_holds(redis_server.url, channel_id, 0)  # what a resume looks up
    resumed, answer = await resume(b.ws_url + "/asbp", channel_id, secret, received=0)
    assert answer.name == "asbp.resumed"
    await until_in_directory(redis_server.url, "ch", channel_id)
    with pytest.raises(ConnectionClosed) as closed:
        await frame(old)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.reason == "2112 Channel resumed elsewhere"
    await agent.send(Command({"c": "news", "d": channel_id, "u": 1}, b"here"), confirm=0.5 * T)
    here = await frame(resumed)
    assert (here.command_id, here.body) == (1, b"here")
    await resumed.close()


@pytest.fixture(params=("redis", "redis-cluster"))
def bus_url(request: pytest.FixtureRequest) -> str:
    """The module's redis-server, or the session's Redis Cluster (where the log, the
    directory and each broker's stream are in different slots)."""
    if request.param == "redis-cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        return cluster.url
    server: RedisServer = request.getfixturevalue("redis_server")
    return server.url


async def test_a_broker_killed_mid_stream_loses_nothing_accepted(
    tmp_path: Path, bus_url: str
) -> None:
    redis_url = bus_url
    await flush(redis_url)
    credentials = make_credentials(tmp_path, "news")
    settings = (
        f"bus_lease = {LEASE}\ninsecure_dev_tubes = true\n"
        f"[agents.news]\npublic_key = {str(tmp_path / 'news.pem')!r}\n"
    )

    def start(name: str) -> contextlib.AbstractAsyncContextManager[BrokerProcess]:
        return broker_process(
            redis_url, tmp_path / name, ack_timeout=30, prefetch=8, settings=settings
        )

    client = client_for(redis_url)
    try:
        async with (
            start("a") as a,
            start("b") as b,
        ):
            agent = make_agent(credentials, [b.url.replace("/asbp", "/tube")])
            async with agent:
                await agent.wait_registered(5 * T)
                connection, channel_id, secret = await open_channel(a.url)
                await until_in_directory(redis_url, "ch", channel_id)
                for u in range(1, 51):
                    await agent.send(Command({"c": "news", "d": channel_id, "u": u}, b"m%d" % u))
                # The client reads part of the stream; the rest is in flight when A dies.
                seen = [await frame(connection) for _ in range(20)]
                log = f"{PREFIX}log:{{{channel_id}}}"

                async def logged() -> bool:
                    return int(await client.hget(log, "n") or 0) >= 50

                await until_keys(redis_url, (log,), logged, 5 * T)
                found = await client.hget(log, "w")
                assert isinstance(found, bytes)
                holder = found.decode()
                await a.kill()
                abandon(connection)
                # Sent while A's lease still stands: forwarded into A's inbound stream,
                # which nobody reads any more; taken from there when B holds the log.
                for u in range(51, 101):
                    await agent.send(Command({"c": "news", "d": channel_id, "u": u}, b"m%d" % u))
                alive = f"{DIRECTORY}alive:{holder}"

                async def gone() -> bool:
                    return not await client.exists(alive)

                await until_keys(redis_url, (alive,), gone, 5 * T)
                resumed, answer = await resume(b.url, channel_id, secret, received=len(seen))
                assert (answer.name, answer.get("received")) == ("asbp.resumed", "20")
                rest = [await frame(resumed) for _ in range(80)]
                got = [c.command_id for c in seen + rest]
                assert got == list(range(1, 101))
                await resumed.close()
    finally:
        await client.aclose()


async def test_a_quiet_connected_channel_outlives_the_log_age(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    redis_url = redis_server.url
    await flush(redis_url)
    make_credentials(tmp_path, "news")
    age = 2.0
    short = dataclasses.replace(
        config(tmp_path, "broker-a", redis_url), channels=ChannelLimits(log_max_age=age)
    )
    async with serve_app_async(create_app(short)) as a:
        connection, channel_id, secret = await open_channel(a.ws_url + "/asbp")
        # Its broker touches the held log (every quarter of the age): the log's last
        # use moves on while nothing is sent, past the age it would expire after.
        key = f"{PREFIX}log:{{{channel_id}}}"
        client = redis.asyncio.Redis.from_url(redis_url)
        pubsub = client.pubsub()
        try:
            await client.config_set("notify-keyspace-events", "KA")
            await pubsub.subscribe(f"__keyspace@0__:{key}")
            first = int(await client.hget(key, "s") or 0)
            with anyio.fail_after(10 * age * T):
                while int(await client.hget(key, "s") or 0) < first + 1500 * age:
                    await pubsub.get_message(ignore_subscribe_messages=True, timeout=None)
        finally:
            await pubsub.aclose()  # type: ignore[no-untyped-call]  # unannotated upstream
            await client.aclose()
        await connection.close()
        resumed, answer = await resume(a.ws_url + "/asbp", channel_id, secret, received=0)
        assert answer.name == "asbp.resumed", answer
        await resumed.close()


async def test_a_channel_resumed_at_another_broker_is_back_in_its_groups(
    bus: tuple[RunningServer, RunningServer, ApplicationAgent], redis_server: RedisServer
) -> None:
    a, b, agent = bus
    connection, channel_id, secret = await open_channel(a.ws_url + "/asbp")
    await until_in_directory(redis_server.url, "ch", channel_id)
    # The agent is on B: the join goes to A over the bus, and A keeps the record.
    assert await agent.join(["room"], [channel_id]) == {"broker-b"}
    await kept_holds(redis_server.url, channel_id, b'"room"')
    await connection.close()
    await until_in_directory(redis_server.url, "grp:room", "broker-a", present=False)
    resumed, answer = await resume(b.ws_url + "/asbp", channel_id, secret, received=0)
    assert (answer.name, answer.get("b")) == ("asbp.resumed", "broker-b")
    await until_in_directory(redis_server.url, "grp:room", "broker-b")
    await agent.send(Command({"c": "news", "g": "room", "u": 1}, b"to the room"))
    got = await frame(resumed)
    assert (got.command_id, got.body) == (1, b"to the room")
    await resumed.close()


#: Drops and resumes per run of the test below: each one is a chance for the last
#: frames A sent before the drop to land in the log after B took it.
DROPS = 10
#: Frames the agent sends per drop, as fast as it can.
BURST = 200


async def test_a_client_that_drops_mid_stream_and_resumes_elsewhere_gets_each_frame_once(
    bus: tuple[RunningServer, RunningServer, ApplicationAgent], redis_server: RedisServer
) -> None:
    a, b, agent = bus
    for run in range(DROPS):
        connection, channel_id, secret = await open_channel(a.ws_url + "/asbp")
        await until_in_directory(redis_server.url, "ch", channel_id)
        for u in range(1, BURST + 1):
            await agent.send(Command({"c": "news", "d": channel_id, "u": u}, b"m%d" % u))
        # The client reads part of the stream and drops (no closing handshake) while
        # A is still sending and logging the rest; it resumes at B at once.
        seen = [await frame(connection) for _ in range(BURST // 2 + run * 5)]
        abandon(connection)
        resumed, answer = await resume(b.ws_url + "/asbp", channel_id, secret, len(seen))
        assert answer.name == "asbp.resumed", answer
        rest: list[Command] = []
        with anyio.fail_after(10 * T):
            while len(seen) + len(rest) < BURST:
                rest.append(await frame(resumed))
        got = [c.command_id for c in seen + rest]
        assert got == list(range(1, BURST + 1)), (run, got)
        # Nothing more comes (a frame sent twice would follow): a marker is next.
        await agent.send(Command({"c": "news", "d": channel_id, "u": 999}, b"marker"))
        assert (await frame(resumed)).command_id == 999
        await resumed.close()
