"""The routing rules of docs/protocol.md §Routing across three brokers on one real
redis-server, and again on a private six-node Redis Cluster.

Three Hypercorn brokers share a private redis-server (or the session's Redis
Cluster, tests/support/redis_cluster.py, where the plane's directory sits in one
slot and each broker's stream in its own); the User-Agents are real
WebSockets and the Application-Agents the SDK's, each holding one Tube to one
broker only: an agent needs one Tube to reach the whole bus.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from websockets.asyncio.client import ClientConnection, connect

from agents import AgentCredentialSource, ApplicationAgent, FaultError, Request
from asbp import Command, FaultCode, encode
from asbp.fault_commands import read_fault
from gateway.acl import load_acl
from gateway.app import create_app
from gateway.config.model import GatewayConfig
from tests.gateway.engines._broker_process import abandon, broker_process
from tests.support import RedisServer, RunningServer, T, serve_app_async
from tests.support.agents import make_agent, make_credentials
from tests.support.bus import DIRECTORY, client_for, flush, frame, open_with_id, until_in_directory
from tests.support.redis_cluster import RedisCluster

pytestmark = pytest.mark.anyio

LEASE = 1.5
BROKERS = ("broker-a", "broker-b", "broker-c")
#: No User-Agent may send admin.* Commands (agents may still serve them).
POLICY = """
[[security.policies.default.entries]]
action = "DENY"
types = ["COMMAND"]
destination = 'admin\\..*'
privileges = ["WRITE"]
condition = { always = true }
"""


@pytest.fixture(scope="module", params=["redis", "redis-cluster"])
def redis_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A private redis-server for the module, or the session's Redis Cluster."""
    if request.param == "redis-cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        yield cluster.url
        return
    with RedisServer(tmp_path_factory.mktemp("bus-rules-redis")) as server:
        yield server.url


@dataclass
class Bus:
    """Three brokers on one Redis, and the credentials of the agent ``echo``."""

    brokers: tuple[RunningServer, ...]
    redis_url: str
    credentials: AgentCredentialSource

    def agent(self, at: int) -> ApplicationAgent:
        """The agent ``echo`` with one Tube, to the broker ``at``."""
        return make_agent(self.credentials, [self.brokers[at].ws_url + "/tube"])

    async def channel(self, at: int) -> tuple[ClientConnection, str]:
        """A User-Agent's WebSocket on the broker ``at``, once the bus knows where it is."""
        connection, identifier = await open_with_id(self.brokers[at].ws_url + "/asbp")
        await until_in_directory(self.redis_url, "ch", identifier)
        return connection, identifier


def config(tmp_path: Path, broker_id: str, redis_url: str) -> GatewayConfig:
    directory = tmp_path / broker_id
    directory.mkdir()
    policy = tmp_path / "acl.toml"
    policy.write_text(POLICY)
    return GatewayConfig(
        data_dir=directory,
        broker_id=broker_id,
        engine="redis",
        redis_url=redis_url,
        bus_lease=LEASE,
        insecure_dev_tubes=True,
        # The agent may serve anything; the Authenticate-Command only by its name.
        agents={"echo": {"public_key": "echo.pem", "serves": [".*", "auth.login"]}},
        agents_base_dir=tmp_path,
        acl=load_acl(policy),
        authenticate_command="auth.login",
    )


@pytest.fixture
async def bus(tmp_path: Path, redis_url: str) -> AsyncIterator[Bus]:
    await flush(redis_url)
    credentials = make_credentials(tmp_path)
    async with contextlib.AsyncExitStack() as stack:
        brokers = [
            await stack.enter_async_context(
                serve_app_async(create_app(config(tmp_path, broker_id, redis_url)))
            )
            for broker_id in BROKERS
        ]
        yield Bus(tuple(brokers), redis_url, credentials)


def echo_agent(bus: Bus, at: int) -> ApplicationAgent:
    agent = bus.agent(at)

    @agent.respondent("echo")
    async def echo(request: Request) -> bytes:
        return request.body

    return agent


