"""System topics: consumer counts on change and periodically, fault records.

Sapo-Broker 3, "System Topics": ``/system/stats/topic-consumer-count/<subscription>``
and ``/system/stats/queue-consumer-count/<queue>`` carry ``<broker>#<name>#<count>``;
``/system/faults/<broker>`` carries the faults the broker sent. Both engines.
"""

from __future__ import annotations

import json

import pytest

from gateway.config.model import ChannelLimits, MessagingLimits
from tests.support import T
from tests.support.gateway import BROKER_ID, Gateway, GatewayFactory
from tests.support.messaging import Messenger, RedisServers, start_broker, user

pytestmark = pytest.mark.anyio

TOPIC_COUNTS = "/system/stats/topic-consumer-count/"
QUEUE_COUNTS = "/system/stats/queue-consumer-count/"


async def count(monitor: Messenger, topic: str) -> bytes:
    """The body of the next count published on ``topic``."""
    note = await monitor.take(
        lambda c: c.name == "asbp.notification" and c.get("destination") == topic
    )
    assert (note.get("e"), note.get("type")) == ("UTF-8", "TOPIC")
    return note.body


async def test_topic_consumer_counts_follow_subscriptions(broker: Gateway) -> None:
    monitor = await user(broker)
    await monitor.subscribe(TOPIC_COUNTS + "/news/.*")
    first, second = await user(broker), await user(broker)
    topic = TOPIC_COUNTS + "/news/.*"

    await first.subscribe("/news/.*")
    assert await count(monitor, topic) == f"{BROKER_ID}#/news/.*#1".encode()
    await second.subscribe("/news/.*")
    assert await count(monitor, topic) == f"{BROKER_ID}#/news/.*#2".encode()
    await first.ok("asbp.unsubscribe", destination="/news/.*")
    assert await count(monitor, topic) == f"{BROKER_ID}#/news/.*#1".encode()


async def test_a_closed_channel_is_counted_out(
    redis: RedisServers, make_gateway: GatewayFactory, engine: str
) -> None:
    # A Channel that cannot resume: its subscriptions end with its connection.
    broker = await start_broker(make_gateway, engine, redis, channels=ChannelLimits(resume="off"))
    monitor = await user(broker)
    await monitor.subscribe(TOPIC_COUNTS + ".*")
    peer = await broker.channel()
    await Messenger.of(peer).subscribe("/leaving")
    topic = TOPIC_COUNTS + "/leaving"
    assert await count(monitor, topic) == f"{BROKER_ID}#/leaving#1".encode()

    await peer.close()

    assert await count(monitor, topic) == f"{BROKER_ID}#/leaving#0".encode()


async def test_a_resumable_channel_is_counted_out_when_it_can_no_longer_resume(
    redis: RedisServers, make_gateway: GatewayFactory, engine: str
) -> None:
    # Its topic subscription waits for it, parked (gateway.messaging.service,
    # "Resumed Channels"), until the log would expire: then it is counted out.
    broker = await start_broker(
        make_gateway, engine, redis, channels=ChannelLimits(resume="on", log_max_age=0.5)
    )
    monitor = await user(broker)
    await monitor.subscribe(TOPIC_COUNTS + ".*")
    peer = await broker.channel()
    await Messenger.of(peer).subscribe("/leaving")
    topic = TOPIC_COUNTS + "/leaving"
    assert await count(monitor, topic) == f"{BROKER_ID}#/leaving#1".encode()

    await peer.close()

    assert await count(monitor, topic) == f"{BROKER_ID}#/leaving#0".encode()


async def test_queue_consumer_counts(broker: Gateway) -> None:
    monitor, consumer = await user(broker), await user(broker)
    await monitor.subscribe(QUEUE_COUNTS + ".*")

    await consumer.subscribe("jobs", type="QUEUE")
    assert await count(monitor, QUEUE_COUNTS + "jobs") == f"{BROKER_ID}#jobs#1".encode()
    await consumer.subscribe("vq@/x/.*", type="VIRTUAL_QUEUE")
    assert await count(monitor, QUEUE_COUNTS + "vq@/x/.*") == f"{BROKER_ID}#vq@/x/.*#1".encode()
    await consumer.ok("asbp.unsubscribe", destination="jobs", type="QUEUE")
    assert await count(monitor, QUEUE_COUNTS + "jobs") == f"{BROKER_ID}#jobs#0".encode()


async def test_counts_are_published_again_periodically(
    redis: RedisServers, make_gateway: GatewayFactory, engine: str
) -> None:
    broker = await start_broker(
        make_gateway,
        engine,
        redis,
        messaging=MessagingLimits(system_topic_interval=0.2 * T),
    )
    monitor, subscriber = await user(broker), await user(broker)
    await monitor.subscribe(TOPIC_COUNTS + "/steady")
    await subscriber.subscribe("/steady")
    topic = TOPIC_COUNTS + "/steady"
    expected = f"{BROKER_ID}#/steady#1".encode()

    # Once on the change, then again with no change at all.
    assert await count(monitor, topic) == expected
    assert await count(monitor, topic) == expected


async def test_faults_sent_to_agents_are_recorded_too(broker: Gateway) -> None:
    monitor = await user(broker)
    await monitor.subscribe(f"/system/faults/{BROKER_ID}")
    agent = Messenger.of(await broker.tube("search"))

    fault = await agent.call("asbp.register")  # no names: fault 1203
    assert fault.get("code") == "1203"

    note = await monitor.notification()
    assert note.get("m") == "application/json"
    record = json.loads(note.body)
    assert (record["code"], record["cause"], record["to"], record["agent"]) == (
        1203,
        "asbp.register",
        "application-agent",
        "search",
    )
    assert record["description"] == "Invalid header value"
    assert isinstance(record["ts"], int)
