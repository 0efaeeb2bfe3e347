"""One bus across brokers: two brokers on one private redis-server route to each other.

Every test runs twice: on one ``redis-server``, and on a private six-node Redis
Cluster (tests/support/redis_cluster.py), where the plane's directory sits in one
slot and each broker's inbound stream in its own (gateway/plane/redis/keys.py).

The brokers are real servers (Hypercorn, each in its own thread and event loop, or
``python -m gateway`` processes where a test kills one), the User-Agents real
WebSockets and the Application-Agent the SDK's, connected to broker B only. What
must hold across brokers is what docs/protocol.md §Routing says of one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis.asyncio
from websockets.asyncio.client import ClientConnection

from agents import AgentCredentialSource, ApplicationAgent, FaultError, Request
from asbp import Command, FaultCode, decode
from asbp.fault_commands import read_fault
from gateway.config.model import GatewayConfig
from gateway.engines.redis.connection import Client
from tests.gateway.engines._broker_process import (
    abandon,
    broker_process,
    open_channel,
    receive,
)
from tests.support import RedisServer, RunningServer, T
from tests.support.agents import make_agent, make_credentials
from tests.support.bus import (
    BUS_LEASE,
    DIRECTORY,
    bus_broker,
    bus_config,
    client_for,
    flush,
    open_with_id,
    until_in_directory,
)
from tests.support.redis_cluster import RedisCluster

pytestmark = pytest.mark.anyio

LEASE = BUS_LEASE
#: The agent credentials of each bus, by broker A's port, for a second agent.
CREDENTIALS: dict[int, AgentCredentialSource] = {}


@pytest.fixture(scope="module", params=["redis", "redis-cluster"])
def redis_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """One private redis-server for the module, or the session's Redis Cluster."""
    if request.param == "redis-cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        yield cluster.url
        return
    with RedisServer(tmp_path_factory.mktemp("bus-redis")) as server:
        yield server.url


def config(tmp_path: Path, broker_id: str, redis_url: str) -> GatewayConfig:
    return bus_config(tmp_path, broker_id, redis_url, agent="echo")


def broker(
    tmp_path: Path, broker_id: str, redis_url: str
) -> contextlib.AbstractAsyncContextManager[RunningServer]:
    return bus_broker(tmp_path, broker_id, redis_url, agent="echo")


async def frame(connection: ClientConnection, timeout: float = 5 * T) -> Command:
    with anyio.fail_after(timeout):
        return decode(await receive(connection))


@pytest.fixture
async def bus(
    tmp_path: Path, redis_url: str
) -> AsyncIterator[tuple[RunningServer, RunningServer, ApplicationAgent]]:
    await flush(redis_url)
    credentials = make_credentials(tmp_path)
    async with (
        broker(tmp_path, "broker-a", redis_url) as a,
        broker(tmp_path, "broker-b", redis_url) as b,
    ):
        agent = make_agent(credentials, [b.ws_url + "/tube"])

        @agent.respondent("echo")
        async def echo(request: Request) -> bytes:
            return request.body

        async with agent:
            await until_in_directory(redis_url, "name:echo", "broker-b")
            CREDENTIALS[a.port] = credentials
            yield a, b, agent


async def test_a_channel_on_one_broker_reaches_a_respondent_on_another(
    bus: tuple[RunningServer, RunningServer, ApplicationAgent],
) -> None:
    a, _, _ = bus
    connection = await open_channel(a.ws_url + "/asbp")
    try:
        await connection.send("c=echo,u=1;hi")
        reply = await frame(connection)
        assert (reply.name, reply.command_id, reply.body, reply.get("a")) == (
            "echo.reply",
            1,
            b"hi",
            "echo",
        )
        assert "d" not in reply
        # Many in a row, pipelined: every answer comes back, each once.
        for u in range(2, 52):
            await connection.send(f"c=echo,u={u};n{u}")
        answers = {(await frame(connection)).command_id for _ in range(50)}
        assert answers == set(range(2, 52))
    finally:
        await connection.close()


async def test_an_agent_reaches_a_channel_on_another_broker(
    bus: tuple[RunningServer, RunningServer, ApplicationAgent], redis_url: str
) -> None:
    a, _, agent = bus
    connection, identifier = await open_with_id(a.ws_url + "/asbp")
    try:
        await until_in_directory(redis_url, "ch", identifier)
        # Delivered: the broker answers with silence, so confirm waits it out and returns.
        await agent.send(Command({"c": "news", "d": identifier, "u": 3}, b"extra"), confirm=0.5 * T)
        news = await frame(connection)
        assert (news.name, news.body, news.get("a")) == ("news", b"extra", "echo")
        assert "d" not in news
    finally:
        await connection.close()