async def test_register_is_accepted_only_once_every_broker_finds_the_name(bus: Bus) -> None:
    agent = echo_agent(bus, 1)
    client = client_for(bus.redis_url)
    connection, _ = await bus.channel(0)
    try:
        async with agent:
            for n in range(10):

                async def answer(request: Request, n: int = n) -> bytes:
                    return b"%d" % n

                agent.add_respondent(f"late{n}", answer)
                await agent.wait_registered(5 * T)
                # The acceptance came after the directory write: no window for 2101.
                assert await client.hexists(DIRECTORY + f"name:late{n}", "broker-b")
                await connection.send(f"c=late{n},u={n};")
                reply = await frame(connection)
                assert (reply.name, reply.command_id, reply.body) == (
                    f"late{n}.reply",
                    n,
                    b"%d" % n,
                ), reply
    finally:
        await connection.close()
        await client.aclose()


async def test_an_agent_needs_one_tube_to_reach_the_whole_bus(bus: Bus) -> None:
    agent = echo_agent(bus, 1)
    async with agent:
        await agent.wait_registered(5 * T)
        await until_in_directory(bus.redis_url, "name:echo", "broker-b")
        channels = [await bus.channel(at) for at in range(3)]
        try:
            for at, (connection, identifier) in enumerate(channels):
                # Requests from every broker reach the agent and come back...
                await connection.send(f"c=echo,u={at + 1};from {at}")
                reply = await frame(connection)
                assert (reply.name, reply.command_id, reply.body, reply.get("a")) == (
                    "echo.reply",
                    at + 1,
                    b"from %d" % at,
                    "echo",
                )
                # ... and the agent's own Commands reach a Channel on every broker.
                await agent.send(Command({"c": "news", "d": identifier}, b"to %d" % at))
                news = await frame(connection)
                assert (news.name, news.body, news.get("a")) == ("news", b"to %d" % at, "echo")
                assert "d" not in news
        finally:
            for connection, _ in channels:
                await connection.close()


async def test_the_acl_denies_at_the_user_agents_broker_with_the_u(bus: Bus) -> None:
    agent = bus.agent(1)

    @agent.respondent("admin.wipe")
    async def wipe(request: Request) -> bytes:
        raise AssertionError("a denied Command reached its Respondent")

    async with agent:
        await agent.wait_registered(5 * T)
        connection, _ = await bus.channel(0)
        try:
            await connection.send("c=admin.wipe,u=4;")
            fault = await frame(connection)
            assert (fault.name, fault.command_id) == ("asbp.fault", 4)
            assert read_fault(fault).code == FaultCode.ACCESS_DENIED
        finally:
            await connection.close()


async def test_groups_span_brokers(bus: Bus) -> None:
    agent = bus.agent(1)
    async with agent:
        await agent.wait_registered(5 * T)
        channels = [await bus.channel(at) for at in range(3)]
        ids = [identifier for _, identifier in channels]
        try:
            # One Tube, to broker B: the join reaches the Channels on A and C too.
            assert await agent.join(["room"], ids) == {"broker-b"}
            for broker_id in BROKERS:
                await until_in_directory(bus.redis_url, "grp:room", broker_id)
            await agent.send(Command({"c": "news", "g": "room"}, b"all"))
            for connection, _ in channels:
                news = await frame(connection)
                assert (news.name, news.body, news.get("a")) == ("news", b"all", "echo")
                assert "g" in news
            # A Channel named in d and in the group gets the Command once.
            await agent.send(Command({"c": "news", "g": "room", "d": ids[0]}, b"once"))
            for connection, _ in channels:
                assert (await frame(connection)).body == b"once"
            # Leaving, across the bus: C's Channel gets nothing more by the group;
            # the marker sent to it by d is the next thing it sees.
            assert await agent.leave(["room"], [ids[2]]) == {"broker-b"}
            await until_in_directory(bus.redis_url, "grp:room", "broker-c", present=False)
            await agent.send(Command({"c": "news", "g": "room"}, b"without c"))
            await agent.send(Command({"c": "news", "d": ids[2]}, b"marker"))
            for connection, _ in channels[:2]:
                assert (await frame(connection)).body == b"without c"
            assert (await frame(channels[2][0])).body == b"marker"
            # A closed Channel leaves its groups: A holds no member any more.
            await channels[0][0].close()
            await until_in_directory(bus.redis_url, "grp:room", "broker-a", present=False)
        finally:
            for connection, _ in channels:
                await connection.close()


