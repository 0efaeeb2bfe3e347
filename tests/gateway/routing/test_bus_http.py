"""HTTP Channels without affinity: any broker of a bus answers any POST and long-poll.

Brokers on one private redis-server (Hypercorn in threads of this process, or
``python -m gateway`` processes where one is SIGKILLed); the Application-Agent is
the SDK's, connected to one broker only; the User-Agent is httpx, sending each
request to whichever broker it likes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from agents import ApplicationAgent, Request
from asbp import Command, decode
from gateway.app import create_app
from gateway.config.model import ChannelLimits, GatewayConfig
from tests.gateway.engines._broker_process import BrokerProcess, broker_process
from tests.support import RedisServer, RunningServer, T, serve_app_async
from tests.support.agents import make_agent, make_credentials
from tests.support.bus import BUS_LEASE, bus_broker, bus_config, flush, until_in_directory
from tests.support.gateway import HttpChannel, assert_fault, parse_multipart

pytestmark = pytest.mark.anyio

LEASE = BUS_LEASE


def config(tmp_path: Path, broker_id: str, redis_url: str) -> GatewayConfig:
    return bus_config(tmp_path, broker_id, redis_url, agent="echo")


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("bus-http-redis")) as server:
        yield server


def broker(
    tmp_path: Path, broker_id: str, redis_url: str
) -> contextlib.AbstractAsyncContextManager[RunningServer]:
    return bus_broker(tmp_path, broker_id, redis_url, agent="echo")


@pytest.fixture
async def bus(
    tmp_path: Path, redis_server: RedisServer
) -> AsyncIterator[tuple[RunningServer, RunningServer, ApplicationAgent]]:
    redis_url = redis_server.url
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
            yield a, b, agent


async def test_post_on_one_broker_long_poll_on_the_other(
    bus: tuple[RunningServer, RunningServer, ApplicationAgent],
) -> None:
    a, b, agent = bus
    async with httpx.AsyncClient(timeout=10 * T) as client:
        on_a = await HttpChannel(client, a.http_url + "/asbp").open()
        on_b = HttpChannel(client, b.http_url + "/asbp", on_a.id, secret=on_a.secret)
        # Sent at A, served by the agent at B, read at B; then the other way round.
        status, _ = await on_a.post(Command({"c": "echo", "i": on_a.id, "u": 1}, b"one"))
        assert status == 200
        [(seq, reply)] = await on_b.poll()
        assert (seq, reply.name, reply.command_id, reply.body) == (1, "echo.reply", 1, b"one")
        assert reply.get("a") == "echo"
        status, _ = await on_b.post(Command({"c": "echo", "i": on_a.id, "u": 2}, b"two"))
        assert status == 200
        on_a.seen = on_b.seen  # the client's one count, whichever broker it asks
        [(seq, reply)] = await on_a.poll()
        assert (seq, reply.command_id, reply.body) == (2, 2, b"two")
        # What was read at A was acknowledged for B too.
        assert await on_b.poll(after=2, wait=0) == []
        # The agent's own Commands for the Channel reach it, whatever broker it asks.
        await agent.send(Command({"c": "news", "d": on_a.id, "u": 3}, b"extra"), confirm=0.5 * T)
        [(seq, news)] = await on_a.poll(after=2)
        assert (seq, news.name, news.body) == (3, "news", b"extra")


async def test_a_long_poll_on_one_broker_wakes_for_a_command_routed_on_another(
    bus: tuple[RunningServer, RunningServer, ApplicationAgent],
) -> None:
    a, b, _ = bus
    async with httpx.AsyncClient(timeout=30 * T) as client:
        on_a = await HttpChannel(client, a.http_url + "/asbp").open()
        on_b = HttpChannel(client, b.http_url + "/asbp", on_a.id, secret=on_a.secret)
        for u in range(1, 4):
            parked = asyncio.ensure_future(on_b.poll(wait=20 * T))
            # Parked at B once a later request of the Channel has been answered there.
            await on_b.poll_response(after=on_b.seen, wait=0)
            assert not parked.done()
            loop = asyncio.get_running_loop()
            sent = loop.time()
            await on_a.post(Command({"c": "asbp.ping", "i": on_a.id, "u": u}))
            with anyio.fail_after(5 * T):
                [(_, pong)] = await parked
            assert (pong.name, pong.command_id) == ("asbp.pong", u)
            assert loop.time() - sent < 20 * T  # woken, not timed out


async def test_the_secret_is_checked_at_every_broker(
    bus: tuple[RunningServer, RunningServer, ApplicationAgent],
) -> None:
    a, b, _ = bus
    async with httpx.AsyncClient(timeout=10 * T) as client:
        owner = await HttpChannel(client, a.http_url + "/asbp").open()
        await owner.post(Command({"c": "asbp.ping", "i": owner.id, "u": 1}))
        for secret in ("", "wrong"):
            stranger = HttpChannel(client, b.http_url + "/asbp", owner.id, secret=secret)
            status, fault = await stranger.post(Command({"c": "asbp.ping", "i": owner.id, "u": 2}))
            assert status == 404
            assert_fault(fault, 2104, u=2)
            polled = await stranger.poll_response(after=1, wait=0)
            assert polled.status_code == 404
        # Nothing was acknowledged or sent by the strangers.
        assert [(s, c.command_id) for s, c in await owner.poll()] == [(1, 1)]
        assert await owner.poll(wait=0) == []


# --------------------------------------------------------------------------
# Three broker processes, one of them SIGKILLed mid-poll


class RoundRobin:
    """An HTTP User-Agent that sends each request to the next broker, skipping dead ones.

    The only errors it tolerates are retryable: a connection refused, reset or cut
    (the broker died), or a 503. Anything else fails the test.
    """

    def __init__(self, client: httpx.AsyncClient, urls: list[str]) -> None:
        self.client = client
        self.urls = urls
        self._turn = itertools.count()
        self.retried = 0
        self.channel_id = ""
        self.secret = ""

    def next_url(self) -> str:
        return self.urls[next(self._turn) % len(self.urls)]

    async def request(self, method: str, **options: object) -> httpx.Response:
        while True:
            url = self.next_url()
            try:
                response = await self.client.request(method, url, **options)  # type: ignore[arg-type]
            except httpx.TransportError:
                self.retried += 1
                continue
            if response.status_code == 503:
                self.retried += 1
                continue
            return response

    def headers(self) -> dict[str, str]:
        return {"Content-Type": "application/asbp", "ASBP-Secret": self.secret}


async def test_round_robin_across_three_brokers_while_one_is_killed_loses_nothing(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    redis_url = redis_server.url
    await flush(redis_url)
    credentials = make_credentials(tmp_path, "echo")
    settings = (
        f"bus_lease = {LEASE}\ninsecure_dev_tubes = true\n"
        f"[agents.echo]\npublic_key = {str(tmp_path / 'echo.pem')!r}\n"
    )

    def start(name: str) -> contextlib.AbstractAsyncContextManager[BrokerProcess]:
        return broker_process(
            redis_url, tmp_path / name, ack_timeout=30, prefetch=8, settings=settings
        )

    total = 60
    async with start("a") as a, start("b") as b, start("c") as c:
        urls = [p.url.replace("ws://", "http://") for p in (a, b, c)]
        agent = make_agent(credentials, [c.url.replace("/asbp", "/tube")])

        @agent.respondent("echo")
        async def echo(request: Request) -> bytes:
            return request.body

        async with agent, httpx.AsyncClient(timeout=30 * T) as client:
            # Registered bus-wide first: a Command sent before that gets 2101 (as it
            # must; before HTTP Channels' requests were kept in flight at the
            # broker that took them in, it vanished).
            await agent.wait_registered(5 * T)
            user = RoundRobin(client, urls)
            opened = await user.request("POST", content=b"c=asbp.channel;")
            accepted = decode(opened.content)
            user.channel_id, user.secret = str(accepted.channel_id), str(accepted.get("secret"))
            received: dict[int, bytes] = {}
            seqs: list[int] = []
            done = asyncio.Event()

            async def poller() -> None:
                after = 0
                while not done.is_set():
                    response = await user.request(
                        "GET",
                        params={"i": user.channel_id, "after": str(after), "wait": f"{2 * T:g}"},
                        headers=user.headers(),
                    )
                    if response.status_code == 204:
                        continue
                    assert response.status_code == 200, (response.status_code, response.content)
                    for seq, frame in parse_multipart(
                        response.headers["content-type"], response.content
                    ):
                        if seq <= after:
                            continue  # sent again: a response was lost on the way
                        after = seq
                        seqs.append(seq)
                        command = decode(frame)
                        assert command.command_id is not None, command
                        assert command.command_id not in received, command  # none twice
                        received[command.command_id] = command.body
                        if len(received) == total:
                            done.set()

            polling = asyncio.ensure_future(poller())
            for u in range(1, total + 1):
                if u == total // 3:
                    # A long-poll of the Channel is open at A when it dies, besides
                    # whatever the poller has there: its client sees the connection
                    # cut, which is retryable, and polls another broker.
                    doomed = asyncio.ensure_future(
                        client.get(
                            urls[0],
                            params={"i": user.channel_id, "after": "0", "wait": f"{20 * T:g}"},
                            headers=user.headers(),
                        )
                    )
                    await asyncio.sleep(0)  # let the request start; not synchronisation
                    await a.kill()
                    with pytest.raises(httpx.TransportError):
                        await doomed
                frame = b"c=echo,i=%s,u=%d;m%d" % (user.channel_id.encode(), u, u)
                response = await user.request("POST", content=frame, headers=user.headers())
                assert response.status_code == 200, (response.status_code, response.content)
            with anyio.fail_after(20 * T):
                await done.wait()
            await polling
            assert received == {u: b"m%d" % u for u in range(1, total + 1)}
            assert seqs == sorted(seqs)
            assert user.retried > 0  # the dead broker was tried, and only retried


async def test_a_bus_whose_redis_is_gone_answers_503_with_2005(tmp_path: Path) -> None:
    make_credentials(tmp_path)  # the agent key the brokers' config names
    (tmp_path / "redis").mkdir()
    with RedisServer(tmp_path / "redis") as server:
        async with (
            broker(tmp_path, "broker-a", server.url) as a,
            broker(tmp_path, "broker-b", server.url) as b,
            httpx.AsyncClient(timeout=10 * T) as client,
        ):
            owner = await HttpChannel(client, a.http_url + "/asbp").open()
            elsewhere = HttpChannel(client, b.http_url + "/asbp", owner.id, secret=owner.secret)
            server.stop()
            # B must ask the bus whether the secret is right; A has the Channel but
            # its mailbox is in Redis. Either way: retryable, never a 404 or a 5xx crash.
            posted = await elsewhere.post_response(
                Command({"c": "asbp.ping", "i": owner.id, "u": 4})
            )
            assert posted.status_code == 503
            assert_fault(decode(posted.content), 2005, u=4)
            # Retryable, and said so: the SDKs wait Retry-After before they try again.
            assert posted.headers["Retry-After"] == "1"
            polled = await owner.poll_response(wait=0)
            assert polled.status_code == 503
            assert_fault(decode(polled.content), 2005)
            assert polled.headers["Retry-After"] == "1"


async def test_what_retention_drops_is_named_in_the_long_poll(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    await flush(redis_server.url)
    make_credentials(tmp_path)  # the agent key the broker's config names
    base = config(tmp_path, "broker-a", redis_server.url)
    small = dataclasses.replace(base, channels=ChannelLimits(log_max_frames=2))
    async with (
        serve_app_async(create_app(small)) as a,
        httpx.AsyncClient(timeout=10 * T) as client,
    ):
        owner = await HttpChannel(client, a.http_url + "/asbp").open()
        for u in range(1, 6):
            await owner.post(Command({"c": "asbp.ping", "i": owner.id, "u": u}))
        response = await owner.poll_response(after=0, wait=5 * T)
        assert response.status_code == 200
        assert response.headers["asbp-lost"] == "1-3"
        assert [c.command_id for _, c in await owner.poll(after=0)] == [4, 5]
        after = await owner.poll_response(after=5, wait=0)
        assert after.status_code == 204 and "asbp-lost" not in after.headers


async def test_a_bug_in_the_work_an_http_channel_starts_is_logged_when_it_happens(
    tmp_path: Path, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    # The work the bus side of HTTP Channels starts and awaits nowhere (a claim, a
    # look for the home, a rejoin) handles the failures it expects; anything else
    # must reach the broker's log at once, naming the work, not as asyncio's
    # "exception was never retrieved" whenever the task is collected.
    await flush(redis_server.url)
    make_credentials(tmp_path)
    app = create_app(config(tmp_path, "broker-a", redis_server.url))
    async with serve_app_async(app):
        http_bus = app.state.broker.http_bus
        assert http_bus is not None

        async def rejoin() -> None:
            raise RuntimeError("a bug")

        with caplog.at_level(logging.ERROR, logger="asbp.gateway"):
            http_bus._spawn(rejoin())
            (task,) = http_bus._tasks
            await asyncio.wait({task}, timeout=5 * T)  # its done callback runs first
        assert not http_bus._tasks
        (record,) = [r for r in caplog.records if r.getMessage() == "http_bus.task_failed"]
        assert record.task.endswith("rejoin")  # type: ignore[attr-defined]
        assert record.exc_info is not None and str(record.exc_info[1]) == "a bug"
