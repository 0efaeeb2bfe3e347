"""Topics of the redis engine on a Redis Cluster whose node under the engine's
pub/sub connection dies: the engine subscribes again on another node and topic
messages flow again (gateway/engines/redis/connection.py, broadcast_connection).

Classic ``PUBLISH`` reaches every node of a cluster, so any node serves a
subscriber; each reconnection tries the next one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
import redis

from gateway.engines.base import EngineUnavailable, Message
from gateway.engines.redis.engine import RedisEngine
from tests.support import T
from tests.support.engines import Recorder, make_message
from tests.support.redis_cluster import RedisCluster

pytestmark = pytest.mark.anyio


def pubsub_node(cluster: RedisCluster) -> int:
    """The port of the node holding the engine's subscribed connection."""
    found = []
    for port in cluster.ports:
        if not cluster.server(port).running:
            continue
        with redis.Redis(port=port) as client:
            if client.client_list(_type="pubsub"):
                found.append(port)
    (port,) = found
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
            cluster.server(pubsub_node(cluster)).kill()
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
