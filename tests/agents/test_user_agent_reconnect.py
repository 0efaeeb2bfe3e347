"""A User-Agent comes back after its broker process is killed and another takes its place.

A real ``python -m gateway`` process on a private redis-server, behind a TCP proxy
(the address clients know, as a load balancer's would be): the broker is
SIGKILLed, the proxy refuses connections until a new broker process listens,
and the User-Agent (WebSocket and HTTP) must fail what it awaited with
``ChannelLost``, tell each step as an event, and serve requests again.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Literal

import pytest

from agents import (
    Backoff,
    ChannelEvent,
    ChannelEventKind,
    ChannelLost,
    Reconnect,
    Request,
    UserAgent,
)
from agents.errors import ConnectionLost
from tests.gateway.engines._broker_process import BrokerProcess, broker_process
from tests.support import RedisServer, T
from tests.support.agents import (
    TcpProxy,
    install_echo,
    make_agent,
    make_credentials,
    running_broker,
)

pytestmark = pytest.mark.anyio

Transport = Literal["websocket", "http"]
FAST = Reconnect(Backoff(initial=0.02 * T, maximum=0.2 * T))


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("reconnect-redis")) as server:
        yield server


class Events:
    """The events a User-Agent reported, and a way to wait for the next of a kind."""

    def __init__(self) -> None:
        self.seen: list[ChannelEvent] = []
        self._changed = asyncio.Event()

    def __call__(self, event: ChannelEvent) -> None:
        self.seen.append(event)
        self._changed.set()

    def kinds(self) -> list[ChannelEventKind]:
        return [event.kind for event in self.seen]

    async def wait_for(self, kind: ChannelEventKind) -> ChannelEvent:
        async with asyncio.timeout(10 * T):
            while True:
                for event in self.seen:
                    if event.kind is kind:
                        return event
                self._changed.clear()
                await self._changed.wait()


@contextlib.asynccontextmanager
async def broker(redis_url: str, directory: Path, pem: Path) -> AsyncIterator[BrokerProcess]:
    settings = f"insecure_dev_tubes = true\n[agents.echo]\npublic_key = {str(pem)!r}\n"
    async with broker_process(
        redis_url, directory, ack_timeout=30, prefetch=8, settings=settings
    ) as process:
        yield process


def port_of(process: BrokerProcess) -> int:
    return int(process.url.rsplit(":", 1)[1].split("/", 1)[0])


def user_agent(transport: Transport, port: int, events: Events) -> UserAgent:
    if transport == "websocket":
        return UserAgent.websocket(
            f"ws://127.0.0.1:{port}/asbp", reconnect=FAST, on_event=events, timeout=5 * T
        )
    return UserAgent.http(
        f"http://127.0.0.1:{port}/asbp",
        reconnect=FAST,
        on_event=events,
        poll_wait=5 * T,
        timeout=5 * T,
        backoff=Backoff(initial=0.02 * T, maximum=0.2 * T),
    )


@pytest.mark.parametrize("transport", ["websocket", "http"])
async def test_a_user_agent_reconnects_after_its_broker_is_killed_and_replaced(
    tmp_path: Path, redis_server: RedisServer, transport: Transport
) -> None:
    credentials = make_credentials(tmp_path)
    pem = tmp_path / "echo.pem"
    entered, release = asyncio.Event(), asyncio.Event()
    events = Events()
    async with TcpProxy() as proxy:
        agent = make_agent(credentials, [f"ws://127.0.0.1:{proxy.port}/tube"])
        install_echo(agent)

        @agent.respondent("hang")
        async def hang(request: Request) -> bytes:
            entered.set()
            await release.wait()
            return b""

        ua = user_agent(transport, proxy.port, events)
        async with agent:
            async with broker(redis_server.url, tmp_path / "first", pem) as first:
                proxy.target = port_of(first)
                await agent.wait_registered(10 * T)
                await ua.connect()
                before = ua.channel_id
                assert (await ua.request("echo", b"1", timeout=5 * T)).body == b"1"
                waiting = asyncio.create_task(ua.request("hang", timeout=30 * T))
                async with asyncio.timeout(5 * T):
                    await entered.wait()
                proxy.cut()
                await first.kill()
            if transport == "websocket":
                # The socket is gone at once: new requests fail, clearly, while the
                # one awaited waits for the resume (its answer would be replayed).
                await events.wait_for(ChannelEventKind.LOST)
                assert not waiting.done()
                with pytest.raises(ChannelLost):
                    await ua.request("echo", timeout=5 * T)
            async with broker(redis_server.url, tmp_path / "second", pem) as second:
                proxy.target = port_of(second)
                await agent.wait_registered(10 * T)
                if transport == "http":
                    # On a bus an HTTP Channel's mailbox is its Channel log in the
                    # routing plane, not the broker's memory: the new broker serves
                    # the same Channel, so there is nothing to reconnect. What the
                    # killed broker's agent was serving is lost with it (no 2102:
                    # nobody is left to say it; docs/protocol.md).
                    assert (await ua.request("echo", b"2", timeout=5 * T)).body == b"2"
                    assert ua.connected and ua.channel_id == before
                    assert ChannelEventKind.RECONNECTED not in events.kinds()
                    waiting.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await waiting
                    await ua.close()
                    release.set()
                    await agent.close(timeout=5 * T)
                    return
                reconnected = await events.wait_for(ChannelEventKind.RECONNECTED)
                await ua.wait_connected(5 * T)
                assert ua.connected
                assert reconnected.previous == before
                # Resumed (docs/protocol.md, "Resuming a Channel"): the same Channel,
                # taken back at the broker that replaced the killed one.
                assert reconnected.channel_id == ua.channel_id == before
                assert (await ua.request("echo", b"2", timeout=5 * T)).body == b"2"
                # Its Respondent's broker died with it: no answer comes, and closing
                # ends the wait.
                assert not waiting.done()
                # Failed attempts while no broker listened were retried with backoff.
                kinds = events.kinds()
                assert kinds[0] is ChannelEventKind.LOST
                assert kinds.count(ChannelEventKind.RECONNECTING) >= 1
                assert kinds[-1] is ChannelEventKind.RECONNECTED
                await ua.close()
                assert ua.closed and not ua.connected
                with pytest.raises(ConnectionLost):
                    await waiting
                release.set()
                await agent.close(timeout=5 * T)


async def test_a_user_agent_gives_up_after_max_attempts(tmp_path: Path) -> None:
    events = Events()
    async with TcpProxy() as proxy:
        make_credentials(tmp_path)
        # Nothing listens behind the proxy once it is cut.
        async with running_broker(tmp_path) as server:
            proxy.target = server.port
            ua = UserAgent.websocket(
                f"ws://127.0.0.1:{proxy.port}/asbp",
                reconnect=Reconnect(Backoff(initial=0.01 * T, maximum=0.02 * T), max_attempts=3),
                on_event=events,
            )
            await ua.connect()
            proxy.cut()
            gave_up = await events.wait_for(ChannelEventKind.GAVE_UP)
            assert gave_up.attempt == 3
            assert ua.closed
            with pytest.raises(ConnectionLost):
                await ua.wait_connected(5 * T)
            with pytest.raises(ConnectionLost):
                await ua.receive(timeout=5 * T)
            await ua.close()


async def test_without_reconnect_a_lost_channel_ends_the_user_agent(tmp_path: Path) -> None:
    async with TcpProxy() as proxy:
        make_credentials(tmp_path)
        async with running_broker(tmp_path) as server:
            proxy.target = server.port
            ua = UserAgent.websocket(f"ws://127.0.0.1:{proxy.port}/asbp", reconnect=None)
            await ua.connect()
            await ua.wait_connected(5 * T)
            proxy.cut()
            with pytest.raises(ConnectionLost):
                await ua.receive(timeout=5 * T)
            assert ua.closed
            with pytest.raises(ConnectionLost) as caught:
                await ua.request("echo", timeout=5 * T)
            assert not isinstance(caught.value, ChannelLost)
            await ua.close()


def test_reconnect_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        Reconnect(max_attempts=0)


async def test_the_documented_reconnecting_user_agent_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = Path(__file__).resolve().parents[2] / "docs" / "user-agents.md"
    (program,) = re.findall(r"^```python\n(.*?)^```$", doc.read_text(), re.MULTILINE | re.DOTALL)
    namespace: dict[str, object] = {"__name__": "reconnecting_user_agent"}
    exec(compile(program, "reconnecting_user_agent.py", "exec"), namespace)
    credentials = make_credentials(tmp_path)
    async with running_broker(tmp_path) as server:
        agent = make_agent(credentials, [server.ws_url + "/tube"])
        install_echo(agent)
        async with agent:
            await agent.wait_registered(5 * T)
            main = namespace["main"]
            assert callable(main)
            await main(server.ws_url + "/asbp")
    assert capsys.readouterr().out == "hello\n"
