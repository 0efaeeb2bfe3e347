"""The User-Agent client, over WebSocket and over HTTP long-polling, against one agent.

Every end-to-end test runs once per transport: the API is the same, and so
must be the behaviour. The multipart reader and the ``u`` allocator are
pure and tested with vectors.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from agents import (
    ApplicationAgent,
    ConnectionLost,
    FaultError,
    NotConnected,
    Request,
    UserAgent,
)
from agents.control import MAX_COMMAND_ID, CommandIds
from agents.multipart import MultipartError, boundary_of, parse_parts
from asbp import Command, FaultCode
from tests.support import RunningServer, T
from tests.support.agents import (
    install_echo,
    make_agent,
    make_credentials,
    running_broker,
    tube_url,
)

Transport = Literal["websocket", "http"]
TRANSPORTS: tuple[Transport, ...] = ("websocket", "http")


@dataclass
class Service:
    """A broker and one agent with a few Respondents the tests drive."""

    server: RunningServer
    agent: ApplicationAgent
    entered: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    answered: asyncio.Event = field(default_factory=asyncio.Event)
    fired: list[bytes] = field(default_factory=list)
    fired_event: asyncio.Event = field(default_factory=asyncio.Event)

    def user_agent(self, transport: Transport) -> UserAgent:
        if transport == "websocket":
            return UserAgent.websocket(self.server.ws_url + "/asbp")
        return UserAgent.http(self.server.http_url + "/asbp", poll_wait=5 * T)


@contextlib.asynccontextmanager
async def service(tmp_path: Path) -> AsyncIterator[Service]:
    credentials = make_credentials(tmp_path)
    async with running_broker(tmp_path) as server:
        agent = make_agent(credentials, [tube_url(server)])
        svc = Service(server, agent)
        install_echo(agent)

        @agent.respondent("ticks")
        async def ticks(request: Request) -> None:
            await request.stream([f"tick {n}" for n in range(1, 6)])

        @agent.respondent("hang")
        async def hang(request: Request) -> bytes:
            svc.entered.set()
            await svc.release.wait()
            svc.answered.set()
            return b"too late"

        @agent.respondent("lobby.enter")
        async def enter(request: Request) -> None:
            await request.join("lobby")

        @agent.respondent("fire")
        async def fire(request: Request) -> None:
            svc.fired.append(request.body)
            svc.fired_event.set()

        @agent.respondent("boom")
        async def boom(request: Request) -> None:
            raise ValueError("broken")

        async with agent:
            await agent.wait_registered(5 * T)
            try:
                yield svc
            finally:
                svc.release.set()


pytestmark = pytest.mark.anyio


# -- end to end, once per transport ---------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_request_reply_builtins_and_faults(tmp_path: Path, transport: Transport) -> None:
    async with service(tmp_path) as svc, svc.user_agent(transport) as ua:
        assert len(ua.channel_id) == 32
        assert ua.broker_id == "broker-a"
        reply = await ua.request("echo", b"over " + transport.encode(), timeout=5 * T)
        assert (reply.name, reply.agent_id) == ("echo.reply", "echo")
        assert reply.body == b"over " + transport.encode()

        pong = await ua.request("asbp.ping", b"are you there", timeout=5 * T)
        assert (pong.name, pong.body) == ("asbp.pong", b"are you there")
        names = json.loads((await ua.request("asbp.commands", timeout=5 * T)).body)
        assert {"echo", "ticks", "hang", "boom"} <= set(names)

        with pytest.raises(FaultError) as caught:
            await ua.request("boom", timeout=5 * T)
        assert caught.value.code == FaultCode.RESPONDENT_FAILED
        with pytest.raises(FaultError) as caught:
            await ua.request("no.such.command", timeout=5 * T)
        assert caught.value.code == FaultCode.NO_RESPONDENT
        assert caught.value.cause == "no.such.command"
        with pytest.raises(FaultError) as caught:
            await ua.request("echo", s="0" * 32, timeout=5 * T)
        assert caught.value.code == FaultCode.ACCESS_DENIED
        with pytest.raises(TypeError):
            await ua.request("echo", u=7)

        # Still fine after all those faults.
        assert (await ua.request("echo", "ok", timeout=5 * T)).body == b"ok"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_stream_is_yielded_in_o_order(tmp_path: Path, transport: Transport) -> None:
    async with service(tmp_path) as svc, svc.user_agent(transport) as ua:
        parts = [part async for part in ua.stream("ticks", timeout=5 * T)]
        assert [p.body for p in parts] == [f"tick {n}".encode() for n in range(1, 6)]
        assert [p.of_total for p in parts] == [1, 2, 3, 4, 5]
        assert parts[0].total == 5

        # Two streams at once keep their parts apart by u.
        first, second = await asyncio.gather(
            _collect(ua.stream("ticks", timeout=5 * T)), _collect(ua.stream("ticks", timeout=5 * T))
        )
        assert len(first) == len(second) == 5
        assert first[0].command_id != second[0].command_id

        # Stopping early releases the stream's u.
        async with contextlib.aclosing(ua.stream("ticks", timeout=5 * T)) as stream:
            async for _ in stream:
                break


async def _collect(stream: AsyncIterator[Command]) -> list[Command]:
    return [part async for part in stream]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_unsolicited_commands_come_through_async_for(
    tmp_path: Path, transport: Transport
) -> None:
    async with service(tmp_path) as svc, svc.user_agent(transport) as ua:
        await ua.request("lobby.enter", timeout=5 * T)
        for n in range(3):
            await svc.agent.send(Command({"c": "lobby.news", "g": "lobby"}, b"%d" % n))
        received = []
        async with asyncio.timeout(5 * T):
            async for command in ua:
                received.append(command)
                if len(received) == 3:
                    break
        assert [(c.name, c.body, c.agent_id) for c in received] == [
            ("lobby.news", b"0", "echo"),
            ("lobby.news", b"1", "echo"),
            ("lobby.news", b"2", "echo"),
        ]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_send_is_fire_and_forget(tmp_path: Path, transport: Transport) -> None:
    async with service(tmp_path) as svc, svc.user_agent(transport) as ua:
        await ua.send(Command({"c": "fire"}, b"and forget"))
        async with asyncio.timeout(5 * T):
            await svc.fired_event.wait()
        assert svc.fired == [b"and forget"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_timed_out_request_drops_its_late_answer(
    tmp_path: Path, transport: Transport
) -> None:
    async with service(tmp_path) as svc, svc.user_agent(transport) as ua:
        with pytest.raises(TimeoutError):
            await ua.request("hang", timeout=0.2 * T)
        assert svc.entered.is_set()
        svc.release.set()
        async with asyncio.timeout(5 * T):
            await svc.answered.wait()
        # The late answer was sent before this echo; it arrives first and is dropped.
        assert (await ua.request("echo", b"next", timeout=5 * T)).body == b"next"
        with pytest.raises(TimeoutError):
            await ua.receive(timeout=0)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_closing_ends_iteration_and_refuses_sends(
    tmp_path: Path, transport: Transport
) -> None:
    async with service(tmp_path) as svc:
        ua = svc.user_agent(transport)
        with pytest.raises(NotConnected):
            _ = ua.channel_id
        with pytest.raises(NotConnected):
            await ua.request("echo")
        await ua.connect()
        waiting = asyncio.create_task(ua.request("hang", timeout=5 * T))
        async with asyncio.timeout(5 * T):
            await svc.entered.wait()
        await ua.close()
        assert ua.closed
        with pytest.raises(ConnectionLost):
            await waiting
        assert [c async for c in ua] == []
        with pytest.raises(ConnectionLost):
            await ua.request("echo")
        with pytest.raises(ConnectionLost):
            await ua.send(Command(c="echo"))


async def test_the_broker_closing_the_channel_fails_pending_requests(tmp_path: Path) -> None:
    async with service(tmp_path) as svc, svc.user_agent("websocket") as ua:
        waiting = asyncio.create_task(ua.request("hang", timeout=5 * T))
        async with asyncio.timeout(5 * T):
            await svc.entered.wait()
        # The agent leaving faults the in-flight request (2102): never silence.
        await svc.agent.close(timeout=0.1 * T)
        with pytest.raises(FaultError) as caught:
            await waiting
        assert caught.value.code == FaultCode.RESPONDENT_LEFT


# -- Command-Identifiers ----------------------------------------------------------


def test_command_ids_wrap_and_skip_those_in_use() -> None:
    ids = CommandIds()
    assert [ids.allocate(set()) for _ in range(3)] == [0, 1, 2]
    in_use = {3, 4}
    assert ids.allocate(in_use) == 5
    ids = CommandIds()
    for _ in range(MAX_COMMAND_ID):
        ids.allocate(set())
    assert ids.allocate(set()) == MAX_COMMAND_ID
    assert ids.allocate({0}) == 1  # wrapped, skipping 0


def test_command_ids_run_out() -> None:
    with pytest.raises(RuntimeError):
        CommandIds().allocate(range(MAX_COMMAND_ID + 1))


# -- the long-poll multipart reader ---------------------------------------------------


def _part(frame: bytes, seq: int, boundary: bytes = b"b0und") -> bytes:
    return (
        b"--%s\r\nContent-Type: application/asbp\r\nContent-Length: %d\r\nASBP-Seq: %d\r\n\r\n"
        b"%s\r\n" % (boundary, len(frame), seq, frame)
    )


def test_parse_parts_reads_the_documented_example() -> None:
    body = (
        b"--8f1c\r\nContent-Type: application/asbp\r\nContent-Length: 18\r\nASBP-Seq: 7\r\n\r\n"
        b"c=asbp.pong,u=1;hi\r\n"
        b"--8f1c\r\nContent-Type: application/asbp\r\nContent-Length: 27\r\nASBP-Seq: 8\r\n\r\n"
        b"c=chat.reply,u=2,a=chat;ok!\r\n"
        b"--8f1c--\r\n"
    )
    assert parse_parts(body, "8f1c") == [
        (7, b"c=asbp.pong,u=1;hi"),
        (8, b"c=chat.reply,u=2,a=chat;ok!"),
    ]


def test_parse_parts_takes_content_by_length_not_by_boundary() -> None:
    tricky = b"c=x;\r\n--b0und--\r\n\r\n\x00\xff"
    body = _part(tricky, 1) + _part(b"", 2) + b"--b0und--"
    assert parse_parts(body, "b0und") == [(1, tricky), (2, b"")]


def test_parse_parts_matches_the_brokers_writer() -> None:
    from gateway.transports.http import _multipart  # the writer this reader mirrors

    frames = [(1, b"c=a;"), (2, b"c=b;\r\n--x"), (40, b"")]
    body, boundary = _multipart(frames)
    assert parse_parts(body, boundary) == frames


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"preamble\r\n" + _part(b"c=a;", 1) + b"--b0und--", "boundary at byte 0"),
        (_part(b"c=a;", 1), "boundary at byte"),
        (_part(b"c=a;", 1) + b"--b0und--\r\nepilogue", "after the closing"),
        (b"--b0undX\r\n", "CRLF after the boundary"),
        (
            b"--b0und\r\nContent-Type: application/asbp\r\nASBP-Seq: 1\r\n\r\nc=a;\r\n--b0und--",
            "content-length",
        ),
        (
            b"--b0und\r\nContent-Type: application/asbp\r\nContent-Length: 4\r\n\r\nc=a;\r\n"
            b"--b0und--",
            "asbp-seq",
        ),
        (
            b"--b0und\r\nContent-Type: text/plain\r\nContent-Length: 4\r\nASBP-Seq: 1\r\n\r\n"
            b"c=a;\r\n--b0und--",
            "not application/asbp",
        ),
        (
            b"--b0und\r\nContent-Type: application/asbp\r\nContent-Length: -4\r\nASBP-Seq: 1\r\n"
            b"\r\nc=a;\r\n--b0und--",
            "content-length",
        ),
        (
            b"--b0und\r\nContent-Type: application/asbp\r\nContent-Length: 99\r\nASBP-Seq: 1\r\n"
            b"\r\nc=a;\r\n--b0und--",
            "shorter than its Content-Length",
        ),
        (
            b"--b0und\r\nContent-Type: application/asbp\r\nContent-Length: 2\r\nASBP-Seq: 1\r\n"
            b"\r\nc=a;\r\n--b0und--",
            "CRLF after a part's content",
        ),
        (
            b"--b0und\r\nContent-Type: application/asbp\r\nContent-Type: application/asbp\r\n"
            b"Content-Length: 4\r\nASBP-Seq: 1\r\n\r\nc=a;\r\n--b0und--",
            "bad part header",
        ),
        (b"--b0und\r\nno colon here\r\n\r\n", "bad part header"),
        (b"--b0und\r\n" + b"X-Long: " + b"a" * 2000 + b"\r\n\r\n", "unterminated or long"),
        (b"--b0und\r\n\r\n\r\n--b0und--", "content-length"),
    ],
)
def test_parse_parts_refuses(body: bytes, match: str) -> None:
    with pytest.raises(MultipartError, match=match):
        parse_parts(body, "b0und")


def test_parse_parts_bounds_the_number_of_parts() -> None:
    body = b"".join(_part(b"c=a;", n) for n in range(1, 4)) + b"--b0und--"
    assert len(parse_parts(body, "b0und", max_parts=3)) == 3
    with pytest.raises(MultipartError, match="more than 2 parts"):
        parse_parts(body, "b0und", max_parts=2)


@pytest.mark.parametrize(
    ("content_type", "boundary"),
    [
        ('multipart/mixed; boundary="abc123"', "abc123"),
        ("multipart/mixed;boundary=abc123", "abc123"),
        ('Multipart/Mixed; boundary="a-b_c.d"; charset=x', "a-b_c.d"),
    ],
)
def test_boundary_of(content_type: str, boundary: str) -> None:
    assert boundary_of(content_type) == boundary


@pytest.mark.parametrize(
    "content_type",
    ["application/asbp", "multipart/mixed", 'multipart/mixed; boundary=""', "multipart/mixed; b=x"],
)
def test_boundary_of_refuses(content_type: str) -> None:
    with pytest.raises(MultipartError):
        boundary_of(content_type)
