"""Topics of the redis engine on a Redis Cluster whose primary under a topic's
shard channel dies: its replica takes over, the engine subscribes the channel
again there (gateway/engines/redis/sharded.py) and topic messages flow again.

On a cluster topics are sharded pub/sub (``SSUBSCRIBE``/``SPUBLISH``): a
channel lives on the primary of its slot, so the subscriber must follow it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
import redis
from redis.crc import key_slot

from gateway.engines.base import EngineUnavailable, Message
from gateway.engines.redis.engine import RedisEngine
from gateway.engines.redis.layout import cluster_layout
from gateway.engines.redis.sharded import shard_of
from tests.support import T
from tests.support.engines import Recorder, make_message
from tests.support.redis_cluster import RedisCluster

pytestmark = pytest.mark.anyio


def shard_primary(cluster: RedisCluster, topic: str) -> int:
    """The port of the primary serving ``topic``'s shard channel, which the engine holds."""
    channel = shard_of(list(cluster_layout().topic_channels), topic)
    port = cluster.primary_of(key_slot(channel)).port
    with redis.Redis(port=port) as client:
        subscribed = client.execute_command("PUBSUB", "SHARDNUMSUB", channel)
    assert subscribed[1] >= 1  # the engine's SSUBSCRIBE is there
    return port


def arrived(message: Message) -> Callable[[list[Message]], bool]:
    return lambda items: message.id in {item.id for item in items}


async def test_topics_flow_again_after_the_subscribed_node_dies(tmp_path: Path) -> None:
    with RedisCluster(tmp_path) as cluster:
        engine = RedisEngine(cluster.url, broker_id="b1", sweep_interval=None)
        await engine.start()
        try:
            received: Recorder[Message] = Recorder()
            engine.listen(received)
            await engine.publish(first := make_message("/topic/a"))
            await received.wait_for(arrived(first))
            cluster.server(shard_primary(cluster, "/topic/a")).kill()
            await anyio.to_thread.run_sync(cluster.wait_ready)
            # Published until one arrives: what is published while the subscriber
            # reconnects is lost, as for any pub/sub subscriber that is offline.
            with anyio.fail_after(30 * T):
                while True:
                    try:
                        message = make_message("/topic/a")
                        await engine.publish(message)
                    except EngineUnavailable:
                        continue  # the publishing path fails over too
                    try:
                        await received.wait_for(arrived(message), T)
                    except TimeoutError:
                        continue
                    break
        finally:
            await engine.close()
