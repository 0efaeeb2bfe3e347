"""The SDK's ``UserAgent`` resumes its WebSocket Channel on another broker of the bus.

Two brokers (Hypercorn in this process) on one private redis-server, behind a TCP
proxy (the address the User-Agent knows, as a load balancer's would be): the proxy
cuts the User-Agent's connection to broker A, an agent sends Commands to its Channel
while it is away, and the proxy then leads to broker B, where the User-Agent resumes:
the same ``i``, and every Command once, in order.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agents import Backoff, ChannelEvent, ChannelEventKind, Reconnect, Request, UserAgent
from agents.channel import WebSocketChannel
from asbp import Command
from gateway.app import create_app
from gateway.config.model import ChannelLimits, GatewayConfig
from tests.support import RedisServer, T, serve_app_async
from tests.support.agents import TcpProxy, make_agent, make_credentials
from tests.support.bus import flush, kept_holds, until_in_directory

pytestmark = pytest.mark.anyio

FAST = Reconnect(Backoff(initial=0.02 * T, maximum=0.2 * T))


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("ua-resume-redis")) as server:
        yield server


def config(tmp_path: Path, broker_id: str, redis_url: str) -> GatewayConfig:
    directory = tmp_path / broker_id
    directory.mkdir()
    return GatewayConfig(
        data_dir=directory,
        broker_id=broker_id,
        engine="redis",
        redis_url=redis_url,
        bus_lease=1.5,
        insecure_dev_tubes=True,
        agents={"news": {"public_key": "news.pem"}},
        agents_base_dir=tmp_path,
    )


async def test_a_user_agent_resumes_on_another_broker_and_misses_nothing(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    redis_url = redis_server.url
    await flush(redis_url)
    credentials = make_credentials(tmp_path, "news")
    events: list[ChannelEventKind] = []
    kept: list[frozenset[str]] = []
    reconnected = asyncio.Event()

    def on_event(event: object) -> None:
        kind = getattr(event, "kind", None)
        assert isinstance(kind, ChannelEventKind)
        events.append(kind)
        if kind is ChannelEventKind.RECONNECTED:
            kept.append(getattr(event, "kept", frozenset()))
            reconnected.set()

    async with (
        serve_app_async(create_app(config(tmp_path, "broker-a", redis_url))) as a,
        serve_app_async(create_app(config(tmp_path, "broker-b", redis_url))) as b,
        TcpProxy() as proxy,
    ):
        agent = make_agent(credentials, [b.ws_url + "/tube"])
        async with agent:
            await agent.wait_registered(5 * T)
            proxy.target = a.port
            ua = UserAgent.websocket(
                f"ws://127.0.0.1:{proxy.port}/asbp", reconnect=FAST, on_event=on_event
            )
            async with ua:
                channel_id = ua.channel_id
                await until_in_directory(redis_url, "ch", channel_id)
                # Without u: a User-Agent takes a Command with u for an answer.
                await agent.send(Command({"c": "news", "d": channel_id}, b"m0"))
                assert (await ua.receive(timeout=5 * T)).body == b"m0"
                proxy.cut()  # refuses new connections too, until it has a target
                await until_in_directory(redis_url, "ch", channel_id, present=False)
                for u in range(1, 101):
                    await agent.send(Command({"c": "news", "d": channel_id}, b"m%d" % u))
                proxy.target = b.port
                async with asyncio.timeout(10 * T):
                    await reconnected.wait()
                assert ua.channel_id == channel_id
                assert ua.broker_id == "broker-b"
                # Its groups and subscriptions followed it; Subjects are off on these
                # brokers (no Authenticate-Command), so the broker does not say it kept
                # them.
                assert kept == [frozenset({"groups", "subscriptions"})]
                got = [await ua.receive(timeout=5 * T) for _ in range(100)]
                assert [c.body for c in got] == [b"m%d" % u for u in range(1, 101)]
                # Live again, held at B; and nothing came twice.
                await agent.send(Command({"c": "news", "d": channel_id}, b"live"))
                assert (await ua.receive(timeout=5 * T)).body == b"live"
                # A round trip after it: everything sent before has arrived by then.
                assert (await ua.request("asbp.ping", timeout=5 * T)).name == "asbp.pong"
                with pytest.raises(TimeoutError):
                    await ua.receive(timeout=0)
    assert events[0] is ChannelEventKind.LOST
    assert events[-1] is ChannelEventKind.RECONNECTED


async def test_a_resumed_user_agent_hears_which_subjects_followed_it(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    redis_url = redis_server.url
    await flush(redis_url)
    credentials = make_credentials(tmp_path, "news")
    reconnected: asyncio.Queue[ChannelEvent] = asyncio.Queue()

    def on_event(event: ChannelEvent) -> None:
        if event.kind is ChannelEventKind.RECONNECTED:
            reconnected.put_nowait(event)

    def signing_in(broker_id: str) -> GatewayConfig:
        return dataclasses.replace(
            config(tmp_path, broker_id, redis_url),
            agents={"news": {"public_key": "news.pem", "serves": [".*", "auth.login"]}},
            authenticate_command="auth.login",
        )

    async with (
        serve_app_async(create_app(signing_in("broker-a"))) as a,
        serve_app_async(create_app(signing_in("broker-b"))) as b,
        TcpProxy() as proxy,
    ):
        agent = make_agent(credentials, [b.ws_url + "/tube"])

        @agent.respondent("auth.login")
        async def login(request: Request) -> None:
            await request.authenticate("clerk")

        async with agent:
            await agent.wait_registered(5 * T)
            proxy.target = a.port
            ua = UserAgent.websocket(
                f"ws://127.0.0.1:{proxy.port}/asbp", reconnect=FAST, on_event=on_event
            )
            async with ua:
                channel_id = ua.channel_id
                signed_in = await ua.request("auth.login", b"alice", timeout=5 * T)
                subject = signed_in.get("s")
                assert signed_in.name == "asbp.authenticated" and isinstance(subject, str)
                await kept_holds(redis_url, channel_id, subject.encode())
                proxy.cut()
                await until_in_directory(redis_url, "ch", channel_id, present=False)
                proxy.target = b.port
                async with asyncio.timeout(10 * T):
                    event = await reconnected.get()
                assert (event.channel_id, event.previous) == (channel_id, channel_id)
                assert event.kept == {"groups", "subjects", "subscriptions"}
                assert event.subjects == {subject}


async def test_a_request_in_flight_is_answered_and_a_subscription_kept_across_a_resume(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    redis_url = redis_server.url
    await flush(redis_url)
    credentials = make_credentials(tmp_path, "news")
    entered, release = asyncio.Event(), asyncio.Event()
    reconnected: asyncio.Queue[ChannelEvent] = asyncio.Queue()

    def on_event(event: ChannelEvent) -> None:
        if event.kind is ChannelEventKind.RECONNECTED:
            reconnected.put_nowait(event)

    async with (
        serve_app_async(create_app(config(tmp_path, "broker-a", redis_url))) as a,
        serve_app_async(create_app(config(tmp_path, "broker-b", redis_url))) as b,
        TcpProxy() as proxy,
    ):
        agent = make_agent(credentials, [b.ws_url + "/tube"])

        @agent.respondent("slow")
        async def slow(request: Request) -> bytes:
            entered.set()
            await release.wait()
            return b"worth the wait"

        async with agent:
            await agent.wait_registered(5 * T)
            proxy.target = a.port
            transport = RecordingChannel(f"ws://127.0.0.1:{proxy.port}/asbp", timeout=5 * T)
            ua = UserAgent(transport, reconnect=FAST, on_event=on_event)
            publisher = UserAgent.websocket(b.ws_url + "/asbp", reconnect=None)
            async with ua, publisher:
                channel_id = ua.channel_id
                await until_in_directory(redis_url, "ch", channel_id)
                accepted = await ua.subscribe("/news/.*")
                assert accepted.name == "asbp.accepted"
                waiting = asyncio.create_task(ua.request("slow", timeout=10 * T))
                async with asyncio.timeout(5 * T):
                    await entered.wait()
                proxy.cut()
                await until_in_directory(redis_url, "ch", channel_id, present=False)
                # While it is away: its answer is given, and a topic it follows gets
                # a publication. Neither is lost, and it does not fail the request.
                release.set()
                await publisher.request("asbp.publish", b"n1", destination="/news/a")
                assert not waiting.done()
                transport.sent.clear()
                proxy.target = b.port
                async with asyncio.timeout(10 * T):
                    event = await reconnected.get()
                assert (event.channel_id, event.previous) == (channel_id, channel_id)
                assert "subscriptions" in event.kept  # nothing to subscribe again
                assert (await waiting).body == b"worth the wait"
                pushed = await ua.receive(timeout=5 * T)
                assert (pushed.name, pushed.body) == ("asbp.notification", b"n1")
                # Still subscribed at B, without having subscribed again.
                await publisher.request("asbp.publish", b"n2", destination="/news/b")
                assert (await ua.receive(timeout=5 * T)).body == b"n2"
                assert "asbp.subscribe" not in transport.sent


async def test_a_queue_delivery_is_not_counted_and_comes_again_after_a_resume(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """The SDK counts every frame but queue deliveries (the broker logs none: the queue
    is their log), so what was logged while it was away arrives after the resume, and
    the unacknowledged delivery comes again from its queue."""
    redis_url = redis_server.url
    await flush(redis_url)
    credentials = make_credentials(tmp_path, "news")
    reconnected = asyncio.Event()

    def on_event(event: ChannelEvent) -> None:
        if event.kind is ChannelEventKind.RECONNECTED:
            reconnected.set()

    async with (
        serve_app_async(create_app(config(tmp_path, "broker-a", redis_url))) as a,
        serve_app_async(create_app(config(tmp_path, "broker-b", redis_url))) as b,
        TcpProxy() as proxy,
    ):
        agent = make_agent(credentials, [b.ws_url + "/tube"])
        async with agent:
            await agent.wait_registered(5 * T)
            proxy.target = a.port
            ua = UserAgent.websocket(
                f"ws://127.0.0.1:{proxy.port}/asbp", reconnect=FAST, on_event=on_event
            )
            publisher = UserAgent.websocket(b.ws_url + "/asbp", reconnect=None)
            async with ua, publisher:
                channel_id = ua.channel_id
                await until_in_directory(redis_url, "ch", channel_id)
                await ua.subscribe("jobs", type="QUEUE")
                await publisher.request("asbp.publish", b"job", destination="jobs", type="QUEUE")
                delivered = await ua.receive(timeout=5 * T)  # never acknowledged
                assert (delivered.name, delivered.body) == ("asbp.notification", b"job")
                await agent.send(Command({"c": "news", "d": channel_id}, b"m0"))
                assert (await ua.receive(timeout=5 * T)).body == b"m0"
                proxy.cut()
                await until_in_directory(redis_url, "ch", channel_id, present=False)
                await agent.send(Command({"c": "news", "d": channel_id}, b"m1"))
                proxy.target = b.port
                async with asyncio.timeout(10 * T):
                    await reconnected.wait()
                got = [await ua.receive(timeout=5 * T) for _ in range(2)]
                # m1 from the log (counted right), the job again from its queue.
                assert sorted(c.body for c in got) == [b"job", b"m1"]
                (again,) = [c for c in got if c.body == b"job"]
                assert again.get("receipt") != delivered.get("receipt")
                acked = await ua.request(
                    "asbp.ack", destination="jobs", receipt=again.get("receipt"), timeout=5 * T
                )
                assert acked.get("count") == "1"


class RecordingChannel(WebSocketChannel):
    """The SDK's WebSocket transport, noting the name of every Command it sends."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self.sent: list[str | None] = []

    async def send(self, command: Command) -> None:
        self.sent.append(command.name)
        await super().send(command)


