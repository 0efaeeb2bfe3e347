"""A resumed WebSocket Channel keeps its topic and queue subscriptions (docs/protocol.md,
"Resuming a Channel"; gateway.messaging.service, "Resumed Channels").

Real brokers (Hypercorn in this process): two on one private redis-server, the
Channel resuming at the other broker, and a lone broker on the ``memory``
engine, the Channel resuming there. The User-Agents are plain ``websockets``
clients, so the test sees every frame the resumed Channel gets (a duplicate
included). The drop is observed, not slept on: a watcher subscribed to the
queue's ``/system/stats/queue-consumer-count/…`` topic hears the count fall to
0 when the Channel's connection is gone.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest
from websockets.asyncio.client import ClientConnection

from asbp import Command, FaultCode
from asbp.fault_commands import read_fault
from gateway.app import create_app
from gateway.config.model import ChannelLimits, GatewayConfig
from tests.gateway.engines._broker_process import BrokerProcess, abandon, broker_process
from tests.support import RedisServer, RunningServer, T, serve_app_async
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
from tests.support.messaging import security

pytestmark = pytest.mark.anyio

LEASE = 1.5
PATTERN = "/news/.*"
QUEUE = "jobs"
COUNT_TOPIC = f"/system/stats/queue-consumer-count/{QUEUE}"


def config(tmp_path: Path, broker_id: str, redis_url: str | None) -> GatewayConfig:
    directory = tmp_path / broker_id
    directory.mkdir()
    bus = {"engine": "redis", "redis_url": redis_url, "bus_lease": LEASE} if redis_url else {}
    return GatewayConfig(
        data_dir=directory,
        broker_id=broker_id,
        channels=ChannelLimits(resume="on"),
        **bus,  # type: ignore[arg-type]  # engine, redis_url, bus_lease
    )


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("resume-subscriptions-redis")) as server:
        yield server


@contextlib.asynccontextmanager
async def brokers(
    tmp_path: Path, redis_url: str | None, *names: str
) -> AsyncIterator[list[RunningServer]]:
    async with contextlib.AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(
                serve_app_async(create_app(config(tmp_path, name, redis_url)))
            )
            for name in names
        ]


async def call(connection: ClientConnection, text: str, command_id: int) -> None:
    """Send ``text`` (a Command with ``u=command_id``) and wait for its acceptance;
    unsolicited frames that come first must not (the callers read them after)."""
    await connection.send(text)
    answer = await frame(connection)
    assert (answer.name, answer.command_id) == ("asbp.accepted", command_id), answer


async def consumer_count(watcher: ClientConnection, broker_id: str, count: int) -> None:
    """Wait until ``broker_id`` publishes ``count`` consumers of the queue."""
    while True:
        heard = await frame(watcher)
        assert heard.name == "asbp.notification", heard
        if heard.body.decode() == f"{broker_id}#{QUEUE}#{count}":
            return


async def notifications(connection: ClientConnection, how_many: int) -> list[Command]:
    got = [await frame(connection) for _ in range(how_many)]
    assert all(each.name == "asbp.notification" for each in got), got
    return got


def bodies(got: list[Command], kind: str) -> list[str]:
    return [each.body.decode() for each in got if each.get("type") == kind]


async def subscriptions_follow(
    first: RunningServer, second: RunningServer, first_id: str, redis_url: str | None
) -> None:
    """A Channel at ``first`` subscribed to a topic pattern and a queue drops; what is
    published meanwhile reaches it once, in order, when it resumes at ``second``."""
    watcher, _, _ = await open_resumable(first.ws_url + "/asbp")
    await call(watcher, f"c=asbp.subscribe,destination={COUNT_TOPIC},u=1;", 1)
    publisher, _, _ = await open_resumable(second.ws_url + "/asbp")
    connection, channel_id, secret = await open_resumable(first.ws_url + "/asbp")
    if redis_url is not None:
        await until_in_directory(redis_url, "ch", channel_id)
    await call(connection, f"c=asbp.subscribe,destination={PATTERN},u=1;", 1)
    await call(connection, f"c=asbp.subscribe,destination={QUEUE},type=QUEUE,u=2;", 2)
    await consumer_count(watcher, first_id, 1)
    # A queue message delivered and never acknowledged before the drop.
    await call(publisher, f"c=asbp.publish,destination={QUEUE},type=QUEUE,u=1;job-0", 1)
    (unacknowledged,) = await notifications(connection, 1)
    assert (unacknowledged.body, unacknowledged.get("deliveries")) == (b"job-0", "1")
    await connection.close()
    await consumer_count(watcher, first_id, 0)  # the drop is seen: its queue let go

    # Published while it is away: three matching topics, one that does not, a job.
    published = [("/news/a", "n1"), ("/other", "x"), ("/news/b", "n2"), ("/news/c", "n3")]
    for number, (topic, body) in enumerate(published, start=2):
        await call(publisher, f"c=asbp.publish,destination={topic},u={number};{body}", number)
    await call(publisher, f"c=asbp.publish,destination={QUEUE},type=QUEUE,u=9;job-1", 9)

    # It resumes at the other broker without subscribing again (it got three frames).
    resumed, answer = await resume_at(second.ws_url + "/asbp", channel_id, secret, received=3)
    assert answer.name == "asbp.resumed", answer
    assert answer.get("kept") == ("groups", "subscriptions")  # no Subjects on this bus
    got = await notifications(resumed, 5)
    assert bodies(got, "TOPIC") == ["n1", "n2", "n3"]  # each once, in order
    assert {each.get("subscription") for each in got if each.get("type") == "TOPIC"} == {PATTERN}
    jobs = {each.body.decode(): each for each in got if each.get("type") == "QUEUE"}
    assert sorted(jobs) == ["job-0", "job-1"]
    # The unacknowledged one came back (delivered again, each release counting one;
    # a new receipt), and the new receipt acknowledges it.
    assert int(str(jobs["job-0"].get("deliveries"))) >= 2
    assert jobs["job-0"].get("receipt") != unacknowledged.get("receipt")
    for number, job in enumerate(jobs.values(), start=3):
        receipt = job.get("receipt")
        await call(resumed, f"c=asbp.ack,destination={QUEUE},receipt={receipt},u={number};", number)

    # From now on each publication arrives once: the parked subscription at the first
    # broker has ended (a duplicate would come before the last one).
    for number, body in enumerate(["n4", "n5"], start=20):
        await call(publisher, f"c=asbp.publish,destination=/news/{body},u={number};{body}", number)
    assert bodies(await notifications(resumed, 2), "TOPIC") == ["n4", "n5"]
    await call(resumed, f"c=asbp.unsubscribe,destination={PATTERN},u=30;", 30)
    await call(publisher, "c=asbp.publish,destination=/news/z,u=31;z", 31)
    await call(publisher, f"c=asbp.publish,destination={QUEUE},type=QUEUE,u=32;job-2", 32)
    (last,) = await notifications(resumed, 1)
    assert (last.body, last.get("type")) == (b"job-2", "QUEUE")  # not /news/z
    for each in (resumed, publisher, watcher):
        await each.close()


async def test_subscriptions_follow_a_channel_resumed_at_another_broker(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    redis_url = redis_server.url
    await flush(redis_url)
    async with brokers(tmp_path, redis_url, "broker-a", "broker-b") as (a, b):
        await subscriptions_follow(a, b, "broker-a", redis_url)


async def test_subscriptions_follow_a_channel_resumed_at_its_lone_broker(tmp_path: Path) -> None:
    async with brokers(tmp_path, None, "lone") as (lone,):
        await subscriptions_follow(lone, lone, "lone", None)


async def test_parked_topic_subscriptions_end_when_the_log_would(tmp_path: Path) -> None:
    short = dataclasses.replace(
        config(tmp_path, "lone", None), channels=ChannelLimits(resume="on", log_max_age=1.0)
    )
    async with serve_app_async(create_app(short)) as lone:
        watcher, _, _ = await open_resumable(lone.ws_url + "/asbp")
        count_topic = "/system/stats/topic-consumer-count/" + PATTERN
        await call(watcher, f"c=asbp.subscribe,destination={count_topic},u=1;", 1)
        connection, _, _ = await open_resumable(lone.ws_url + "/asbp")
        await call(connection, f"c=asbp.subscribe,destination={PATTERN},u=1;", 1)
        assert (await frame(watcher)).body == f"lone#{PATTERN}#1".encode()
        await connection.close()
        # Parked, it still counts; once log_max_age has passed it ends.
        assert (await frame(watcher, timeout=10 * T)).body == f"lone#{PATTERN}#0".encode()
        await watcher.close()


async def test_subscriptions_follow_a_channel_whose_broker_was_killed(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Two broker processes; the one holding the Channel is SIGKILLed. The broker it
    resumes on subscribes it again from the record alone; the job leased to it at the
    dead broker comes back once that lease runs out (``ack_timeout``)."""
    redis_url = redis_server.url
    await flush(redis_url)
    settings = f'bus_lease = {LEASE}\n[channels]\nresume = "on"\n'

    def start(name: str) -> contextlib.AbstractAsyncContextManager[BrokerProcess]:
        return broker_process(
            redis_url, tmp_path / name, ack_timeout=1.0, prefetch=8, settings=settings
        )

    async with start("a") as a, start("b") as b:
        publisher, _, _ = await open_resumable(b.url)
        connection, channel_id, secret = await open_resumable(a.url)
        await until_in_directory(redis_url, "ch", channel_id)
        await call(connection, f"c=asbp.subscribe,destination={PATTERN},u=1;", 1)
        await call(connection, f"c=asbp.subscribe,destination={QUEUE},type=QUEUE,u=2;", 2)
        await kept_holds(redis_url, channel_id, f'"n":"{QUEUE}"'.encode())
        await call(publisher, f"c=asbp.publish,destination={QUEUE},type=QUEUE,u=1;job-0", 1)
        (unacknowledged,) = await notifications(connection, 1)
        holder = await holder_of(redis_url, channel_id)
        await a.kill()
        abandon(connection)
        await until(redis_url, f"alive:{holder}", lambda client: lease_gone(client, holder))
        # No broker holds its topic subscription now: this publication reaches nobody
        # (topics are at most once); the job waits in its queue.
        await call(publisher, "c=asbp.publish,destination=/news/unheard,u=2;unheard", 2)
        await call(publisher, f"c=asbp.publish,destination={QUEUE},type=QUEUE,u=3;job-1", 3)

        resumed, answer = await resume_at(b.url, channel_id, secret, received=3)
        assert answer.name == "asbp.resumed", answer
        assert answer.get("kept") == ("groups", "subscriptions")
        jobs = {each.body.decode(): each for each in await notifications(resumed, 2)}
        assert sorted(jobs) == ["job-0", "job-1"]
        assert jobs["job-0"].get("receipt") != unacknowledged.get("receipt")
        # Its topic pattern was subscribed again at B, from the record.
        await call(publisher, "c=asbp.publish,destination=/news/heard,u=4;heard", 4)
        (heard,) = await notifications(resumed, 1)
        assert (heard.body, heard.get("subscription")) == (b"heard", PATTERN)
        for each in (resumed, publisher):
            await each.close()


