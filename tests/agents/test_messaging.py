"""The messaging client against a real broker (memory engine): publish, poll, ack, subscribe."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agents import AgentError, ConnectionLost, FaultError, NotConnected
from agents.messaging import Message, MessagingClient, Publication, publish_all
from asbp import Command, FaultCode
from gateway.app import create_app
from gateway.config.model import GatewayConfig, MessagingLimits
from tests.support import RunningServer, T
from tests.support.servers import serve_app_async

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[RunningServer]:
    config = GatewayConfig(
        broker_id="broker-m",
        data_dir=tmp_path,
        messaging=MessagingLimits(ack_timeout=60.0),
    )
    async with serve_app_async(create_app(config)) as running:
        yield running


def client(broker: RunningServer) -> MessagingClient:
    return MessagingClient.websocket(broker.ws_url + "/asbp", timeout=5 * T)


async def test_published_queue_messages_are_polled_and_acknowledged(
    broker: RunningServer,
) -> None:
    async with client(broker) as bus:
        ids = await publish_all(
            bus,
            (
                Publication("jobs", f"job {n}", type="QUEUE", priority=5, media_type="text/plain")
                for n in range(40)
            ),
            window=8,
        )
        assert len(set(ids)) == 40
        polled: list[Message] = []
        while len(polled) < 40:
            batch = await bus.poll("jobs", count=16, wait=0, timeout=5 * T)
            assert batch
            polled += batch
        assert [m.id for m in polled] == ids
        first = polled[0]
        assert first.payload == b"job 0"
        assert first.destination == first.subscription == "jobs"
        assert first.type == "QUEUE"
        assert first.priority == 5
        assert first.deliveries == 1
        assert first.keys == {"e": "UTF-8", "m": "text/plain"}
        assert first.expiration is not None and first.expiration > first.timestamp
        receipts = [m.receipt for m in polled if m.receipt is not None]
        assert await bus.ack("jobs", receipts, timeout=5 * T) == 40
        assert await bus.poll("jobs", count=16, wait=0, timeout=5 * T) == []


async def test_closing_releases_polled_messages_for_the_next_consumer(
    broker: RunningServer,
) -> None:
    async with client(broker) as bus:
        message_id = await bus.publish(Publication("work", b"x", type="QUEUE"))
        [taken] = await bus.poll("work", timeout=5 * T)
        assert taken.id == message_id
    async with client(broker) as bus:
        [again] = await bus.poll("work", wait=5 * T, timeout=5 * T)
        assert (again.id, again.deliveries) == (message_id, 2)
        assert again.receipt is not None
        assert taken.receipt is not None
        # The first lease died with its Channel: only the new receipt counts.
        assert await bus.ack("work", [taken.receipt, again.receipt]) == 1


async def test_a_long_ack_goes_as_several_commands(broker: RunningServer) -> None:
    async with client(broker) as bus:
        await publish_all(bus, [Publication("many", b"", type="QUEUE")] * 800)
        receipts: list[str] = []
        while len(receipts) < 800:
            receipts += [m.receipt or "" for m in await bus.poll("many", count=16)]
        assert sum(len(r) for r in receipts) > 8 * 1024  # more than one header holds
        assert await bus.ack("many", receipts) == 800


async def test_topic_subscribers_get_pushed_notifications(broker: RunningServer) -> None:
    async with client(broker) as subscriber, client(broker) as publisher:
        await subscriber.subscribe("/news/.*")
        await subscriber.subscribe("keep@/news/.*", type="VIRTUAL_QUEUE")
        await subscriber.unsubscribe("keep@/news/.*", type="VIRTUAL_QUEUE")
        message_id = await publisher.publish(Publication("/news/sport", b"goal"))
        pushed = await subscriber.receive(timeout=5 * T)
        assert (pushed.id, pushed.payload, pushed.subscription) == (
            message_id,
            b"goal",
            "/news/.*",
        )
        assert pushed.receipt is None
        # The virtual queue outlived its subscription and kept a copy.
        [kept] = await publisher.poll("keep@/news/.*", wait=5 * T, timeout=5 * T)
        assert (kept.id, kept.destination, kept.type) == (
            message_id,
            "/news/sport",
            "VIRTUAL_QUEUE",
        )
        assert subscriber.pushed() == []


async def test_refusals_are_fault_errors_and_stop_a_bulk_publish(broker: RunningServer) -> None:
    async with client(broker) as bus:
        with pytest.raises(FaultError) as caught:
            await bus.publish(Publication("q@x", b"", type="QUEUE"))
        assert caught.value.fault is FaultCode(2001)
        with pytest.raises(FaultError):
            await publish_all(
                bus, [Publication("ok", b"", type="QUEUE"), Publication("", b"", type="QUEUE")]
            )
        with pytest.raises(ValueError, match="window"):
            await publish_all(bus, [], window=0)
        # The Channel is still usable after the refusals.
        assert len(await bus.poll("ok", wait=5 * T, timeout=5 * T)) == 1


async def test_a_malformed_notification_is_refused() -> None:
    with pytest.raises(AgentError, match="malformed"):
        Message.from_command(Command({"c": "asbp.notification", "destination": "x"}))


async def test_a_bulk_publish_stops_at_the_first_refusal(broker: RunningServer) -> None:
    async def publications() -> AsyncIterator[Publication]:
        yield Publication("a@b", b"", type="QUEUE")  # refused: '@' in a queue name
        for _ in range(5):
            yield Publication("after", b"", type="QUEUE", ttl=60)

    async with client(broker) as bus:
        with pytest.raises(FaultError):
            await publish_all(bus, publications(), window=1)
        # Nothing after the refusal was sent.
        assert await bus.poll("after", count=16, wait=T / 10, timeout=5 * T) == []


async def test_the_client_life_cycle_is_checked(broker: RunningServer) -> None:
    with pytest.raises(ValueError, match="max_pushed"):
        MessagingClient.websocket(broker.ws_url + "/asbp", max_pushed=0)
    bus = client(broker)
    with pytest.raises(NotConnected):
        await bus.poll("q")
    async with bus:
        with pytest.raises(AgentError, match="connects once"):
            await bus.connect()
        waiting = asyncio.create_task(bus.poll("q", wait=20, timeout=5 * T))
        await bus.subscribe("/x")  # answered after the poll started: it is waiting now
    with pytest.raises(ConnectionLost, match="before the answer"):
        await waiting
    with pytest.raises(ConnectionLost):
        await bus.poll("q")
    with pytest.raises(ConnectionLost):
        await bus.receive(timeout=5 * T)