async def test_a_subscription_is_made_again_on_a_new_channel(tmp_path: Path) -> None:
    """A lone broker without resume: the reconnected User-Agent has a new Channel, and
    makes its subscriptions again (they did not follow)."""
    reconnected: asyncio.Queue[ChannelEvent] = asyncio.Queue()

    def on_event(event: ChannelEvent) -> None:
        if event.kind is ChannelEventKind.RECONNECTED:
            reconnected.put_nowait(event)

    lone_config = GatewayConfig(data_dir=tmp_path, channels=ChannelLimits(resume="off"))
    async with serve_app_async(create_app(lone_config)) as lone, TcpProxy() as proxy:
        proxy.target = lone.port
        transport = RecordingChannel(f"ws://127.0.0.1:{proxy.port}/asbp", timeout=5 * T)
        ua = UserAgent(transport, reconnect=FAST, on_event=on_event)
        publisher = UserAgent.websocket(lone.ws_url + "/asbp", reconnect=None)
        async with ua, publisher:
            before = ua.channel_id
            # The broker publishes the pattern's subscriber count on every change.
            await publisher.subscribe("/system/stats/topic-consumer-count//kept/.*")
            await ua.subscribe("/kept/.*")
            await ua.subscribe("/gone")
            await ua.unsubscribe("/gone")
            assert (await publisher.receive(timeout=5 * T)).body.endswith(b"#/kept/.*#1")
            transport.sent.clear()
            proxy.cut()
            proxy.target = lone.port
            async with asyncio.timeout(10 * T):
                event = await reconnected.get()
            assert event.channel_id != before and "subscriptions" not in event.kept
            # Counted out with the old Channel, then in again with the new one.
            assert (await publisher.receive(timeout=5 * T)).body.endswith(b"#/kept/.*#0")
            assert (await publisher.receive(timeout=5 * T)).body.endswith(b"#/kept/.*#1")
            await publisher.request("asbp.publish", b"again", destination="/kept/x")
            assert (await ua.receive(timeout=5 * T)).body == b"again"
            assert transport.sent.count("asbp.subscribe") == 1