async def test_joining_a_channel_nowhere_on_the_bus_faults_2104(bus: Bus) -> None:
    agent = bus.agent(1)
    async with agent:
        await agent.wait_registered(5 * T)
        connection, identifier = await bus.channel(0)
        try:
            with pytest.raises(FaultError) as caught:
                await agent.join(["room"], [identifier, "e" * 32])
            assert caught.value.code == FaultCode.UNKNOWN_CHANNEL
            assert "e" * 32 in str(caught.value)
            # The Channel that exists joined all the same.
            await until_in_directory(bus.redis_url, "grp:room", "broker-a")
            await agent.send(Command({"c": "news", "g": "room"}, b"joined"))
            assert (await frame(connection)).body == b"joined"
        finally:
            await connection.close()


async def test_an_agent_reaches_a_respondent_registered_only_on_another_broker(
    bus: Bus,
) -> None:
    asker = bus.agent(0)
    worker = bus.agent(2)

    @worker.respondent("work")
    async def work(request: Request) -> bytes:
        return b"done " + request.body

    async with worker, asker:
        await worker.wait_registered(5 * T)
        await asker.wait_registered(5 * T)
        await until_in_directory(bus.redis_url, "name:work", "broker-c")
        # The request crosses from A to C, the answer (to the asker's inbox) back.
        answer = await asker.request("work", b"job", timeout=5 * T)
        assert answer.body == b"done job"
        with pytest.raises(FaultError) as caught:
            await asker.request("nobody.serves", b"", timeout=5 * T)
        assert caught.value.code == FaultCode.NO_RESPONDENT


async def test_an_agent_with_tubes_to_two_brokers_of_one_bus_reaches_each_member_once(
    bus: Bus,
) -> None:
    agent = make_agent(
        bus.credentials, [bus.brokers[0].ws_url + "/tube", bus.brokers[1].ws_url + "/tube"]
    )
    async with agent:
        await agent.wait_registered(5 * T)
        buses = {status.broker_id for status in agent.tubes}
        assert buses == {"broker-a", "broker-b"}
        channels = [await bus.channel(at) for at in range(3)]
        ids = [identifier for _, identifier in channels]
        try:
            # One Tube per bus: one broker accepts, and it joins all three.
            assert len(await agent.join(["room"], ids)) == 1
            await agent.send(Command({"c": "news", "g": "room"}, b"first"))
            await agent.send(Command({"c": "news", "d": ids}, b"second"))
            for connection, _ in channels:
                assert (await frame(connection)).body == b"first"
                # Not the first again: each member got it once.
                assert (await frame(connection)).body == b"second"
        finally:
            for connection, _ in channels:
                await connection.close()


async def test_requests_go_to_the_broker_with_the_fewest_in_flight(bus: Bus) -> None:
    fast, slow = bus.agent(1), bus.agent(2)
    held = asyncio.Event()
    release = asyncio.Event()

    @fast.respondent("work")
    async def quick(request: Request) -> bytes:
        return b"fast"

    @slow.respondent("work")
    async def stuck(request: Request) -> bytes:
        held.set()
        await release.wait()
        return b"slow"

    async with fast, slow:
        await fast.wait_registered(5 * T)
        await slow.wait_registered(5 * T)
        connection, _ = await bus.channel(0)
        try:
            # Both idle: the first two go one to each broker. C holds its own.
            await connection.send("c=work,u=1;")
            await connection.send("c=work,u=2;")
            assert (await frame(connection)).body == b"fast"
            async with asyncio.timeout(5 * T):
                await held.wait()
            # Now B has nothing in flight and C one: every later Command goes to B
            # (in turn, half of them would wait behind the one C holds).
            for u in range(3, 11):
                await connection.send(f"c=work,u={u};")
                reply = await frame(connection)
                assert (reply.command_id, reply.body) == (u, b"fast")
            release.set()
            assert (await frame(connection)).body == b"slow"
        finally:
            release.set()
            await connection.close()


async def raw_tube(bus: Bus, at: int, names: list[str]) -> ClientConnection:
    """The agent ``echo`` as a bare WebSocket Tube to broker ``at``, serving ``names``."""
    tube = await connect(
        bus.brokers[at].ws_url + "/tube",
        additional_headers={"Authorization": f"Bearer {bus.credentials.token()}"},
    )
    assert (await frame(tube)).name == "asbp.tube"
    await tube.send(encode(Command({"c": "asbp.register", "names": names, "u": 1})))
    accepted = await frame(tube)
    assert (accepted.name, accepted.command_id) == ("asbp.accepted", 1), accepted
    return tube


