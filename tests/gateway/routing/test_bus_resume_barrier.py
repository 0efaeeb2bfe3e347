"""A Channel resumed elsewhere while its old broker still had frames for it on their way
(issue 11: "in order, none twice"; gateway.plane.redis.release_barriers, and on a Redis
Cluster gateway.plane.redis.counted_barriers).

Broker A holds the Channel; the agent is on broker B, so each Command for the Channel
is forwarded into A's inbound stream. A is paused (SIGSTOP: a real stall, as a long
garbage collection or a starved CPU makes one) while Commands wait in that stream,
the client drops and resumes at B, and more Commands are sent. Only once A runs
again (SIGCONT) can it read what was sent to it: those Commands must still reach the
client before the ones sent after them. On one Redis and on a Redis Cluster (where the
log, the directory and each broker's stream are in different slots, so a forward to
the holder is two calls).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import redis.asyncio
from websockets.asyncio.client import ClientConnection

from asbp import Command
from gateway.app import create_app
from gateway.config.model import GatewayConfig
from gateway.engines.redis.connection import Client
from gateway.plane.redis.keys import stream_key
from gateway.plane.redis.plane import PREFIX
from tests.gateway.engines._broker_process import BrokerProcess, abandon, broker_process
from tests.support import RedisServer, T, serve_app_async
from tests.support.agents import make_agent, make_credentials
from tests.support.bus import (
    DIRECTORY,
    client_for,
    flush,
    frame,
    holder_of,
    open_resumable,
    resume_at,
    until_in_directory,
)
from tests.support.keyspace import until_keys
from tests.support.redis_cluster import RedisCluster

pytestmark = pytest.mark.anyio

#: Long enough that A keeps its lease (half of it) while it is paused: a paused broker
#: is alive, only slow; one whose lease ran out is a dead one, salvaged (another test).
LEASE = 10.0
#: Commands sent in each of the three parts.
PART = 10


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("bus-resume-barrier-redis")) as server:
        yield server


@pytest.fixture(params=("redis", "redis-cluster"))
def bus_url(request: pytest.FixtureRequest) -> str:
    """The module's redis-server, or the session's Redis Cluster."""
    if request.param == "redis-cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        return cluster.url
    server: RedisServer = request.getfixturevalue("redis_server")
    return server.url


async def entries(client: Client, stream: str) -> list[dict[bytes, bytes]]:
    found: list[tuple[bytes, dict[bytes, bytes]]] = await client.xrange(stream)  # type: ignore[assignment]  # redis-py types replies loosely
    return [fields for _, fields in found]


async def test_commands_waiting_at_a_paused_broker_arrive_before_later_ones(
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

    async def send(first: int, last: int) -> None:
        for u in range(first, last + 1):
            await agent.send(Command({"c": "news", "d": channel_id, "u": u}, b"m%d" % u))

    async with start("a") as a, start("b") as b:
        agent = make_agent(credentials, [b.url.replace("/asbp", "/tube")])
        async with agent:
            await agent.wait_registered(5 * T)
            connection, channel_id, secret = await open_resumable(a.url)
            await until_in_directory(redis_url, "ch", channel_id)
            await send(1, PART)
            seen = [await frame(connection) for _ in range(PART)]
            log = f"{PREFIX}log:{{{channel_id}}}"
            client = client_for(redis_url)
            found = await client.hget(log, "w")
            assert isinstance(found, bytes)
            holder = found.decode()
            inbound = stream_key(PREFIX, holder)

            def for_channel(fields: dict[bytes, bytes]) -> bool:
                return fields.get(b"i") == channel_id.encode() and fields.get(b"k") == b"c"

            async def waiting_at_a(count: int) -> bool:
                return sum(map(for_channel, await entries(client, inbound))) >= count

            a.process.send_signal(signal.SIGSTOP)
            resuming: asyncio.Task[tuple[ClientConnection, Command]] | None = None
            try:
                # Forwarded to A, which holds the Channel, and left unread there.
                await send(PART + 1, 2 * PART)
                await until_keys(redis_url, (inbound,), lambda: waiting_at_a(PART))
                abandon(connection)
                resuming = asyncio.create_task(
                    resume_at(b.url, channel_id, secret, received=len(seen))
                )

                async def b_told_a() -> bool:
                    # B does not wait for A for ever: it tells A about the resume
                    # (whatever it says: an envelope that is no Command for the Channel).
                    kinds = {fields.get(b"k") for fields in await entries(client, inbound)}
                    return bool(kinds - {b"c", b"d", b"w"})

                await until_keys(redis_url, (inbound,), b_told_a)
                # Sent after the ones waiting at A: wherever they go now (B, if it took
                # the Channel, or A's stream behind the others), they come after them.
                await send(2 * PART + 1, 3 * PART)

                async def routed() -> bool:
                    at_b = int(await client.hget(log, "n") or 0) >= 2 * PART
                    return at_b or await waiting_at_a(2 * PART)

                await until_keys(redis_url, (log, inbound), routed)
            finally:
                a.process.send_signal(signal.SIGCONT)
                await client.aclose()
                if resuming is not None and not resuming.done():
                    with anyio.fail_after(10 * T):
                        await asyncio.wait([resuming])
            assert resuming is not None
            resumed, answer = resuming.result()
            assert (answer.name, answer.get("received")) == ("asbp.resumed", str(PART))
            rest = [await frame(resumed) for _ in range(2 * PART)]
            got = [c.command_id for c in seen + rest]
            assert got == list(range(1, 3 * PART + 1))
            # Nothing more comes (a Command delivered twice would): a marker is next.
            await agent.send(Command({"c": "news", "d": channel_id, "u": 999}, b"marker"))
            assert (await frame(resumed)).command_id == 999
            await resumed.close()


async def test_a_holder_that_never_lets_go_is_taken_from_after_the_lease(
    tmp_path: Path, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    # A broker from before LET_GO holding the log, alive, its connection lingering:
    # its real presence key and the log's holder field, written as it would write
    # them (nothing answers for it). The resume waits the lease for it, no longer.
    redis_url = redis_server.url
    await flush(redis_url)
    lease = 1.5
    settings = GatewayConfig(
        data_dir=tmp_path / "b", broker_id="broker-b", engine="redis", redis_url=redis_url,
        bus_lease=lease,
    )  # fmt: skip
    settings.data_dir.mkdir()
    async with serve_app_async(create_app(settings)) as b:
        connection, channel_id, secret = await open_resumable(b.ws_url + "/asbp")
        await until_in_directory(redis_url, "ch", channel_id)
        abandon(connection)
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            await client.set(f"{DIRECTORY}alive:broker-old", "1", px=int(30_000 * T))
            await client.hset(f"{PREFIX}log:{{{channel_id}}}", "w", "broker-old")
            with caplog.at_level(logging.WARNING, logger="asbp.plane"):
                resumed, answer = await resume_at(b.ws_url + "/asbp", channel_id, secret, 0)
        finally:
            await client.delete(f"{DIRECTORY}alive:broker-old")
            await client.aclose()
        assert answer.name == "asbp.resumed", answer
        assert any(r.msg == "plane.resume_not_released" for r in caplog.records)
        assert await holder_of(redis_url, channel_id) == "broker-b"
        await resumed.close()
