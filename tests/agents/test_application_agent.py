"""The Application-Agent SDK against real brokers.

Every test runs real brokers (Hypercorn on loopback, via ``serve_app_async``)
and real WebSocket and HTTP clients. Nothing sleeps to synchronise: tests
wait on events (the agent's ``wait_registered``, a handler's own event, a
log record arriving) with deadlines in units of ``T``. Connections are cut
with :class:`TcpProxy`, a small forwarding proxy the test controls, rather
than by timing.

The helpers shared with test_user_agent.py, test_examples.py and
tests/agents/spark/ are in :mod:`tests.support.agents`.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agents import (
    HANDLER_FAILED,
    AgentCredentialSource,
    AgentError,
    AgentState,
    ApplicationAgent,
    Backoff,
    FaultError,
    NotConnected,
    Request,
    UserAgent,
    generate_agent_key,
)
from agents import control as agent_control
from asbp import Command, FaultCode
from tests.support import ServerName, T
from tests.support.agents import (
    AUDIENCE,
    TcpProxy,
    install_echo,
    make_agent,
    make_credentials,
    running_broker,
    tube_url,
)

pytestmark = pytest.mark.anyio


# -- helpers ------------------------------------------------------------------


def state_of(agent: ApplicationAgent) -> AgentState:
    """``agent.state``, read afresh (a plain read is narrowed by earlier asserts)."""
    return agent.state


async def served_names(ua: UserAgent) -> list[str]:
    reply = await ua.request("asbp.commands", timeout=5 * T)
    names: list[str] = json.loads(reply.body)
    return names


class LogWatcher(logging.Handler):
    """Collects one logger's records and lets a test await a matching one.

    Attach it only to loggers used on the test's own event loop (the agent's):
    ``emit`` wakes an asyncio.Event, which is not thread-safe.
    """

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._changed = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self._changed.set()
        self._changed = asyncio.Event()

    def count(self, predicate: Callable[[logging.LogRecord], bool]) -> int:
        return sum(1 for record in self.records if predicate(record))

    async def wait_for(
        self, predicate: Callable[[logging.LogRecord], bool], count: int = 1
    ) -> None:
        async with asyncio.timeout(10 * T):
            while self.count(predicate) < count:
                changed = self._changed
                await changed.wait()


@pytest.fixture
def agent_log() -> Iterator[tuple[logging.Logger, LogWatcher]]:
    logger = logging.getLogger(f"asbp.agent.test.{uuid.uuid4().hex}")
    logger.setLevel(logging.DEBUG)
    watcher = LogWatcher()
    logger.addHandler(watcher)
    try:
        yield logger, watcher
    finally:
        logger.removeHandler(watcher)


# -- the SDK's view of the broker ----------------------------------------------


@pytest.mark.parametrize(
    "module",
    [
        "agents",
        "agents.addressing",
        "agents.agent",
        "agents.backoff",
        "agents.channel",
        "agents.control",
        "agents.dispatch",
        "agents.errors",
        "agents.multipart",
        "agents.respondent",
        "agents.tube",
        "agents.user_agent",
    ],
)
def test_every_module_exports_what_it_lists(module: str) -> None:
    imported = importlib.import_module(module)
    for name in imported.__all__:
        assert hasattr(imported, name), f"{module}.{name}"


def test_agent_arguments_are_checked(tmp_path: Path) -> None:
    credentials = make_credentials(tmp_path)
    with pytest.raises(ValueError, match="urls"):
        ApplicationAgent("echo", credentials, [])
    with pytest.raises(ValueError, match="urls"):
        ApplicationAgent("echo", credentials, "ws://127.0.0.1:1/tube")
    with pytest.raises(ValueError, match="identity"):
        ApplicationAgent("other", credentials, ["ws://127.0.0.1:1/tube"])
    with pytest.raises(ValueError, match="max_concurrency"):
        ApplicationAgent("echo", credentials, ["ws://127.0.0.1:1/tube"], max_concurrency=0)


def test_reserved_and_duplicate_names_are_refused(tmp_path: Path) -> None:
    agent = make_agent(make_credentials(tmp_path), ["ws://127.0.0.1:1/tube"])
    install_echo(agent)
    with pytest.raises(ValueError, match="already served"):
        install_echo(agent)

    async def handler(request: Request) -> None:
        return None

    with pytest.raises(ValueError, match="broker"):
        agent.add_respondent("asbp.ping", handler)
    with pytest.raises(ValueError, match="cannot be a Command-Name"):
        agent.add_respondent("it's", handler)
    assert agent.respondent_names == {"echo"}


# -- Respondents --------------------------------------------------------------


async def test_decorator_and_runtime_respondents_show_in_asbp_commands(tmp_path: Path) -> None:
    credentials = make_credentials(tmp_path)
    async with running_broker(tmp_path) as server:
        agent = make_agent(credentials, [tube_url(server)])
        install_echo(agent)
        async with agent, UserAgent.websocket(server.ws_url + "/asbp") as ua:
            await agent.wait_registered(5 * T)
            assert "echo" in await served_names(ua)

            async def shout(request: Request) -> str:
                return request.body.decode().upper()

            agent.add_respondent("shout", shout)
            await agent.wait_registered(5 * T)
            assert {"echo", "shout"} <= set(await served_names(ua))
            reply = await ua.request("shout", "hi", timeout=5 * T)
            assert (reply.name, reply.body, reply.encoding) == ("shout.reply", b"HI", "UTF-8")

            await agent.remove_respondent("echo")
            assert "echo" not in await served_names(ua)
            assert agent.respondent_names == {"shout"}
            with pytest.raises(FaultError) as caught:
                await ua.request("echo", b"x", timeout=5 * T)
            assert caught.value.code == FaultCode.NO_RESPONDENT
            assert caught.value.fault is FaultCode.NO_RESPONDENT
            with pytest.raises(KeyError):
                await agent.remove_respondent("echo")
            assert (await ua.request("shout", "still", timeout=5 * T)).body == b"STILL"


async def test_reply_shapes_and_helpers(tmp_path: Path) -> None:
    credentials = make_credentials(tmp_path)
    async with running_broker(tmp_path) as server:
        agent = make_agent(credentials, [tube_url(server)])
        seen: list[Request] = []

        @agent.respondent("shape.bytes")
        async def as_bytes(request: Request) -> bytes:
            seen.append(request)
            return b"\x00\xff"

        @agent.respondent("shape.command")
        async def as_command(request: Request) -> Command:
            return Command({"c": "custom", "m": "text/plain"}, b"typed")

        @agent.respondent("shape.unnamed")
        async def unnamed(request: Request) -> Command:
            return Command({"m": "text/plain"}, b"named for me")

        @agent.respondent("shape.none")
        async def nothing(request: Request) -> None:
            return None

        @agent.respondent("shape.reply")
        async def explicit(request: Request) -> None:
            await request.reply("done", m="text/plain")

        @agent.respondent("shape.fault")
        async def refuse(request: Request) -> None:
            await request.fault(FaultCode.ACCESS_DENIED, "not you")

        async with agent, UserAgent.websocket(server.ws_url + "/asbp") as ua:
            await agent.wait_registered(5 * T)

            reply = await ua.request("shape.bytes", b"in", timeout=5 * T, m="text/plain")
            assert reply.header == {"c": "shape.bytes.reply", "u": reply.get("u"), "a": "echo"}
            assert reply.body == b"\x00\xff"
            request = seen[0]
            assert request.name == "shape.bytes"
            assert request.body == b"in"
            assert request.channel_id == ua.channel_id
            assert request.command_id == reply.command_id
            assert request.agent_id is None
            assert request.broker_id == "broker-a"
            assert request.command.mime_type == "text/plain"
            assert request.answered

            reply = await ua.request("shape.command", timeout=5 * T)
            assert (reply.name, reply.mime_type, reply.body) == ("custom", "text/plain", b"typed")
            reply = await ua.request("shape.unnamed", timeout=5 * T)
            assert (reply.name, reply.body) == ("shape.unnamed.reply", b"named for me")
            reply = await ua.request("shape.none", timeout=5 * T)
            assert (reply.name, reply.body) == ("shape.none.reply", b"")
            reply = await ua.request("shape.reply", timeout=5 * T)
            assert (reply.name, reply.body, reply.encoding) == (
                "shape.reply.reply",
                b"done",
                "UTF-8",
            )
            with pytest.raises(FaultError) as caught:
                await ua.request("shape.fault", timeout=5 * T)
            assert caught.value.code == FaultCode.ACCESS_DENIED
            assert (caught.value.message, caught.value.cause) == ("not you", "shape.fault")


async def test_stream_parts_carry_t_and_o_and_arrive_in_order(tmp_path: Path) -> None:
    credentials = make_credentials(tmp_path)
    async with running_broker(tmp_path) as server:
        agent = make_agent(credentials, [tube_url(server)])

        @agent.respondent("count")
        async def count(request: Request) -> None:
            await request.stream([b"one", "two", Command({"c": "three", "m": "text/plain"}, b"3")])

        @agent.respondent("lazy")
        async def lazy(request: Request) -> None:
            async def parts() -> AsyncIterator[bytes]:
                for n in range(4):
                    yield str(n).encode()

            await request.stream(parts(), total=4)

        @agent.respondent("shuffled")
        async def shuffled(request: Request) -> None:
            # Out of order on purpose; the User-Agent puts them back by o.
            await request.send(request.as_reply(b"second").with_keys(o=2))
            await request.send(request.as_reply(b"third").with_keys(o=3))
            await request.send(request.as_reply(b"first").with_keys(o=1, t=3))

        @agent.respondent("short")
        async def short(request: Request) -> None:
            await request.stream([b"only"], total=2)

        async with agent, UserAgent.websocket(server.ws_url + "/asbp") as ua:
            await agent.wait_registered(5 * T)

            parts = [part async for part in ua.stream("count", timeout=5 * T)]
            assert [p.body for p in parts] == [b"one", b"two", b"3"]
            assert [(p.total, p.of_total) for p in parts] == [(3, 1), (None, 2), (None, 3)]
            assert [p.name for p in parts] == ["count.reply", "count.reply", "three"]
            assert parts[1].encoding == "UTF-8"
            assert len({p.command_id for p in parts}) == 1

            parts = [part async for part in ua.stream("lazy", timeout=5 * T)]
            assert [p.body for p in parts] == [b"0", b"1", b"2", b"3"]

            parts = [part async for part in ua.stream("shuffled", timeout=5 * T)]
            assert [p.body for p in parts] == [b"first", b"second", b"third"]

            # A plain reply is a stream of one.
            install_echo(agent)
            await agent.wait_registered(5 * T)
            parts = [part async for part in ua.stream("echo", b"solo", timeout=5 * T)]
            assert [p.body for p in parts] == [b"solo"]

            # A stream that ends early is the handler's error: logged, and the
            # User-Agent gets a fault instead of the missing part.
            stream = ua.stream("short", timeout=5 * T)
            assert (await anext(stream)).body == b"only"
            with pytest.raises(FaultError) as caught:
                await anext(stream)
            assert caught.value.code == HANDLER_FAILED
            await stream.aclose()


async def test_handler_exception_becomes_a_fault_and_the_agent_keeps_serving(
    tmp_path: Path, agent_log: tuple[logging.Logger, LogWatcher]
) -> None:
    logger, watcher = agent_log
    credentials = make_credentials(tmp_path)
    async with running_broker(tmp_path) as server:
        agent = make_agent(credentials, [tube_url(server)], logger=logger)
        install_echo(agent)

        @agent.respondent("boom")
        async def boom(request: Request) -> bytes:
            raise RuntimeError("secret internals")

        @agent.respondent("bad.return")
        async def bad_return(request: Request) -> Any:
            return 42  # not a Reply

        async with agent, UserAgent.websocket(server.ws_url + "/asbp") as ua:
            await agent.wait_registered(5 * T)
            for name in ("boom", "bad.return"):
                with pytest.raises(FaultError) as caught:
                    await ua.request(name, timeout=5 * T)
                assert caught.value.code == HANDLER_FAILED == FaultCode.RESPONDENT_FAILED
                assert caught.value.cause == name
                assert "secret" not in caught.value.message
            assert (await ua.request("echo", b"alive", timeout=5 * T)).body == b"alive"
            failures = [r for r in watcher.records if r.levelno == logging.ERROR and r.exc_info]
            assert len(failures) == 2
            exc_info = failures[0].exc_info
            assert exc_info is not None and isinstance(exc_info[1], RuntimeError)


async def test_groups_join_send_and_leave(tmp_path: Path) -> None:
    credentials = make_credentials(tmp_path)
    async with running_broker(tmp_path) as server:
        agent = make_agent(credentials, [tube_url(server)])

        @agent.respondent("room.enter")
        async def enter(request: Request) -> bytes:
            await request.join("lobby")
            return b"welcome"

        async with (
            agent,
            UserAgent.websocket(server.ws_url + "/asbp") as first,
            UserAgent.http(server.http_url + "/asbp", poll_wait=5 * T) as second,
        ):
            await agent.wait_registered(5 * T)
            assert (await first.request("room.enter", timeout=5 * T)).body == b"welcome"
            assert await agent.join(["lobby"], [second.channel_id]) == {"broker-a"}

            await agent.send(Command({"c": "news", "g": "lobby"}, b"to all"))
            for ua in (first, second):
                news = await ua.receive(timeout=5 * T)
                assert (news.name, news.body, news.agent_id) == ("news", b"to all", "echo")

            await agent.send(Command({"c": "direct", "d": [second.channel_id]}, b"just you"))
            direct = await second.receive(timeout=5 * T)
            assert (direct.name, direct.body) == ("direct", b"just you")

            assert await agent.leave(["lobby"], [first.channel_id]) == {"broker-a"}
            await agent.send(Command({"c": "news", "g": "lobby"}, b"second only"))
            await agent.send(Command({"c": "marker", "d": [first.channel_id]}))
            # One broker, one Tube: first sees the marker and nothing before it.
            assert (await first.receive(timeout=5 * T)).name == "marker"
            assert (await second.receive(timeout=5 * T)).body == b"second only"

            with pytest.raises(FaultError) as caught:
                await agent.join(["lobby"], [uuid.uuid4().hex])
            assert caught.value.code == FaultCode.UNKNOWN_CHANNEL
            with pytest.raises(ValueError, match="'d' or 'g'"):
                await agent.send(Command(c="nowhere"))
            with pytest.raises(NotConnected):
                await agent.send(Command({"c": "x", "g": "lobby"}), broker="no-such-broker")


async def test_agent_to_agent_request(tmp_path: Path) -> None:
    echo_credentials = make_credentials(tmp_path, "echo")
    caller_credentials = make_credentials(tmp_path, "caller")
    async with running_broker(tmp_path, identities=("echo", "caller")) as server:
        echo = make_agent(echo_credentials, [tube_url(server)])
        caller = make_agent(caller_credentials, [tube_url(server)])
        asked_by: list[str | None] = []

        @echo.respondent("echo")
        async def answer(request: Request) -> bytes:
            asked_by.append(request.agent_id)
            assert request.channel_id is None
            return request.body

        @echo.respondent("boom")
        async def boom(request: Request) -> None:
            raise RuntimeError("no")

        @echo.respondent("quiet")
        async def quiet(request: Request) -> None:
            return None

        async with echo, caller:
            await echo.wait_registered(5 * T)
            await caller.wait_registered(5 * T)
            reply = await caller.request("echo", b"from an agent", timeout=5 * T)
            assert (reply.name, reply.body, reply.agent_id) == (
                "echo.reply",
                b"from an agent",
                "echo",
            )
            assert agent_control.INBOX_KEY not in reply and agent_control.REPLY_KEY not in reply
            assert asked_by == ["caller"]
            assert (await caller.request("quiet", timeout=5 * T)).body == b""

            with pytest.raises(FaultError) as caught:
                await caller.request("boom", timeout=5 * T)
            assert caught.value.code == HANDLER_FAILED
            with pytest.raises(FaultError) as caught:
                await caller.request("nobody.serves.this", timeout=5 * T)
            assert caught.value.code == FaultCode.NO_RESPONDENT

            # The inbox is registered on the caller's Tubes, and restored with them.
            await caller.wait_registered(5 * T)
            (status,) = caller.tubes
            (inbox,) = (name for name in status.registered if name.startswith("_inbox."))
            # A User-Agent cannot forge an answer into it.
            async with UserAgent.websocket(server.ws_url + "/asbp") as ua:
                with pytest.raises(FaultError) as caught:
                    await ua.request(inbox, reply="echo.reply", timeout=5 * T)
                assert caught.value.code == FaultCode.NO_RESPONDENT


async def test_one_agent_serves_two_brokers_and_replies_on_the_request_tube(
    tmp_path: Path,
) -> None:
    credentials = make_credentials(tmp_path)
    async with (
        running_broker(tmp_path, "broker-a") as a,
        running_broker(tmp_path, "broker-b") as b,
    ):
        agent = make_agent(credentials, [tube_url(a), tube_url(b)])

        @agent.respondent("where")
        async def where(request: Request) -> str:
            return request.broker_id

        async with (
            agent,
            UserAgent.websocket(a.ws_url + "/asbp") as at_a,
            UserAgent.http(b.http_url + "/asbp", poll_wait=5 * T) as at_b,
        ):
            await agent.wait_registered(5 * T)
            assert {t.broker_id for t in agent.tubes} == {"broker-a", "broker-b"}
            assert all(t.connected and t.registered == {"where"} for t in agent.tubes)
            assert (await at_a.request("where", timeout=5 * T)).body == b"broker-a"
            assert (await at_b.request("where", timeout=5 * T)).body == b"broker-b"
            assert set(await agent.ping()) == {"broker-a", "broker-b"}

            # Groups are per broker: a group send goes out on every Tube, and a
            # known Channel only to the broker it was seen through.
            await agent.join(["all"], [at_a.channel_id], broker="broker-a")
            await agent.join(["all"], [at_b.channel_id])
            await agent.send(Command({"c": "hello", "g": "all"}))
            assert (await at_a.receive(timeout=5 * T)).name == "hello"
            assert (await at_b.receive(timeout=5 * T)).name == "hello"
            await agent.send(Command({"c": "only.a", "d": [at_a.channel_id]}))
            assert (await at_a.receive(timeout=5 * T)).name == "only.a"


async def test_reconnects_with_a_fresh_credential_and_after_a_broker_restart(
    tmp_path: Path,
) -> None:
    credentials = make_credentials(tmp_path)
    async with TcpProxy() as proxy:
        agent = make_agent(credentials, [proxy.url])
        install_echo(agent)
        async with agent:
            async with running_broker(tmp_path) as first:
                proxy.target = first.port
                await agent.wait_registered(5 * T)
                (before,) = agent.tubes
                async with UserAgent.websocket(first.ws_url + "/asbp") as ua:
                    assert (await ua.request("echo", b"1", timeout=5 * T)).body == b"1"

                    # Cut the Tube; the same broker takes the agent back. It
                    # refuses a replayed jti, so this also proves each attempt
                    # mints a new credential.
                    proxy.cut()
                    proxy.target = first.port
                    await proxy.wait_forwarded(2)
                    await agent.wait_registered(5 * T)
                    (after,) = agent.tubes
                    assert after.tube_id != before.tube_id
                    assert after.sessions_opened == 2
                    assert (await ua.request("echo", b"2", timeout=5 * T)).body == b"2"
                proxy.cut()

            # The broker is gone; a new one (same identity and data) comes up.
            async with running_broker(tmp_path) as second:
                proxy.target = second.port
                await proxy.wait_forwarded(3)
                await agent.wait_registered(5 * T)
                async with UserAgent.http(second.http_url + "/asbp", poll_wait=5 * T) as ua:
                    assert "echo" in await served_names(ua)
                    assert (await ua.request("echo", b"3", timeout=5 * T)).body == b"3"
                await agent.close(timeout=5 * T)


@pytest.mark.parametrize("server_name", ["hypercorn", "uvicorn"])
async def test_refused_credentials_are_retried_and_logged_loudly(
    tmp_path: Path, agent_log: tuple[logging.Logger, LogWatcher], server_name: ServerName
) -> None:
    logger, watcher = agent_log
    make_credentials(tmp_path)  # the key the broker knows
    unknown_key, _ = generate_agent_key()
    impostor = AgentCredentialSource("echo", unknown_key, audience=AUDIENCE)
    async with running_broker(tmp_path, server=server_name) as server:
        agent = make_agent(impostor, [tube_url(server)], logger=logger)
        install_echo(agent)
        async with agent:

            def refused(record: logging.LogRecord) -> bool:
                return record.levelno == logging.ERROR and "REFUSED" in record.getMessage()

            await watcher.wait_for(refused, count=3)
            # Both servers let the broker answer the handshake with 401 and its fault.
            message = next(r for r in watcher.records if refused(r)).getMessage()
            assert "HTTP 401: 3101" in message
            (status,) = agent.tubes
            assert not status.connected and status.sessions_opened == 0


async def test_close_unregisters_then_finishes_in_flight_handlers(
    tmp_path: Path, agent_log: tuple[logging.Logger, LogWatcher]
) -> None:
    logger, watcher = agent_log
    credentials = make_credentials(tmp_path)
    async with running_broker(tmp_path) as server:
        agent = make_agent(credentials, [tube_url(server)], logger=logger)
        install_echo(agent)
        entered = asyncio.Event()
        release = asyncio.Event()

        @agent.respondent("slow")
        async def slow(request: Request) -> bytes:
            entered.set()
            await release.wait()
            return b"finished"

        async with UserAgent.websocket(server.ws_url + "/asbp") as ua:
            await agent.start()
            await agent.wait_registered(5 * T)
            in_flight = asyncio.create_task(ua.request("slow", timeout=10 * T))
            async with asyncio.timeout(5 * T):
                await entered.wait()
            closing = asyncio.create_task(agent.close(timeout=10 * T))

            def unregistered(record: logging.LogRecord) -> bool:
                return "no longer serving ['echo', 'slow']" in record.getMessage()

            # The broker confirms the unregistration while the handler still runs...
            await watcher.wait_for(unregistered)
            assert agent.state is AgentState.CLOSING
            assert not closing.done() and not in_flight.done()
            # ...so new work is refused by the broker, not lost.
            with pytest.raises(FaultError) as caught:
                await ua.request("echo", b"late", timeout=5 * T)
            assert caught.value.code == FaultCode.NO_RESPONDENT
            assert "slow" not in await served_names(ua)

            release.set()
            reply = await in_flight
            assert reply.body == b"finished"
            async with asyncio.timeout(10 * T):
                await closing
            assert state_of(agent) is AgentState.CLOSED
            assert agent.tubes[0].connected is False
            await agent.close()  # closing twice is harmless


async def test_close_cancels_handlers_past_the_timeout_and_the_broker_tells_the_user_agent(
    tmp_path: Path,
) -> None:
    credentials = make_credentials(tmp_path)
    async with running_broker(tmp_path) as server:
        agent = make_agent(credentials, [tube_url(server)])
        entered = asyncio.Event()
        cancelled = asyncio.Event()

        @agent.respondent("stuck")
        async def stuck(request: Request) -> bytes:
            entered.set()
            try:
                await asyncio.Event().wait()
            finally:
                cancelled.set()
            return b"never"

        async with UserAgent.websocket(server.ws_url + "/asbp") as ua:
            async with agent:
                await agent.wait_registered(5 * T)
                in_flight = asyncio.create_task(ua.request("stuck", timeout=10 * T))
                async with asyncio.timeout(5 * T):
                    await entered.wait()
                await agent.close(timeout=0.1 * T)
                assert cancelled.is_set()
            with pytest.raises(FaultError) as caught:
                await in_flight
            assert caught.value.code == FaultCode.RESPONDENT_LEFT
            with pytest.raises(AgentError, match="closed agent"):
                await agent.start()


async def test_a_reply_to_a_departed_user_agent_is_logged_not_raised(
    tmp_path: Path, agent_log: tuple[logging.Logger, LogWatcher]
) -> None:
    logger, watcher = agent_log
    credentials = make_credentials(tmp_path)
    async with running_broker(tmp_path) as server:
        agent = make_agent(credentials, [tube_url(server)], logger=logger)
        install_echo(agent)
        entered = asyncio.Event()
        release = asyncio.Event()
        answered = asyncio.Event()

        @agent.respondent("slow")
        async def slow(request: Request) -> None:
            entered.set()
            await release.wait()
            await request.send(Command({"c": "late", "d": [request.channel_id or ""]}))
            answered.set()

        async with agent:
            await agent.wait_registered(5 * T)
            ua = UserAgent.websocket(server.ws_url + "/asbp")
            await ua.connect()
            await ua.send(Command(c="slow"))  # no u: fire and forget
            async with asyncio.timeout(5 * T):
                await entered.wait()
            await ua.close()
            release.set()

            def unknown_channel(record: logging.LogRecord) -> bool:
                return record.levelno == logging.INFO and "2104" in record.getMessage()

            await watcher.wait_for(unknown_channel)
            assert answered.is_set()
            async with UserAgent.websocket(server.ws_url + "/asbp") as ua:
                assert (await ua.request("echo", b"ok", timeout=5 * T)).body == b"ok"


# -- Backoff -----------------------------------------------------------------


def test_backoff_grows_exponentially_to_the_maximum() -> None:
    backoff = Backoff(initial=0.1, maximum=10, multiplier=2, jitter="none")
    assert [backoff.delay(n) for n in range(4)] == pytest.approx([0.1, 0.2, 0.4, 0.8])
    assert backoff.delay(7) == pytest.approx(10)  # 12.8 capped
    assert backoff.delay(10_000) == 10


def test_backoff_full_jitter_draws_below_the_ceiling() -> None:
    backoff = Backoff(initial=1, maximum=8)
    assert backoff.delay(2, uniform=lambda: 0.0) == 0
    assert backoff.delay(2, uniform=lambda: 0.5) == pytest.approx(2)
    assert all(0 <= backoff.delay(n) <= backoff.ceiling(n) for n in range(50))


@pytest.mark.parametrize(
    "options",
    [
        {"initial": 0},
        {"initial": float("nan")},
        {"maximum": float("inf")},
        {"initial": 2, "maximum": 1},
        {"multiplier": 0.5},
        {"jitter": "half"},
    ],
)
def test_backoff_refuses_bad_parameters(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Backoff(**options)


def test_backoff_refuses_a_negative_attempt() -> None:
    with pytest.raises(ValueError):
        Backoff().ceiling(-1)
