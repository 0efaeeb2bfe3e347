"""The SDK's ``UserAgent`` with several broker URLs: it opens at the first that
answers, and when its broker stops (close 1012, gateway.drain) it resumes its
Channel at the next one at once, without the backoff delay.

Two ``python -m gateway`` processes on one private redis-server (a process, so
that SIGTERM runs the real stop), the SDK's echo Application-Agent on both.
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

from agents import Backoff, ChannelEvent, ChannelEventKind, Reconnect, UserAgent
from agents.errors import ChannelLost
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


async def test_requests_sent_while_the_broker_stops_are_each_answered_once(
    tmp_path: Path, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Requests keep leaving at a steady pace while broker A drains: those A never
    read (after ``read=<n>`` of its 1012) are sent again at B, in order, and every
    request gets its own answer once (none fails, none times out)."""
    redis_url = redis_server.url
    await flush(redis_url)
    credentials = make_credentials(tmp_path, "echo")
    caplog.set_level(logging.INFO, logger="asbp.user_agent")
    back = asyncio.Event()

    def on_event(event: ChannelEvent) -> None:
        if event.kind is ChannelEventKind.RECONNECTED:
            back.set()

    async with (
        _start(tmp_path, redis_url, "broker-a") as a,
        _start(tmp_path, redis_url, "broker-b") as b,
    ):
        agent = make_agent(
            credentials, [a.url.replace("/asbp", "/tube"), b.url.replace("/asbp", "/tube")]
        )
        install_echo(agent)
        async with agent:
            await until_in_directory(redis_url, "name:echo", "broker-a")
            await until_in_directory(redis_url, "name:echo", "broker-b")
            ua = UserAgent.websocket([a.url, b.url], reconnect=SLOW, on_event=on_event)
            async with ua:
                answers: dict[int, bytes] = {}

                refused = 0

                async def ask(n: int) -> None:
                    nonlocal refused
                    while True:
                        try:
                            answer = await ua.request("echo", str(n).encode(), timeout=10 * T)
                        except ChannelLost:  # checked before sending: never sent
                            refused += 1
                            await ua.wait_connected(10 * T)
                            continue
                        answers[n] = answer.body
                        return

                async with anyio.create_task_group() as group:
                    n = 0
                    stopped = False
                    # Until 300 requests after the resume: a steady pace, not a
                    # window, so frames are on the wire when A seals the Channel.
                    after = None
                    while after is None or n < after + 300:
                        # At most 100 awaiting an answer (the broker allows 256).
                        for _ in range(min(5, 100 - (n - len(answers)))):
                            group.start_soon(ask, n)
                            n += 1
                        if n >= 200 and not stopped:
                            a.process.send_signal(signal.SIGTERM)
                            stopped = True
                        if back.is_set() and after is None:
                            after = n
                        with anyio.fail_after(30 * T):
                            await asyncio.sleep(0.001)  # the pace of sending, not a wait
                assert ua.broker_id == "broker-b"
                assert answers == {i: str(i).encode() for i in range(n)}
                assert await a.process.wait() == 0
    resent = [r.getMessage() for r in caplog.records if "sending again" in r.getMessage()]
    print(f"{n} requests, all answered once ({refused} refused while reconnecting, then")
    print(f"sent again by the test); frames the SDK sent again after the 1012: {resent}")


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
