"""Sharded pub/sub on a real Redis Cluster (gateway/engines/redis/sharded.py):
channels spread over every primary, and subscriptions that follow their slot
when it migrates (an unannounced ``sunsubscribe``) or its primary fails over.

Messages are published with ``SPUBLISH`` by a second, plain cluster client, as
another broker would; each test waits on the messages themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
from redis.asyncio.cluster import RedisCluster as ClusterClient
from redis.crc import key_slot

from gateway.engines.redis.connection import connect
from gateway.engines.redis.sharded import ShardedSubscriber, shard_channels, shard_of
from tests.support import T
from tests.support.redis_cluster import RedisCluster

pytestmark = pytest.mark.anyio


class Inbox:
    """What a subscriber received, and an event per arrival."""

    def __init__(self) -> None:
        self.messages: list[tuple[bytes, bytes]] = []
        self.reconnects = 0
        self._arrived = asyncio.Event()
        self._reconnected = asyncio.Event()

    def on_message(self, channel: bytes, data: bytes) -> None:
        self.messages.append((channel, data))
        self._arrived.set()

    def on_reconnect(self) -> None:
        self.reconnects += 1
        self._reconnected.set()

    async def wait_reconnected(self) -> None:
        """Return once the subscriber said it placed its channels again: a message
        can arrive on a placed channel before the subscriber says so."""
        await asyncio.wait_for(self._reconnected.wait(), 10 * T)

    async def wait_count(self, count: int) -> None:
        async with asyncio.timeout(10 * T):
            while len(self.messages) < count:
                self._arrived.clear()
                await self._arrived.wait()

    async def until(self, channel: bytes, data: bytes, publisher: ClusterClient) -> None:
        """Publish ``data`` on ``channel`` until it arrives: a subscription being moved
        misses what is published meanwhile, as pub/sub does."""
        async with asyncio.timeout(30 * T):
            while (channel, data) not in self.messages:
                self._arrived.clear()
                await publisher.execute_command("SPUBLISH", channel, data)
                try:
                    async with asyncio.timeout(0.2 * T):
                        await self._arrived.wait()
                except TimeoutError:
                    continue


async def cluster_client(url: str) -> AsyncIterator[ClusterClient]:
    client = connect(url, connect_timeout=T, command_timeout=5 * T)
    assert isinstance(client, ClusterClient)
    await client.initialize()
    try:
        yield client
    finally:
        await client.aclose()


def test_shard_channels_are_in_different_slots_and_a_name_keeps_its_channel() -> None:
    channels = shard_channels("asbp:topics", 16)
    assert len({key_slot(channel) for channel in channels}) == 16
    assert channels == shard_channels("asbp:topics", 16)  # the same on every broker
    assert shard_of(channels, "/topic/a") == shard_of(channels, b"/topic/a")
    assert len({shard_of(channels, f"/topic/{n}") for n in range(200)}) == 16


async def test_shard_channels_spread_over_every_primary(redis_cluster: RedisCluster) -> None:
    channels = shard_channels("test:spread", 16)
    owners = {redis_cluster.primary_of(key_slot(channel)).port for channel in channels}
    assert len(owners) == 3
    inbox = Inbox()
    async for client in cluster_client(redis_cluster.url):
        subscriber = ShardedSubscriber(client, inbox.on_message, inbox.on_reconnect)
        async for publisher in cluster_client(redis_cluster.url):
            try:
                await subscriber.start(channels)
                for channel in channels:
                    # Confirmed before start returned: the first SPUBLISH arrives.
                    assert await publisher.execute_command("SPUBLISH", channel, b"x") == 1
                await inbox.wait_count(len(channels))
                assert {channel for channel, _ in inbox.messages} == set(channels)
                # Joined twice, left once: still subscribed; left again: not wanted.
                await subscriber.join(channels[0])
                subscriber.leave(channels[0])
                assert subscriber.wants(channels[0])
                await inbox.until(channels[0], b"still", publisher)
                subscriber.leave(channels[0])
                assert not subscriber.wants(channels[0])
            finally:
                await subscriber.close()


async def test_a_subscription_follows_its_slot_to_another_primary(tmp_path: Path) -> None:
    with RedisCluster(tmp_path) as cluster:
        (channel,) = shard_channels("test:moving", 1)
        slot = key_slot(channel)
        source = cluster.primary_of(slot)
        target = next(n for n in cluster.nodes() if n.primary and n.node_id != source.node_id)
        inbox = Inbox()
        async for client in cluster_client(cluster.url):
            subscriber = ShardedSubscriber(client, inbox.on_message, inbox.on_reconnect)
            async for publisher in cluster_client(cluster.url):
                try:
                    await subscriber.start([channel])
                    await inbox.until(channel, b"before", publisher)
                    with redis.Redis(port=target.port) as new, redis.Redis(port=source.port) as old:
                        new.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
                        old.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id)
                        for node in cluster.nodes():
                            if node.primary:
                                with redis.Redis(port=node.port) as each:
                                    each.execute_command(
                                        "CLUSTER", "SETSLOT", slot, "NODE", target.node_id
                                    )
                    await publisher.nodes_manager.initialize()
                    await inbox.until(channel, b"after", publisher)
                    await inbox.wait_reconnected()
                    assert subscriber.replaced >= 1
                finally:
                    await subscriber.close()


async def test_a_subscription_survives_its_primary_failing_over(tmp_path: Path) -> None:
    with RedisCluster(tmp_path) as cluster:
        (channel,) = shard_channels("test:failover", 1)
        primary = cluster.primary_of(key_slot(channel))
        inbox = Inbox()
        async for client in cluster_client(cluster.url):
            subscriber = ShardedSubscriber(client, inbox.on_message, inbox.on_reconnect)
            async for publisher in cluster_client(cluster.url):
                try:
                    await subscriber.start([channel])
                    await inbox.until(channel, b"before", publisher)
                    await asyncio.to_thread(cluster.server(primary.port).kill)
                    await asyncio.to_thread(cluster.wait_ready)
                    await publisher.nodes_manager.initialize()
                    await inbox.until(channel, b"after", publisher)
                    await inbox.wait_reconnected()
                finally:
                    await subscriber.close()


class _Lost(logging.Handler):
    """Records the sharded subscriber's warnings; sets ``event`` on the first."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self.event = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self.event.set()