async def test_a_channel_that_exists_nowhere_gets_the_agent_fault_2104(
    bus: tuple[RunningServer, RunningServer, ApplicationAgent],
) -> None:
    _, _, agent = bus
    with pytest.raises(FaultError) as caught:
        await agent.send(Command({"c": "news", "d": "f" * 32, "u": 7}), confirm=5 * T)
    assert caught.value.code == FaultCode.UNKNOWN_CHANNEL


async def test_a_respondent_leaving_on_its_broker_faults_2102_across_the_bus(
    bus: tuple[RunningServer, RunningServer, ApplicationAgent], redis_url: str
) -> None:
    a, b, _ = bus
    arrived, released = asyncio.Event(), asyncio.Event()
    holder = make_agent(CREDENTIALS[a.port], [b.ws_url + "/tube"])

    @holder.respondent("hold")
    async def hold(request: Request) -> bytes:
        arrived.set()
        await released.wait()
        return b""

    connection = await open_channel(a.ws_url + "/asbp")
    try:
        async with holder:
            await until_in_directory(redis_url, "name:hold", "broker-b")
            await connection.send("c=hold,u=9;x")
            with anyio.fail_after(5 * T):
                await arrived.wait()
            # The agent leaves broker B with the Command unanswered: the fault
            # about it (B's for the Tube closing, through the proxy of A's
            # Channel, whichever comes first) crosses the bus to the User-Agent.
            await holder.close(timeout=0)
        fault = await frame(connection)
        assert (fault.name, fault.command_id) == ("asbp.fault", 9)
        assert read_fault(fault).code == FaultCode.RESPONDENT_LEFT
    finally:
        released.set()
        await connection.close()


async def test_a_killed_brokers_entries_expire_and_its_waiters_get_2102(
    tmp_path: Path, redis_url: str
) -> None:
    await flush(redis_url)
    credentials = make_credentials(tmp_path, "slow")
    settings = (
        f"bus_lease = {LEASE}\ninsecure_dev_tubes = true\n"
        f"[agents.slow]\npublic_key = {str(tmp_path / 'slow.pem')!r}\n"
    )
    arrived, released = asyncio.Event(), asyncio.Event()
    async with (
        broker_process(
            redis_url, tmp_path / "a", ack_timeout=30, prefetch=8, settings=settings
        ) as a,
        broker_process(
            redis_url, tmp_path / "b", ack_timeout=30, prefetch=8, settings=settings
        ) as b,
    ):
        agent = make_agent(credentials, [b.url.replace("/asbp", "/tube")])

        @agent.respondent("slow")
        async def slow(request: Request) -> bytes:
            arrived.set()
            await released.wait()  # answers only after its broker died
            return b""

        async with agent:
            waiter = await open_channel(a.url)
            on_b, b_channel = await open_with_id(b.url)
            await until_in_directory(redis_url, "ch", b_channel)
            broker_b = await directory_broker(redis_url, b_channel)
            await until_in_directory(redis_url, "name:slow", broker_b)
            await waiter.send("c=slow,u=5;x")
            with anyio.fail_after(5 * T):
                await arrived.wait()
            await b.kill()
            abandon(on_b)
            killed = time.monotonic()
            fault = await frame(waiter, LEASE + 5 * T)
            assert (fault.name, fault.command_id) == ("asbp.fault", 5)
            assert read_fault(fault).code == FaultCode.RESPONDENT_LEFT
            assert time.monotonic() - killed <= LEASE + T
            await until_in_directory(redis_url, "ch", b_channel, present=False)
            assert broker_b not in await live_brokers(redis_url)
            await waiter.close()
            released.set()


async def directory_broker(redis_url: str, channel: str) -> str:
    client = client_for(redis_url)
    try:
        value = await client.hget(DIRECTORY + "ch", channel)
    finally:
        await client.aclose()
    assert value is not None
    return value.decode() if isinstance(value, bytes) else value


async def live_brokers(redis_url: str) -> set[str]:
    client = client_for(redis_url)
    try:
        # The leases share the directory's slot, so one node holds every one.
        keys = await client.keys(DIRECTORY + "alive:*", target_nodes=await _directory_node(client))
    finally:
        await client.aclose()
    return {(k.decode() if isinstance(k, bytes) else k).rsplit(":", 1)[1] for k in keys}


async def _directory_node(client: Client) -> Any:
    if isinstance(client, redis.asyncio.RedisCluster):
        await client.initialize()
        return client.get_node_from_key(DIRECTORY + "ch")
    return None
