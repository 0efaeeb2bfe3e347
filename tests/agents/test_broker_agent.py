"""The Broker-Agent: a real WebSocket server, driven by the SDK's UserAgent and raw clients."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

import asbp
from agents import AgentError, FaultError, Request, UserAgent
from agents.broker_agent import BrokerAgent
from agents.broker_channel import OutboxLimits
from asbp import Command, Limits
from tests.support import T, client_ssl_context, generate_tls_files

pytestmark = pytest.mark.anyio


def build(**options: object) -> BrokerAgent:
    """A Broker-Agent serving ``echo``, ``clock`` (a stream of three), ``boom`` and ``hold``."""
    broker = BrokerAgent("ba-test", **options)  # type: ignore[arg-type]  # the test's options
    broker.released = asyncio.Event()  # type: ignore[attr-defined]  # a test-only handle
    broker.seen = []  # type: ignore[attr-defined]
    broker.entered = asyncio.Event()  # type: ignore[attr-defined]

    @broker.respondent("echo")
    async def echo(request: Request) -> bytes:
        broker.seen.append(request.command)  # type: ignore[attr-defined]
        return request.body

    @broker.respondent("clock")
    async def clock(request: Request) -> None:
        await request.stream(["one", "two", "three"])

    @broker.respondent("boom")
    async def boom(request: Request) -> bytes:
        raise RuntimeError("a secret that must not leak")

    @broker.respondent("hold")
    async def hold(request: Request) -> bytes:
        broker.entered.set()  # type: ignore[attr-defined]
        await broker.released.wait()  # type: ignore[attr-defined]
        return b"released"

    return broker


@contextlib.asynccontextmanager
async def running(**options: object) -> AsyncIterator[BrokerAgent]:
    broker = build(**options)
    async with broker.serving():
        yield broker


@contextlib.asynccontextmanager
async def raw(broker: BrokerAgent, **options: object) -> AsyncIterator[ClientConnection]:
    """A plain WebSocket client, past the greeting."""
    async with connect(broker.url(), **options) as websocket:  # type: ignore[arg-type]
        greeting = asbp.decode((await websocket.recv()).encode())  # type: ignore[union-attr]
        assert greeting.name == "asbp.channel"
        yield websocket


async def recv(websocket: ClientConnection) -> Command:
    async with asyncio.timeout(5 * T):
        message = await websocket.recv()
    return asbp.decode(message.encode() if isinstance(message, str) else message)


def assert_fault(command: Command, code: int, u: int | None, cause: str | None = None) -> None:
    assert command.name == "asbp.fault", command
    assert command.get("code") == str(code), command
    assert command.command_id == u
    assert command.get("cause") == cause


async def test_greeting_echo_and_keys_as_the_broker_sets_them() -> None:
    async with running() as broker, UserAgent.websocket(broker.url()) as ua:
        assert ua.broker_id == "ba-test"
        assert len(ua.channel_id) == 32
        reply = await ua.request("echo", b"hi", timeout=5 * T, a="forged", d="f" * 32)
        assert reply.name == "echo.reply" and reply.body == b"hi"
        assert reply.agent_id == "ba-test" and "d" not in reply
        (seen,) = broker.seen  # type: ignore[attr-defined]
        assert seen.channel_id == ua.channel_id and seen.broker_id == "ba-test"
        assert "a" not in seen and seen.get("d") == "f" * 32  # d from a User-Agent is not routing
        assert broker.channels == 1


async def test_ping_and_commands() -> None:
    async with running() as broker, UserAgent.websocket(broker.url()) as ua:
        pong = await ua.request("asbp.ping", b"body", timeout=5 * T)
        assert pong.name == "asbp.pong" and pong.body == b"body"
        names = await ua.request("asbp.commands", timeout=5 * T)
        assert json.loads(names.body) == [
            "asbp.commands",
            "asbp.ping",
            "boom",
            "clock",
            "echo",
            "hold",
        ]


async def test_streams_keep_t_and_o() -> None:
    async with running() as broker, UserAgent.websocket(broker.url()) as ua:
        parts = [part async for part in ua.stream("clock", timeout=5 * T)]
        assert [p.body for p in parts] == [b"one", b"two", b"three"]
        assert parts[0].total == 3 and [p.of_total for p in parts] == [1, 2, 3]


@pytest.mark.parametrize(
    ("frame", "code", "u", "cause"),
    [
        (b"c=nobody,u=1;", 2101, 1, "nobody"),
        (b"c=asbp.register,u=2;", 2101, 2, "asbp.register"),
        (b"c=asbp.publish,u=3;", 2101, 3, "asbp.publish"),
        (b"c=asbp.logout,u=4;", 2101, 4, "asbp.logout"),
        (b"u=5;", 1201, 5, None),
        (b"c=echo,u=6,s=0123456789abcdef0123456789abcdef;", 3201, 6, "echo"),
        (b"u=7,c=x'y;", 1201, 7, None),  # refused by the codec: u sniffed
        (b"+u=8,c=x\xff;", 1201, 8, None),
        (b"c=echo,u=9,u=9;", 1201, 9, None),
        (b"c=boom,u=10;", 2107, 10, "boom"),
    ],
)
async def test_bad_input_gets_the_brokers_faults_and_the_channel_stays_open(
    frame: bytes, code: int, u: int, cause: str | None
) -> None:
    async with running() as broker, raw(broker) as websocket:
        await websocket.send(frame)
        fault = await recv(websocket)
        assert_fault(fault, code, u, cause)
        assert b"secret" not in fault.body
        await websocket.send(b"c=echo,u=99;still here")
        assert (await recv(websocket)).body == b"still here"


async def test_frame_size_limit() -> None:
    async with running(limits=Limits(max_frame_bytes=1024)) as broker, raw(broker) as websocket:
        await websocket.send(b"c=echo,u=3;" + b"x" * 2000)
        assert_fault(await recv(websocket), 1101, 3)
        await websocket.send(b"c=echo,u=4;" + b"x" * 5000)  # over 4x: the server closes
        with pytest.raises(ConnectionClosed) as closed:
            await recv(websocket)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


async def test_text_and_binary_mirror_the_user_agent() -> None:
    async with running() as broker, raw(broker) as websocket:
        await websocket.send("c=echo,u=1;text")
        assert isinstance(await websocket.recv(), str)
        await websocket.send(b"c=echo,u=2;bytes")
        assert isinstance(await websocket.recv(), bytes)


async def test_in_flight_limit_and_timeout_and_late_answer() -> None:
    options = {"max_in_flight": 2, "respondent_timeout": 0.3 * T}
    async with running(**options) as broker, raw(broker) as websocket:
        await websocket.send(b"c=hold,u=1;")
        await websocket.send(b"c=hold,u=2;")
        await websocket.send(b"c=hold,u=3;")
        assert_fault(await recv(websocket), 2106, 3, "hold")
        timeouts = [await recv(websocket), await recv(websocket)]
        for fault in timeouts:
            assert fault.get("code") == "2103" and fault.get("cause") == "hold"
        assert sorted(f.command_id or 0 for f in timeouts) == [1, 2]
        broker.released.set()  # type: ignore[attr-defined]
        late = [await recv(websocket), await recv(websocket)]  # still delivered, as the broker does
        assert {c.body for c in late} == {b"released"}


async def test_a_reused_u_replaces_the_older_in_flight_entry() -> None:
    async with running(max_in_flight=1) as broker, raw(broker) as websocket:
        await websocket.send(b"c=hold,u=1;")
        await websocket.send(b"c=hold,u=1;")  # not refused: replaces
        broker.released.set()  # type: ignore[attr-defined]
        assert (await recv(websocket)).body == b"released"
        assert (await recv(websocket)).body == b"released"


async def test_too_many_channels() -> None:
    async with running(max_channels=1) as broker, raw(broker), connect(broker.url()) as second:
        assert_fault(await recv(second), 2108, None)
        with pytest.raises(ConnectionClosed) as closed:
            await recv(second)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


async def test_origins_are_refused_unless_allowed() -> None:
    async with running(allowed_origins=["https://shop.example/"]) as broker:
        with pytest.raises(InvalidStatus) as refused:
            async with connect(broker.url(), origin="https://evil.example"):  # type: ignore[arg-type]
                pass
        assert refused.value.response.status_code == 403
        async with raw(broker, origin="https://shop.example") as websocket:
            await websocket.send(b"c=echo,u=1;ok")
            assert (await recv(websocket)).body == b"ok"


async def test_only_the_asbp_path() -> None:
    async with running() as broker:
        with pytest.raises(InvalidStatus) as refused:
            async with connect(broker.url().replace("/asbp", "/tube")):
                pass
        assert refused.value.response.status_code == 404
        assert_fault(asbp.decode(refused.value.response.body), 2101, None)


async def test_push_with_d_and_an_unknown_channel() -> None:
    async with running() as broker, UserAgent.websocket(broker.url()) as ua:
        broker.send(Command(c="news", d=ua.channel_id))
        pushed = await ua.receive(timeout=5 * T)
        assert pushed.name == "news" and pushed.agent_id == "ba-test" and "d" not in pushed
        with pytest.raises(FaultError) as unknown:
            broker.send(Command(c="news", d=[ua.channel_id, "0" * 32]))
        assert unknown.value.code == 2104
        assert (await ua.receive(timeout=5 * T)).name == "news"  # the known one still got it
        with pytest.raises(ValueError, match="'d'"):
            broker.send(Command(c="news"))


async def test_no_groups_and_no_subjects_fail_the_handler_not_the_broker() -> None:
    broker = BrokerAgent()
    assert broker.broker_id.startswith("ba-")

    @broker.respondent("join")
    async def join(request: Request) -> str:
        try:
            await request.join("room")
        except FaultError as exc:
            return f"{exc.code}"
        return "joined"

    @broker.respondent("login")
    async def login(request: Request) -> None:
        await request.send_to_broker(Command(c="asbp.authenticated", s="0" * 32))

    async with broker.serving(), UserAgent.websocket(broker.url()) as ua:
        assert (await ua.request("join", timeout=5 * T)).body == b"2101"
        with pytest.raises(FaultError) as failed:
            await ua.request("login", timeout=5 * T)
        assert failed.value.code == 2107


async def test_close_faults_what_is_in_flight_and_closes_channels() -> None:
    broker = build()
    await broker.start()
    async with raw(broker) as websocket:
        await websocket.send(b"c=hold,u=5;")
        async with asyncio.timeout(5 * T):
            await broker.entered.wait()  # type: ignore[attr-defined]
        await broker.close(timeout=0.2 * T)
        assert_fault(await recv(websocket), 2102, 5, "hold")
        with pytest.raises(ConnectionClosed) as closed:
            await recv(websocket)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
    await broker.closed()
    await broker.close()  # twice is fine


async def test_slow_consumer_is_closed() -> None:
    # Five pushes queued in one loop turn, before the writer runs: the fifth
    # overflows a four-Command outbox, as a reader that stopped reading would.
    outbox = OutboxLimits(max_commands=4)
    async with running(outbox=outbox) as broker, raw(broker) as websocket:
        (channel,) = broker._channels.values()
        for _ in range(5):
            broker.send(Command(c="news", d=channel.id))
        assert not channel.open
        broker.send(Command(c="news", d=channel.id))  # dropped: the Channel is closing
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                await recv(websocket)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
        assert closed.value.rcvd.reason == "2105 Slow consumer"


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="positive"):
        BrokerAgent(max_in_flight=0)
    with pytest.raises(ValueError, match="cannot be sent"):
        BrokerAgent("it's")


async def test_tls_and_the_life_cycle(tmp_path: Path) -> None:
    tls = generate_tls_files(tmp_path)
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(tls.cert, tls.key)
    broker = build(ssl=server_context)
    with pytest.raises(AgentError, match="not serving"):
        _ = broker.port
    async with broker:
        with pytest.raises(AgentError, match="already"):
            await broker.start()
        url = broker.url("localhost")
        assert url.startswith("wss://localhost:")
        context = client_ssl_context(tls)
        async with UserAgent.websocket(url, ssl=context) as ua:
            assert (await ua.request("echo", b"sealed", timeout=5 * T)).body == b"sealed"
            await broker.remove_respondent("echo")
            assert "echo" not in broker.respondent_names
            with pytest.raises(FaultError) as gone:
                await ua.request("echo", timeout=5 * T)
            assert gone.value.code == 2101
        assert "channels=" in repr(broker)
    with pytest.raises(KeyError):
        await broker.remove_respondent("echo")


async def test_past_max_pending_the_sender_is_no_longer_read() -> None:
    # One handler at a time, two pending at most: the third Command without u
    # stays unread (TCP holds its sender back) until a handler finishes.
    async with (
        running(max_concurrency=1, max_pending=2) as broker,
        raw(broker) as sender,
        raw(broker) as other,
    ):
        for _ in range(3):
            await sender.send(b"c=hold;")
        async with asyncio.timeout(5 * T):
            await broker.entered.wait()  # type: ignore[attr-defined]
        await other.send(b"c=asbp.ping,u=1;")  # another Channel is still served
        assert (await recv(other)).name == "asbp.pong"
        assert broker._dispatcher.in_flight == 2
        broker.released.set()  # type: ignore[attr-defined]
        await sender.send(b"c=echo,u=2;read again")
        bodies = []
        while not bodies or bodies[-1] != b"read again":
            bodies.append((await recv(sender)).body)
        # The handlers answer even a Command without u (to its Channel, without u).
        assert bodies.count(b"released") == len(bodies) - 1