@contextlib.contextmanager
def sharded_warnings() -> Iterator[_Lost]:
    handler = _Lost()
    log = logging.getLogger("gateway.engines.redis.sharded")
    log.addHandler(handler)
    try:
        yield handler
    finally:
        log.removeHandler(handler)


async def test_an_idle_subscription_outlives_the_command_timeout(
    redis_cluster: RedisCluster,
) -> None:
    """A shard channel silent for longer than the connection's socket_timeout (the
    command timeout) stays subscribed: before, the read fell back to that timeout,
    raised, and the link was dropped and placed again, losing what came meanwhile."""
    command_timeout = 0.2 * T
    (channel,) = shard_channels("test:idle", 1)
    quiet, pinging = Inbox(), Inbox()
    client = connect(redis_cluster.url, connect_timeout=T, command_timeout=command_timeout)
    assert isinstance(client, ClusterClient)
    # One never PINGs within the idle period (the default interval); the other
    # PINGs several times in it and hears each ``pong``.
    subscribers = [
        ShardedSubscriber(client, quiet.on_message, quiet.on_reconnect),
        ShardedSubscriber(
            client, pinging.on_message, pinging.on_reconnect, health_interval=command_timeout / 2
        ),
    ]
    with sharded_warnings() as lost:
        async for publisher in cluster_client(redis_cluster.url):
            try:
                for subscriber in subscribers:
                    await subscriber.start([channel])
                # The idle period is the scenario under test, not a synchronisation:
                # nothing happens in it unless the links time out.
                await asyncio.sleep(5 * command_timeout)
                assert lost.messages == []
                assert [s.replaced for s in subscribers] == [0, 0]
                # Both still subscribed where they were: the first SPUBLISH reaches both.
                assert await publisher.execute_command("SPUBLISH", channel, b"after") == 2
                await quiet.wait_count(1)
                await pinging.wait_count(1)
                assert quiet.messages == pinging.messages == [(channel, b"after")]
                assert quiet.reconnects == pinging.reconnects == 0
            finally:
                for subscriber in subscribers:
                    await subscriber.close()
                await client.aclose()


async def test_a_primary_that_stops_answering_pings_is_left(tmp_path: Path) -> None:
    """A primary that is there but silent (SIGSTOP): after one interval of silence
    and one unanswered PING the link counts as lost, and the channel is placed again
    once the primary answers."""
    with RedisCluster(tmp_path) as cluster:
        (channel,) = shard_channels("test:silent", 1)
        primary = cluster.server(cluster.primary_of(key_slot(channel)).port)
        inbox = Inbox()
        async for client in cluster_client(cluster.url):
            subscriber = ShardedSubscriber(
                client, inbox.on_message, inbox.on_reconnect, health_interval=0.1 * T
            )
            async for publisher in cluster_client(cluster.url):
                with sharded_warnings() as lost:
                    try:
                        await subscriber.start([channel])
                        await inbox.until(channel, b"before", publisher)
                        os.kill(primary.pid, signal.SIGSTOP)
                        try:
                            await asyncio.wait_for(lost.event.wait(), 10 * T)
                        finally:
                            os.kill(primary.pid, signal.SIGCONT)
                        assert "no reply to PING" in lost.messages[0]
                        await asyncio.to_thread(cluster.wait_ready)
                        await publisher.nodes_manager.initialize()
                        await inbox.until(channel, b"after", publisher)
                        await inbox.wait_reconnected()
                    finally:
                        await subscriber.close()
