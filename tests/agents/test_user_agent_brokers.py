"""The SDK's ``UserAgent`` with several broker URLs: it opens at the first that
answers, and when its broker stops (close 1012, gateway.drain) it resumes its
Channel at the next one at once, without the backoff delay.

Two ``python -m gateway`` processes on one private redis-server (a process, so
that SIGTERM runs the real stop), the SDK's echo Application-Agent on both.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from agents import Backoff, ChannelEvent, ChannelEventKind, Reconnect, UserAgent
from tests.gateway.engines._broker_process import BrokerProcess, broker_process
from tests.support import RedisServer, T, listen_port
from tests.support.agents import install_echo, make_agent, make_credentials
from tests.support.bus import flush, until_in_directory

pytestmark = pytest.mark.anyio

#: Far longer than the test waits for the resume: one that waited for it fails.
SLOW = Reconnect(Backoff(initial=60 * T, maximum=60 * T))


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("ua-brokers-redis")) as server:
        yield server


async def test_a_user_agent_resumes_at_the_next_broker_at_once_when_its_broker_stops(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    redis_url = redis_server.url
    await flush(redis_url)
    credentials = make_credentials(tmp_path, "echo")

    def start(name: str) -> contextlib.AbstractAsyncContextManager[BrokerProcess]:
        return _start(tmp_path, redis_url, name)

    events: list[ChannelEvent] = []
    back = asyncio.Event()

    def on_event(event: ChannelEvent) -> None:
        events.append(event)
        if event.kind is ChannelEventKind.RECONNECTED:
            back.set()

    # Nobody listens there: the Channel opens at the next URL.
    nowhere = f"ws://127.0.0.1:{listen_port('127.0.0.1')}/asbp"
    async with start("broker-a") as a, start("broker-b") as b:
        agent = make_agent(
            credentials, [a.url.replace("/asbp", "/tube"), b.url.replace("/asbp", "/tube")]
        )
        install_echo(agent)
        async with agent:
            await until_in_directory(redis_url, "name:echo", "broker-a")
            await until_in_directory(redis_url, "name:echo", "broker-b")
            ua = UserAgent.websocket([nowhere, a.url, b.url], reconnect=SLOW, on_event=on_event)
            async with ua:
                assert ua.broker_id == "broker-a"
                first = ua.channel_id
                assert (await ua.request("echo", b"before", timeout=5 * T)).body == b"before"
                a.process.send_signal(signal.SIGTERM)
                with anyio.fail_after(10 * T):
                    await back.wait()
                    assert await a.process.wait() == 0
                assert ua.channel_id == first  # resumed, not a new Channel
                assert ua.broker_id == "broker-b"
                reconnecting = [e for e in events if e.kind is ChannelEventKind.RECONNECTING]
                assert [e.delay for e in reconnecting] == [0.0]
                assert (await ua.request("echo", b"after", timeout=5 * T)).body == b"after"


def _start(
    tmp_path: Path, redis_url: str, name: str, resume: str = "auto"
) -> contextlib.AbstractAsyncContextManager[BrokerProcess]:
    settings = (
        f'broker_id = "{name}"\nbus_lease = 1.5\ninsecure_dev_tubes = true\n'
        f"[agents.echo]\npublic_key = {str(tmp_path / 'echo.pem')!r}\n"
        f'[channels]\nresume = "{resume}"\n'
    )
    return broker_process(redis_url, tmp_path / name, ack_timeout=30, prefetch=8, settings=settings)


async def test_without_resume_a_user_agent_opens_a_new_channel_at_once_at_the_next_broker(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    redis_url = redis_server.url
    await flush(redis_url)
    credentials = make_credentials(tmp_path, "echo")
    events: list[ChannelEvent] = []
    back = asyncio.Event()

    def on_event(event: ChannelEvent) -> None:
        events.append(event)
        if event.kind is ChannelEventKind.RECONNECTED:
            back.set()

    async with (
        _start(tmp_path, redis_url, "broker-a", resume="off") as a,
        _start(tmp_path, redis_url, "broker-b", resume="off") as b,
    ):
        agent = make_agent(credentials, [b.url.replace("/asbp", "/tube")])
        install_echo(agent)
        async with agent:
            await until_in_directory(redis_url, "name:echo", "broker-b")
            ua = UserAgent.websocket([a.url, b.url], reconnect=SLOW, on_event=on_event)
            async with ua:
                first = ua.channel_id
                a.process.send_signal(signal.SIGTERM)
                with anyio.fail_after(10 * T):
                    await back.wait()
                    assert await a.process.wait() == 0
                # Told to go elsewhere (1012) all the same, though nothing followed it.
                assert ua.channel_id != first
                assert ua.broker_id == "broker-b"
                reconnecting = [e for e in events if e.kind is ChannelEventKind.RECONNECTING]
                assert [e.delay for e in reconnecting] == [0.0]
                assert (await ua.request("echo", b"new", timeout=5 * T)).body == b"new"


def test_a_user_agent_needs_a_url() -> None:
    with pytest.raises(ValueError, match="at least one URL"):
        UserAgent.websocket([])