async def test_publications_during_the_resume_arrive_once_and_in_order(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """A publisher keeps publishing while the Channel drops and resumes at the other
    broker: the handover between the parked subscription and the new one loses
    nothing and repeats nothing."""
    redis_url = redis_server.url
    await flush(redis_url)
    async with brokers(tmp_path, redis_url, "broker-a", "broker-b") as (a, b):
        publisher, _, _ = await open_resumable(b.ws_url + "/asbp")
        connection, channel_id, secret = await open_resumable(a.ws_url + "/asbp")
        await until_in_directory(redis_url, "ch", channel_id)
        await call(connection, f"c=asbp.subscribe,destination={PATTERN},u=1;", 1)
        await connection.close()
        await until_in_directory(redis_url, "ch", channel_id, present=False)
        resumed_at = anyio.Event()
        total = 0

        async def publish() -> None:
            nonlocal total
            # Until well after the resume: each publication awaited, so they are ordered.
            after = 0
            while after < 200:
                total += 1
                await call(publisher, f"c=asbp.publish,destination=/news/n,u=1;{total}", 1)
                if resumed_at.is_set():
                    after += 1

        async with anyio.create_task_group() as group:
            group.start_soon(publish)
            for _ in range(50):  # some while it is away
                await anyio.wait_all_tasks_blocked()
            resumed, answer = await resume_at(b.ws_url + "/asbp", channel_id, secret, received=1)
            assert answer.name == "asbp.resumed", answer
            resumed_at.set()
        got = [int(each.body) for each in await notifications(resumed, total)]
        assert got == list(range(1, total + 1))
        # And nothing more (a duplicate would be in the way of the answer).
        await resumed.send("c=asbp.ping,u=9;")
        assert (await frame(resumed)).name == "asbp.pong"
        for each in (resumed, publisher):
            await each.close()


#: Broker B's access-control lists: nobody consumes the queue ``jobs`` there.
NO_JOBS = """
[security]
[[security.policies.default.entries]]
action = "DENY"
types = ["QUEUE"]
destination = 'jobs'
privileges = ["READ"]
condition = { always = true }
"""


async def test_a_subscription_the_new_broker_denies_is_a_fault_and_left_out(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Subscribing again is checked as asbp.subscribe is: where the queue may not be
    read, the resumed Channel hears 3201 for it, and keeps the rest."""
    redis_url = redis_server.url
    await flush(redis_url)
    strict = dataclasses.replace(config(tmp_path, "broker-b", redis_url), acl=security(NO_JOBS))
    async with (
        serve_app_async(create_app(config(tmp_path, "broker-a", redis_url))) as a,
        serve_app_async(create_app(strict)) as b,
    ):
        connection, channel_id, secret = await open_resumable(a.ws_url + "/asbp")
        await until_in_directory(redis_url, "ch", channel_id)
        await call(connection, f"c=asbp.subscribe,destination={PATTERN},u=1;", 1)
        await call(connection, f"c=asbp.subscribe,destination={QUEUE},type=QUEUE,u=2;", 2)
        await kept_holds(redis_url, channel_id, f'"n":"{QUEUE}"'.encode())
        await connection.close()
        await until_in_directory(redis_url, "ch", channel_id, present=False)
        resumed, answer = await resume_at(b.ws_url + "/asbp", channel_id, secret, received=2)
        assert answer.name == "asbp.resumed", answer
        fault = read_fault(await frame(resumed))
        assert (fault.code, fault.cause) == (FaultCode.ACCESS_DENIED, "asbp.subscribe")
        assert repr(QUEUE) in fault.message
        # The topic pattern followed; the queue did not, and leaves the record.
        await kept_holds(redis_url, channel_id, f'"n":"{QUEUE}"'.encode(), present=False)
        publisher, _, _ = await open_resumable(b.ws_url + "/asbp")
        await call(publisher, "c=asbp.publish,destination=/news/x,u=1;x", 1)
        (heard,) = await notifications(resumed, 1)
        assert heard.body == b"x"
        for each in (resumed, publisher):
            await each.close()