async def test_a_subject_signs_in_with_an_agent_on_another_broker_and_stays_with_it(
    bus: Bus,
) -> None:
    tube = await raw_tube(bus, 1, ["auth.login", "whoami"])
    other = bus.agent(2)  # serves whoami too, but never signed the Subject in

    @other.respondent("whoami")
    async def not_me(request: Request) -> bytes:
        return b"the wrong agent"

    connection, identifier = await bus.channel(0)
    try:
        async with other:
            await other.wait_registered(5 * T)
            await until_in_directory(bus.redis_url, "name:whoami", "broker-c")
            await connection.send("c=auth.login,u=1;alice")
            login = await frame(tube)
            subject = login.get("s")
            assert isinstance(subject, str)
            assert (login.name, login.get("i"), login.get("b"), login.body) == (
                "auth.login",
                identifier,
                "broker-a",
                b"alice",
            )
            await tube.send(
                encode(
                    Command({"c": "asbp.authenticated", "s": subject, "roles": ["clerk"], "u": 5})
                )
            )
            acknowledged = await frame(tube)
            assert (acknowledged.name, acknowledged.command_id) == ("asbp.accepted", 5)
            signed_in = await frame(connection)
            assert (signed_in.name, signed_in.get("s"), signed_in.command_id) == (
                "asbp.authenticated",
                subject,
                1,
            ), signed_in.body
            assert (signed_in.get("a"), signed_in.get("roles")) == ("echo", ("clerk",))
            # Its Commands go only to the agent that signed it in, on broker B.
            for u in range(2, 6):
                await connection.send(f"c=whoami,s={subject},u={u};")
                request = await frame(tube)
                assert (request.name, request.get("s"), request.command_id) == (
                    "whoami",
                    subject,
                    u,
                )
                await tube.send(
                    encode(Command({"c": "whoami.reply", "d": identifier, "u": u}, b"alice"))
                )
                reply = await frame(connection)
                assert (reply.command_id, reply.body) == (u, b"alice")
            # Signing out reaches the agent on B.
            await connection.send(f"c=asbp.logout,s={subject},u=9;")
            logout = await frame(connection)
            assert (logout.name, logout.command_id) == ("asbp.accepted", 9)
            ended = await frame(tube)
            assert (ended.name, ended.get("s"), ended.get("cause")) == (
                "asbp.subject.ended",
                subject,
                "logout",
            )
            await connection.send(f"c=whoami,s={subject},u=10;")
            denied = await frame(connection)
            assert read_fault(denied).code == FaultCode.ACCESS_DENIED
    finally:
        await connection.close()
        await tube.close()


async def test_refusals_from_agents_on_other_brokers_fail_the_sign_in(bus: Bus) -> None:
    refusing = [await raw_tube(bus, at, ["auth.login"]) for at in (1, 2)]
    connection, _ = await bus.channel(0)
    try:
        await connection.send("c=auth.login,u=3;mallory")
        for tube, reason in zip(refusing, (b"unknown user", b"locked"), strict=True):
            login = await frame(tube)
            subject = login.get("s")
            assert isinstance(subject, str)
            await tube.send(encode(Command({"c": "asbp.refused", "s": subject}, reason)))
        fault = await frame(connection)
        report = read_fault(fault)
        assert (report.code, fault.command_id) == (FaultCode.AUTHENTICATION_FAILED, 3)
        assert "unknown user" in report.message and "locked" in report.message
        # One refuses, the other leaves: a failure too, when the last has spoken.
        await connection.send("c=auth.login,u=4;eve")
        first = await frame(refusing[0])
        await frame(refusing[1])
        await refusing[1].close()
        await refusing[0].send(
            encode(Command({"c": "asbp.refused", "s": first.get("s") or ""}, b"no"))
        )
        fault = await frame(connection)
        report = read_fault(fault)
        assert (report.code, fault.command_id) == (FaultCode.AUTHENTICATION_FAILED, 4)
        assert "the agent left" in report.message
    finally:
        await connection.close()
        for tube in refusing:
            await tube.close()


async def test_signing_in_where_nobody_on_the_bus_serves_it_faults_2101(bus: Bus) -> None:
    connection, _ = await bus.channel(0)
    try:
        await connection.send("c=auth.login,u=6;bob")
        fault = await frame(connection)
        assert (read_fault(fault).code, fault.command_id) == (FaultCode.NO_RESPONDENT, 6)
    finally:
        await connection.close()


