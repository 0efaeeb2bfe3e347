"""A resumed WebSocket Channel keeps its Subjects and groups (gateway.routing.resume_subjects).

Real brokers (Hypercorn in this process): two on one private redis-server, the
Channel resuming at the other broker, and a lone broker on the ``memory``
engine, the Channel resuming there. The agent is a bare WebSocket Tube, so the
test sees every frame it gets (an ``asbp.subject.ended`` it must not get
included); the User-Agent is a plain ``websockets`` client.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect

from agents import AgentCredentialSource
from asbp import Command, FaultCode, encode
from asbp.fault_commands import read_fault
from gateway.app import create_app
from gateway.config.model import ChannelLimits, GatewayConfig
from tests.gateway.engines._broker_process import BrokerProcess, abandon, broker_process
from tests.support import RedisServer, RunningServer, T, serve_app_async
from tests.support.agents import make_credentials
from tests.support.bus import (
    flush,
    frame,
    holder_of,
    kept_holds,
    lease_gone,
    open_resumable,
    resume_at,
    until,
    until_in_directory,
)

pytestmark = pytest.mark.anyio

LEASE = 1.5
#: The Subject's Conversation-Address (``p``): it follows the Subject too.
ADDRESS = "alice*example.org"


def config(tmp_path: Path, broker_id: str, redis_url: str | None) -> GatewayConfig:
    directory = tmp_path / broker_id
    directory.mkdir()
    bus = {"engine": "redis", "redis_url": redis_url, "bus_lease": LEASE} if redis_url else {}
    return GatewayConfig(
        data_dir=directory,
        broker_id=broker_id,
        insecure_dev_tubes=True,
        agents={"news": {"public_key": "news.pem", "serves": [".*", "auth.login"]}},
        agents_base_dir=tmp_path,
        authenticate_command="auth.login",
        channels=ChannelLimits(resume="on"),
        **bus,  # type: ignore[arg-type]  # engine, redis_url, bus_lease
    )


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("resume-subjects-redis")) as server:
        yield server


@contextlib.asynccontextmanager
async def brokers(
    tmp_path: Path, redis_url: str | None, *names: str
) -> AsyncIterator[tuple[AgentCredentialSource, list[RunningServer]]]:
    credentials = make_credentials(tmp_path, "news")  # the key the brokers read at start
    async with contextlib.AsyncExitStack() as stack:
        yield (
            credentials,
            [
                await stack.enter_async_context(
                    serve_app_async(create_app(config(tmp_path, name, redis_url)))
                )
                for name in names
            ],
        )


async def tube_at(
    credentials: AgentCredentialSource, broker: RunningServer | str
) -> ClientConnection:
    """The agent ``news`` as a bare Tube serving the Authenticate-Command and ``whoami``
    (at a broker in this process, or the ``/tube`` URL of one in another)."""
    tube = await connect(
        broker if isinstance(broker, str) else broker.ws_url + "/tube",
        additional_headers={"Authorization": f"Bearer {credentials.token()}"},
    )
    assert (await frame(tube)).name == "asbp.tube"
    await tube.send(
        encode(Command({"c": "asbp.register", "names": ["auth.login", "whoami"], "u": 1}))
    )
    accepted = await frame(tube)
    assert (accepted.name, accepted.command_id) == ("asbp.accepted", 1), accepted
    return tube


async def sign_in(connection: ClientConnection, tube: ClientConnection, channel_id: str) -> str:
    """``asbp.join`` of the Channel to ``room``, then a Subject signed in: its ``s``."""
    await tube.send(
        encode(Command({"c": "asbp.join", "groups": "room", "channels": channel_id, "u": 2}))
    )
    joined = await frame(tube)
    assert (joined.name, joined.command_id) == ("asbp.accepted", 2), joined
    await connection.send("c=auth.login,u=1;alice")
    login = await frame(tube)
    subject = login.get("s")
    assert isinstance(subject, str) and login.name == "auth.login"
    await tube.send(
        encode(
            Command(
                {"c": "asbp.authenticated", "s": subject, "roles": "clerk", "p": ADDRESS, "u": 3}
            )
        )
    )
    assert (await frame(tube)).command_id == 3
    signed_in = await frame(connection)
    assert (signed_in.name, signed_in.get("s")) == ("asbp.authenticated", subject), signed_in
    assert signed_in.get("p") == ADDRESS
    return subject


async def kept_across_the_resume(
    resumed: ClientConnection,
    tube: ClientConnection,
    stranger: ClientConnection,
    channel_id: str,
    subject: str,
) -> None:
    """What the resumed Channel has, and a stranger knowing ``i`` and ``s`` has not."""
    # A group Command reaches it.
    await tube.send(encode(Command({"c": "news", "g": "room", "u": 6}, b"to the room")))
    got = await frame(resumed)
    assert (got.command_id, got.body) == (6, b"to the room")
    # A stranger presenting the Subject's s (and the Channel's i) gets 3201, and the
    # agent nothing: its next frame is the resumed Channel's Authenticated-Command.
    await stranger.send(f"c=whoami,i={channel_id},s={subject},u=8;")
    denied = await frame(stranger)
    assert read_fault(denied).code == FaultCode.ACCESS_DENIED
    await stranger.send(f"c=asbp.logout,s={subject},u=9;")
    assert read_fault(await frame(stranger)).code == FaultCode.ACCESS_DENIED
    # The Subject's s is unchanged, and its Authenticated-Commands reach the agent
    # that signed it in, which was never told it ended.
    await resumed.send(f"c=whoami,s={subject},u=7;")
    request = await frame(tube)
    assert (request.name, request.get("s"), request.command_id) == ("whoami", subject, 7)
    assert request.get("roles") in (None, "clerk", ("clerk",))
    await tube.send(encode(Command({"c": "whoami.reply", "d": channel_id, "u": 7}, b"alice")))
    reply = await frame(resumed)
    assert (reply.command_id, reply.body) == (7, b"alice")
    # Signing out ends it, and the agent hears so once.
    await resumed.send(f"c=asbp.logout,s={subject},u=10;")
    assert (await frame(resumed)).command_id == 10
    ended = await frame(tube)
    assert (ended.name, ended.get("s"), ended.get("cause")) == (
        "asbp.subject.ended",
        subject,
        "logout",
    )


@pytest.mark.parametrize(
    "agent_at", [0, 1], ids=["agent-at-the-first-broker", "agent-at-the-second"]
)
async def test_a_channel_resumed_at_another_broker_keeps_its_subjects_and_groups(
    tmp_path: Path, redis_server: RedisServer, agent_at: int
) -> None:
    redis_url = redis_server.url
    await flush(redis_url)
    async with brokers(tmp_path, redis_url, "broker-a", "broker-b") as (credentials, (a, b)):
        tube = await tube_at(credentials, (a, b)[agent_at])
        connection, channel_id, secret = await open_resumable(a.ws_url + "/asbp")
        await until_in_directory(redis_url, "ch", channel_id)
        subject = await sign_in(connection, tube, channel_id)
        await kept_holds(redis_url, channel_id, subject.encode())
        await connection.close()
        await until_in_directory(redis_url, "ch", channel_id, present=False)
        resumed, answer = await resume_at(b.ws_url + "/asbp", channel_id, secret, received=2)
        assert (answer.name, answer.get("b"), answer.get("kept")) == (
            "asbp.resumed",
            "broker-b",
            ("groups", "subjects", "subscriptions"),
        )
        assert answer.get("subjects") == (subject,)  # the one that followed it
        await until_in_directory(redis_url, "grp:room", "broker-b")
        await until_in_directory(redis_url, f"addr:{ADDRESS}", "broker-b")
        stranger, _, _ = await open_resumable(a.ws_url + "/asbp")
        await kept_across_the_resume(resumed, tube, stranger, channel_id, subject)
        for connection in (resumed, stranger, tube):
            await connection.close()


async def test_a_channel_resumed_at_its_lone_broker_keeps_its_subjects_and_groups(
    tmp_path: Path,
) -> None:
    async with brokers(tmp_path, None, "lone") as (credentials, (lone,)):
        tube = await tube_at(credentials, lone)
        connection, channel_id, secret = await open_resumable(lone.ws_url + "/asbp")
        subject = await sign_in(connection, tube, channel_id)
        await connection.close()
        resumed, answer = await resume_at(lone.ws_url + "/asbp", channel_id, secret, received=2)
        assert (answer.name, answer.get("kept")) == (
            "asbp.resumed",
            ("groups", "subjects", "subscriptions"),
        )
        assert answer.get("subjects") == (subject,)
        stranger, _, _ = await open_resumable(lone.ws_url + "/asbp")
        await kept_across_the_resume(resumed, tube, stranger, channel_id, subject)
        for connection in (resumed, stranger, tube):
            await connection.close()


async def test_subjects_of_a_channel_that_never_resumes_end_when_its_log_would(
    tmp_path: Path,
) -> None:
    credentials = make_credentials(tmp_path, "news")
    short = dataclasses.replace(
        config(tmp_path, "lone", None), channels=ChannelLimits(resume="on", log_max_age=1.0)
    )
    async with serve_app_async(create_app(short)) as lone:
        tube = await tube_at(credentials, lone)
        connection, channel_id, _ = await open_resumable(lone.ws_url + "/asbp")
        subject = await sign_in(connection, tube, channel_id)
        await connection.close()
        # The agent hears it ended once the wait is over (the housekeeping tick ends it).
        ended = await frame(tube, timeout=10 * T)
        assert (ended.name, ended.get("s"), ended.get("cause")) == (
            "asbp.subject.ended",
            subject,
            "channel closed",
        )
        await tube.close()


async def test_subjects_follow_a_channel_whose_broker_was_killed(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    redis_url = redis_server.url
    await flush(redis_url)
    credentials = make_credentials(tmp_path, "news")
    settings = (
        f'bus_lease = {LEASE}\ninsecure_dev_tubes = true\nauthenticate_command = "auth.login"\n'
        f'[channels]\nresume = "on"\n'
        f"[agents.news]\npublic_key = {str(tmp_path / 'news.pem')!r}\n"
        'serves = [".*", "auth.login"]\n'
    )

    def start(name: str) -> contextlib.AbstractAsyncContextManager[BrokerProcess]:
        return broker_process(
            redis_url, tmp_path / name, ack_timeout=30, prefetch=8, settings=settings
        )

    async with start("a") as a, start("b") as b:
        tube = await tube_at(credentials, b.url.replace("/asbp", "/tube"))
        connection, channel_id, secret = await open_resumable(a.url)
        await until_in_directory(redis_url, "ch", channel_id)
        subject = await sign_in(connection, tube, channel_id)
        await kept_holds(redis_url, channel_id, subject.encode())
        holder = await holder_of(redis_url, channel_id)
        await a.kill()
        abandon(connection)
        await until(redis_url, f"alive:{holder}", lambda client: lease_gone(client, holder))
        # A is gone: B takes the Subject over from the record alone.
        resumed, answer = await resume_at(b.url, channel_id, secret, received=2)
        assert (answer.name, answer.get("subjects")) == ("asbp.resumed", (subject,))
        await until_in_directory(redis_url, "grp:room", str(answer.get("b")))
        stranger, _, _ = await open_resumable(b.url)
        await kept_across_the_resume(resumed, tube, stranger, channel_id, subject)
        for each in (resumed, stranger, tube):
            await each.close()


async def test_a_waiting_subject_an_operator_ends_does_not_come_back(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    redis_url = redis_server.url
    await flush(redis_url)
    async with brokers(tmp_path, redis_url, "broker-a", "broker-b") as (credentials, (a, b)):
        tube = await tube_at(credentials, a)
        connection, channel_id, secret = await open_resumable(a.ws_url + "/asbp")
        await until_in_directory(redis_url, "ch", channel_id)
        subject = await sign_in(connection, tube, channel_id)
        await kept_holds(redis_url, channel_id, subject.encode())
        await connection.close()
        await until_in_directory(redis_url, "ch", channel_id, present=False)
        async with httpx.AsyncClient(base_url=a.http_url, timeout=5 * T) as client:
            ended_by_api = await client.delete(f"/api/v1/subjects/{subject}")
        assert ended_by_api.status_code == 200, ended_by_api.text
        ended = await frame(tube)
        assert (ended.name, ended.get("s"), ended.get("cause")) == (
            "asbp.subject.ended",
            subject,
            "ended by an operator",
        )
        # Out of the record too: the Channel resumes at B with its groups, not with
        # the Subject its agent was told had ended.
        await kept_holds(redis_url, channel_id, subject.encode(), present=False)
        resumed, answer = await resume_at(b.ws_url + "/asbp", channel_id, secret, received=2)
        assert (answer.name, answer.get("subjects")) == ("asbp.resumed", None)
        await resumed.send(f"c=whoami,s={subject},u=7;")
        assert read_fault(await frame(resumed)).code == FaultCode.ACCESS_DENIED
        await until_in_directory(redis_url, "grp:room", "broker-b")
        await tube.send(encode(Command({"c": "news", "g": "room", "u": 6}, b"to the room")))
        assert (await frame(resumed)).command_id == 6
        for each in (resumed, tube):
            await each.close()
