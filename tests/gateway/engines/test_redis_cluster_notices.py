"""Wake-ups and delivery notices of the redis engine on a Redis Cluster.

The queue scripts publish them with ``SPUBLISH`` on their queue's shard channels
(``asbp:{q<j>}:wake:Q``, ``asbp:{q<j>}:notices:<broker id>``), never with a
classic ``PUBLISH``, which a cluster repeats to every node (redis/redis#2672).
Each test shows the event reaching another engine *and* counts, on every
primary, the ``PUBLISH`` and ``SPUBLISH`` commands run meanwhile (``INFO
commandstats`` counts the commands a script calls).

A waiter is known to be armed (subscribed, its queue's ``wt`` flag set) from a
keyspace notification of that flag on its primary, not from a pause: only then
does a message need a wake-up to reach it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import pytest
import redis
import redis.asyncio
from redis.crc import key_slot

from gateway.engines.base import DeliveryNotice, NoticeEvent
from gateway.engines.redis.calls import NOTICES, WAKE
from gateway.engines.redis.engine import RedisEngine
from gateway.engines.redis.layout import CLUSTER_SHARDS, cluster_layout, single_layout
from tests.support import T
from tests.support.engines import Recorder, make_message, notify_address
from tests.support.redis_cluster import RedisCluster

pytestmark = pytest.mark.anyio


def test_wake_up_and_notice_channels_are_in_their_shard_s_slot() -> None:
    layout = cluster_layout()
    for queue in ("orders", "a{b}c", "}{", "vq@/topic/.*"):
        channel = layout.wake_channel(queue)
        assert key_slot(channel) == key_slot(layout.queue_keys(queue).block[0].encode())
        assert layout.woken_queue(channel) == queue
    notices = layout.notice_channels("broker-{1}")
    assert len(notices) == CLUSTER_SHARDS
    assert [key_slot(c) for c in notices] == [key_slot(e.encode()) for e in layout.expiries]
    assert notices[0] == f"asbp:{layout.tags[0]}:notices:broker-{{1}}".encode()
    for other in (*notices, *layout.topic_channels, b"asbp:wake:orders", b"asbp:{q0}"):
        assert layout.woken_queue(other) is None
    # One Redis: the names of before, classic PUBLISH.
    single = single_layout()
    assert single.wake_channel("orders") == (WAKE + "orders").encode()
    assert single.woken_queue(b"asbp:wake:a:b") == "a:b"
    assert single.woken_queue(b"asbp:topics") is None
    assert single.notice_channels("b1") == ((NOTICES + "b1").encode(),)


def primaries(cluster: RedisCluster) -> list[int]:
    return [node.port for node in cluster.nodes() if node.primary]


@contextmanager
def publications(cluster: RedisCluster) -> Iterator[dict[str, int]]:
    """Counts of PUBLISH and SPUBLISH on every primary, filled in on exit."""
    ports = primaries(cluster)
    for port in ports:
        with redis.Redis(port=port, socket_timeout=T) as client:
            client.config_resetstat()
    counts: dict[str, int] = {}
    yield counts
    for port in ports:
        with redis.Redis(port=port, socket_timeout=T) as client:
            stats = client.info("commandstats")
        for command in ("publish", "spublish"):
            counts[command] = counts.get(command, 0) + stats.get(f"cmdstat_{command}", {}).get(
                "calls", 0
            )


@asynccontextmanager
async def armed(cluster: RedisCluster, key: str) -> AsyncIterator[asyncio.Event]:
    """An event set when ``key`` (a queue's ``wt`` flag) is SET on its primary."""
    port = cluster.primary_of(key_slot(key.encode())).port
    client = redis.asyncio.Redis(port=port, socket_timeout=10 * T)
    await client.config_set("notify-keyspace-events", "K$")
    pubsub = client.pubsub()
    await pubsub.subscribe(f"__keyspace@0__:{key}")
    event = asyncio.Event()

    async def listen() -> None:
        while True:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=10 * T)
            if message is not None and message["data"] == b"set":
                event.set()

    task = asyncio.get_running_loop().create_task(listen())
    try:
        yield event
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await pubsub.aclose()
        await client.config_set("notify-keyspace-events", "")
        await client.aclose()


async def test_a_wake_up_reaches_a_waiter_on_another_engine_by_spublish(
    redis_cluster: RedisCluster,
) -> None:
    redis_cluster.flush()
    queue = "wake-across"
    waiter = RedisEngine(redis_cluster.url, broker_id="waiter", sweep_interval=None)
    producer = RedisEngine(redis_cluster.url, broker_id="producer", sweep_interval=None)
    await waiter.start()
    await producer.start()
    try:
        flag = cluster_layout().queue_keys(queue).block[1]
        with publications(redis_cluster) as counts:
            async with armed(redis_cluster, flag) as ready:
                # Far longer than the test waits: only a wake-up ends it in time.
                fetching = asyncio.create_task(waiter.fetch(queue, "c", wait=600 * T))
                await asyncio.wait_for(ready.wait(), 10 * T)
            message = make_message(queue)
            await producer.enqueue(message)
            [delivery] = await asyncio.wait_for(fetching, 10 * T)
            assert delivery.message.id == message.id
        assert counts["publish"] == 0
        assert counts["spublish"] >= 1
    finally:
        await producer.close()
        await waiter.close()


async def test_a_notice_reaches_the_publishing_broker_by_spublish(
    redis_cluster: RedisCluster,
) -> None:
    redis_cluster.flush()
    queue = "noticed"
    address = notify_address("publisher")
    publisher = RedisEngine(redis_cluster.url, broker_id="publisher", sweep_interval=None)
    consumer = RedisEngine(redis_cluster.url, broker_id="consumer", sweep_interval=None)
    await publisher.start()
    await consumer.start()
    heard: Recorder[DeliveryNotice] = Recorder()
    elsewhere: Recorder[DeliveryNotice] = Recorder()
    publisher.on_notice(heard)
    consumer.on_notice(elsewhere)
    try:
        with publications(redis_cluster) as counts:
            message = make_message(
                queue, notify=address, notices={NoticeEvent.QUEUED, NoticeEvent.CONSUMED}
            )
            await publisher.enqueue(message)
            [delivery] = await consumer.fetch(queue, "c")
            assert await consumer.ack(queue, [delivery.receipt]) == 1
            await heard.wait_count(2)
        assert [n.event for n in heard.items] == [NoticeEvent.QUEUED, NoticeEvent.CONSUMED]
        assert elsewhere.items == []
        assert counts["publish"] == 0
        assert counts["spublish"] == 2
    finally:
        await consumer.close()
        await publisher.close()