async def test_a_subjects_commands_fault_when_the_broker_of_its_agent_is_killed(
    tmp_path: Path, redis_url: str
) -> None:
    await flush(redis_url)
    credentials = make_credentials(tmp_path)
    settings = (
        f"bus_lease = {LEASE}\ninsecure_dev_tubes = true\n"
        'authenticate_command = "auth.login"\n'
        f"[agents.echo]\npublic_key = {str(tmp_path / 'echo.pem')!r}\n"
        "serves = ['.*', 'auth.login']\n"
    )
    url = redis_url
    async with (
        broker_process(url, tmp_path / "a", ack_timeout=30, prefetch=8, settings=settings) as a,
        broker_process(url, tmp_path / "b", ack_timeout=30, prefetch=8, settings=settings) as b,
    ):
        tube = await connect(
            b.url.replace("/asbp", "/tube"),
            additional_headers={"Authorization": f"Bearer {credentials.token()}"},
        )
        assert (await frame(tube)).name == "asbp.tube"
        await tube.send(encode(Command({"c": "asbp.register", "names": ["auth.login"], "u": 1})))
        assert (await frame(tube)).name == "asbp.accepted"
        connection, _ = await open_with_id(a.url)
        try:
            await connection.send("c=auth.login,u=1;alice")
            login = await frame(tube)
            subject = login.get("s")
            assert isinstance(subject, str)
            await tube.send(encode(Command({"c": "asbp.authenticated", "s": subject})))
            assert (await frame(connection)).name == "asbp.authenticated"
            await b.kill()
            abandon(tube)
            killed = time.monotonic()
            # Its Commands have nowhere to go: a fault with the u, within the lease.
            await connection.send(f"c=whoami,s={subject},u=7;")
            # A sign-in waiting for the agents of the dead broker fails too.
            await connection.send("c=auth.login,u=8;bob")
            faults = {}
            for _ in range(2):
                fault = await frame(connection, LEASE + 5 * T)
                assert fault.name == "asbp.fault"
                faults[fault.command_id] = read_fault(fault)
            assert faults[7].code in (FaultCode.NO_RESPONDENT, FaultCode.RESPONDENT_LEFT)
            assert faults[8].code in (FaultCode.NO_RESPONDENT, FaultCode.AUTHENTICATION_FAILED)
            assert time.monotonic() - killed <= LEASE + T
        finally:
            await connection.close()


async def test_agent_to_agent_answers_reach_the_tube_that_asked_across_the_bus(
    bus: Bus,
) -> None:
    # The asker holds Tubes to A and B, so its inbox is registered on both; each
    # answer must come back to the Tube whose request it answers.
    asker = make_agent(
        bus.credentials, [bus.brokers[0].ws_url + "/tube", bus.brokers[1].ws_url + "/tube"]
    )
    worker = bus.agent(2)

    @worker.respondent("work")
    async def work(request: Request) -> bytes:
        return b"done " + request.body

    async with worker, asker:
        await worker.wait_registered(5 * T)
        await asker.wait_registered(5 * T)
        await until_in_directory(bus.redis_url, "name:work", "broker-c")
        answers = await asyncio.gather(
            *(asker.request("work", b"%d" % n, timeout=5 * T) for n in range(12))
        )
        assert [answer.body for answer in answers] == [b"done %d" % n for n in range(12)]


async def test_an_agent_command_for_a_named_broker_that_cannot_serve_it_faults_2101(
    bus: Bus,
) -> None:
    tube = await raw_tube(bus, 0, ["x"])
    try:
        # Broker C is alive but nothing there serves it: C says so, back across the bus.
        await tube.send(encode(Command({"c": "nothing.here", "b": "broker-c", "u": 3})))
        fault = await frame(tube)
        assert (fault.name, fault.command_id) == ("asbp.fault", 3)
        assert read_fault(fault).code == FaultCode.NO_RESPONDENT
        # A broker that is not on the bus: the same fault, from broker A.
        await tube.send(encode(Command({"c": "nothing.here", "b": "broker-z", "u": 4})))
        fault = await frame(tube)
        assert (fault.name, fault.command_id) == ("asbp.fault", 4)
        assert read_fault(fault).code == FaultCode.NO_RESPONDENT
    finally:
        await tube.close()
