"""Resuming a WebSocket Channel on a lone broker (the ``memory`` engine, ``resume = "on"``).

A real broker (Hypercorn in this process), the SDK's Application-Agent and a plain
``websockets`` User-Agent that counts the frames it received after its greeting.
The bus-wide cases (another broker, a killed one) are in
tests/gateway/routing/test_bus_resume.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from agents import ApplicationAgent, FaultError
from asbp import Command
from gateway.app import create_app
from gateway.config.model import ChannelLimits, GatewayConfig, ResumeMode
from tests.support import RunningServer, T, serve_app_async
from tests.support.agents import make_agent, make_credentials
from tests.support.bus import frame

pytestmark = pytest.mark.anyio


@contextlib.asynccontextmanager
async def lone_broker(
    tmp_path: Path, *, resume: ResumeMode = "on", max_frames: int = 10_000
) -> AsyncIterator[tuple[RunningServer, ApplicationAgent]]:
    credentials = make_credentials(tmp_path, "news")
    config = GatewayConfig(
        data_dir=tmp_path,
        insecure_dev_tubes=True,
        agents={"news": {"public_key": "news.pem"}},
        agents_base_dir=tmp_path,
        channels=ChannelLimits(resume=resume, log_max_frames=max_frames),
    )
    async with serve_app_async(create_app(config)) as running:
        agent = make_agent(credentials, [running.ws_url + "/tube"])
        async with agent:
            await agent.wait_registered(5 * T)
            yield running, agent


async def open_channel(url: str) -> tuple[ClientConnection, str, str]:
    connection = await connect(url, compression=None, max_size=None)
    greeting = await frame(connection)
    assert greeting.name == "asbp.channel", greeting
    return connection, str(greeting.get("i")), str(greeting.get("secret"))


async def resume_with(url: str, first: str) -> tuple[ClientConnection, Command]:
    connection = await connect(url + "/asbp?resume", compression=None, max_size=None)
    await connection.send(first)
    return connection, await frame(connection)


async def closed_with(connection: ClientConnection) -> tuple[int, str]:
    with pytest.raises(ConnectionClosed) as closed:
        await frame(connection)
    assert closed.value.rcvd is not None
    return closed.value.rcvd.code, closed.value.rcvd.reason


async def send(agent: ApplicationAgent, channel_id: str, first: int, last: int) -> None:
    for u in range(first, last + 1):
        await agent.send(Command({"c": "news", "d": channel_id, "u": u}, b"m%d" % u))


async def test_a_channel_resumes_on_the_same_broker_with_what_it_missed(tmp_path: Path) -> None:
    async with lone_broker(tmp_path) as (broker, agent):
        connection, channel_id, secret = await open_channel(broker.ws_url + "/asbp")
        await send(agent, channel_id, 1, 10)
        seen = [await frame(connection) for _ in range(3)]
        await connection.close()
        # Away: the lone broker puts what is routed to the Channel into its log.
        await agent.send(Command({"c": "news", "d": channel_id, "u": 11}, b"m11"), confirm=0.5 * T)
        resumed, answer = await resume_with(
            broker.ws_url,
            f"c=asbp.resume,i={channel_id},secret={secret},received={len(seen)};",
        )
        assert (answer.name, answer.get("received"), answer.get("lost")) == (
            "asbp.resumed",
            "3",
            "0",
        )
        rest = [await frame(resumed) for _ in range(8)]
        assert [c.command_id for c in seen + rest] == list(range(1, 12))
        await resumed.close()


async def test_what_retention_dropped_is_reported_as_a_gap(tmp_path: Path) -> None:
    async with lone_broker(tmp_path, max_frames=5) as (broker, agent):
        connection, channel_id, secret = await open_channel(broker.ws_url + "/asbp")
        await send(agent, channel_id, 1, 10)
        seen = [await frame(connection) for _ in range(10)]
        await connection.close()
        resumed, gap = await resume_with(
            broker.ws_url, f"c=asbp.resume,i={channel_id},secret={secret},received=3;"
        )
        # The log kept 6..10: numbers 4 and 5 are lost, and the client is told so.
        assert (gap.name, gap.get("code")) == ("asbp.fault", "2111")
        assert gap.body.startswith(b"2 Commands for Channel")
        answer = await frame(resumed)
        assert (answer.name, answer.get("received"), answer.get("lost")) == (
            "asbp.resumed",
            "5",
            "2",
        )
        rest = [await frame(resumed) for _ in range(5)]
        assert [c.command_id for c in rest] == [c.command_id for c in seen[5:]]
        await resumed.close()


async def test_bad_first_frames_get_a_fault_and_the_broker_serves_on(tmp_path: Path) -> None:
    async with lone_broker(tmp_path) as (broker, _):
        for first, code in (
            ("c=asbp.ping,u=1;", "1202"),
            ("c=asbp.resume,received=x;", "1201"),
            ("not a frame", "1201"),
        ):
            refused, fault = await resume_with(broker.ws_url, first)
            assert (fault.name, fault.get("code")) == ("asbp.fault", code), first
            assert (await closed_with(refused))[0] == 1008
        # Everyone else is still served.
        connection, _, _ = await open_channel(broker.ws_url + "/asbp")
        await connection.close()


async def test_an_old_connection_on_the_same_broker_is_closed_with_2112(tmp_path: Path) -> None:
    async with lone_broker(tmp_path) as (broker, agent):
        old, channel_id, secret = await open_channel(broker.ws_url + "/asbp")
        resumed, answer = await resume_with(
            broker.ws_url, f"c=asbp.resume,i={channel_id},secret={secret},received=0;"
        )
        assert answer.name == "asbp.resumed"
        assert await closed_with(old) == (1001, "2112 Channel resumed elsewhere")
        await send(agent, channel_id, 1, 1)
        assert (await frame(resumed)).command_id == 1
        await resumed.close()


async def test_resume_off_is_refused_with_2113(tmp_path: Path) -> None:
    async with lone_broker(tmp_path, resume="auto") as (broker, _):
        connection, channel_id, secret = await open_channel(broker.ws_url + "/asbp")
        await connection.close()
        refused, fault = await resume_with(
            broker.ws_url, f"c=asbp.resume,i={channel_id},secret={secret},received=0;"
        )
        assert (fault.name, fault.get("code")) == ("asbp.fault", "2113")
        assert await closed_with(refused) == (1008, "2113 Resume unavailable")


async def test_a_resumed_channel_is_back_in_its_groups(tmp_path: Path) -> None:
    async with lone_broker(tmp_path) as (broker, agent):
        connection, channel_id, secret = await open_channel(broker.ws_url + "/asbp")
        assert await agent.join(["room", "hall"], [channel_id])
        assert await agent.leave(["hall"], [channel_id])
        await connection.close()
        resumed, answer = await resume_with(
            broker.ws_url, f"c=asbp.resume,i={channel_id},secret={secret},received=0;"
        )
        assert answer.name == "asbp.resumed", answer
        await agent.send(Command({"c": "news", "g": "room", "u": 1}, b"to the room"))
        got = await frame(resumed)
        assert (got.command_id, got.body) == (1, b"to the room")
        # It left "hall" before it dropped: it is not back in that one.
        await agent.send(Command({"c": "news", "g": "hall", "u": 2}, b"to the hall"))
        await agent.send(Command({"c": "news", "d": channel_id, "u": 3}, b"direct"))
        assert (await frame(resumed)).command_id == 3
        await resumed.close()


@pytest.mark.parametrize(
    ("query", "counted"),
    [
        pytest.param("", True, id="old client: counts every frame"),
        pytest.param("?count=2", False, id="count=2: queue deliveries not counted"),
    ],
)
async def test_a_queue_delivery_before_the_drop_costs_no_logged_frame_on_resume(
    tmp_path: Path, query: str, counted: bool
) -> None:
    """A client that declares nothing (any from before ``count``) counts every frame, the
    queue delivery included, so the broker logs it; one that opens with ``count=2`` does
    not count it, and the broker leaves it out of the log (the queue is its log). Either
    way the frame routed while it was away arrives after the resume (a count that
    disagreed with the log would skip it or replay the one before), and the job,
    never acknowledged, comes again from its queue with a new receipt."""
    async with lone_broker(tmp_path) as (broker, agent):
        publisher, _, _ = await open_channel(broker.ws_url + "/asbp")
        connection = await connect(broker.ws_url + "/asbp" + query, compression=None)
        greeting = await frame(connection)
        channel_id, secret = greeting.get("i"), greeting.get("secret")
        # Said back only to a client that asked: the broker leaves them out.
        assert greeting.get("count") == (None if counted else "2")
        await connection.send("c=asbp.subscribe,destination=jobs,type=QUEUE,u=1;")
        assert (await frame(connection)).command_id == 1
        received = 1
        await publisher.send("c=asbp.publish,destination=jobs,type=QUEUE,u=1;job")
        assert (await frame(publisher)).name == "asbp.accepted"
        delivered = await frame(connection)  # never acknowledged
        assert (delivered.name, delivered.body) == ("asbp.notification", b"job")
        received += counted
        await agent.send(Command({"c": "news", "d": channel_id, "u": 7}, b"before"))
        assert (await frame(connection)).body == b"before"
        received += 1
        await connection.close()
        await agent.send(Command({"c": "news", "d": channel_id, "u": 8}, b"away"))
        resumed, answer = await resume_with(
            broker.ws_url, f"c=asbp.resume,i={channel_id},secret={secret},received={received};"
        )
        assert (answer.name, answer.get("received"), answer.get("lost")) == (
            "asbp.resumed",
            str(received),
            "0",
        )
        assert answer.get("count") == (None if counted else "2")
        # The frame logged while away first (the replay), then the job from its queue.
        away, again = await frame(resumed), await frame(resumed)
        assert (away.command_id, away.body) == (8, b"away")
        assert (again.name, again.body) == ("asbp.notification", b"job")
        assert again.get("receipt") != delivered.get("receipt")
        await resumed.send(f"c=asbp.ack,destination=jobs,receipt={again.get('receipt')},u=2;")
        acked = await frame(resumed)
        assert (acked.command_id, acked.get("count")) == (2, "1")
        for each in (resumed, publisher):
            await each.close()


@pytest.mark.parametrize("query", ["?count=3", "?count=", "?count=2&count=2"])
async def test_a_count_the_broker_does_not_know_is_refused_with_a_fault(
    tmp_path: Path, query: str
) -> None:
    """A client that counts some way the broker does not know would lose frames on its
    first resume: it gets fault 1203 instead of a Channel, and the broker serves on."""
    async with lone_broker(tmp_path) as (broker, _):
        connection = await connect(broker.ws_url + "/asbp" + query, compression=None)
        fault = await frame(connection)
        assert (fault.name, fault.get("code")) == ("asbp.fault", "1203")
        assert "count of /asbp is 1" in fault.body.decode()
        assert (await closed_with(connection))[0] == 1008
        other, _, _ = await open_channel(broker.ws_url + "/asbp?count=1")
        await other.send("c=asbp.ping,u=1;")
        assert (await frame(other)).command_id == 1
        await other.close()


async def test_an_agent_may_not_send_a_queue_delivery(tmp_path: Path) -> None:
    """An ``asbp.notification`` with a ``receipt`` from an agent (relaying another bus's
    queue delivery, say) is refused: a ``count=2`` client would not count it, though
    the log numbered it. Without the receipt it reaches the Channel."""
    async with lone_broker(tmp_path) as (broker, agent):
        connection, channel_id, _ = await open_channel(broker.ws_url + "/asbp?count=2")
        relayed = {"c": "asbp.notification", "d": channel_id, "destination": "jobs"}
        with pytest.raises(FaultError) as refused:
            await agent.send(Command({**relayed, "receipt": "r1", "u": 8}, b"job"), confirm=5 * T)
        assert (refused.value.code, refused.value.cause) == (3201, "asbp.notification")
        assert "only the broker sends" in refused.value.message
        await agent.send(Command({**relayed, "u": 9}, b"job"))
        arrived = await frame(connection)
        assert (arrived.name, arrived.command_id, arrived.get("receipt")) == (
            "asbp.notification",
            9,
            None,
        )
        await connection.close()
