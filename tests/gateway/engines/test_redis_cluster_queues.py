"""Queues of the redis engine on a Redis Cluster (gateway/engines/redis/layout.py).

- The layout: each queue's keys in one slot, the shards in distinct slots spread
  over every primary, the topic shard channels too; one Redis keeps its names.
- A publication feeding virtual queues of several shards copies once into each.
- The primary of a queue's shard is SIGKILLed while one engine enqueues and
  another fetches and acknowledges: its replica takes over, and every message
  whose ``enqueue`` returned (``asbp.accepted``) is delivered; none is lost.
  Enqueues made during the failover either return or fail (EngineUnavailable),
  never hang, and enqueues succeed again afterwards; once a WAIT on the promoted
  replica (alone now) timed out, the next ones are answered at once.
- The same load while the queue's slot moves to another primary
  (``MIGRATING``/``IMPORTING``, ``MIGRATE`` a few keys at a time, ``SETSLOT
  NODE``): every accepted message is delivered.
- An engine remembers a bounded number of registered queues.

The fault test starts a six-node cluster of its own (it breaks it); the others
use the session's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from gateway.engines.base import EngineLimits, EngineUnavailable, QueueLimitReached
from gateway.engines.redis.calls import EXPIRY, REGISTRY
from gateway.engines.redis.connection import batcher, connect
from gateway.engines.redis.engine import RedisEngine
from gateway.engines.redis.layout import (
    CLUSTER_REGISTRY,
    CLUSTER_SHARDS,
    TOPIC_SHARDS,
    cluster_layout,
    single_layout,
)
from gateway.engines.redis.sharded import shard_of
from tests.support import T
from tests.support.engines import make_message
from tests.support.redis_cluster import RedisCluster

pytestmark = pytest.mark.anyio

QUEUE = "orders"
#: Messages accepted before the kill, and again after the replica took over.
BEFORE = 200
AFTER = 100
#: Enqueues kept in flight by the producer.
WINDOW = 20


def test_each_queue_s_keys_share_one_slot_and_shards_spread() -> None:
    layout = cluster_layout()
    for name in ("orders", "a{b}c", "}{", "x" * 200, "vq@/topic/.*"):
        keys = layout.queue_keys(name)
        slots = {key_slot(key.encode()) for key in (*keys.fetch, *keys.release, *keys.sweep)}
        assert len(slots) == 1, name
        assert keys.registry is None and keys.wait_replicas
    shard_slots = [key_slot(index.encode()) for index in layout.expiries]
    assert len(set(shard_slots)) == CLUSTER_SHARDS
    # A 3-primary cluster splits the slots in three ranges: each gets shards.
    thirds = {slot * 3 // 16384 for slot in shard_slots}
    assert thirds == {0, 1, 2}
    assert len({key_slot(channel) for channel in layout.topic_channels}) == TOPIC_SHARDS
    assert layout.registry == CLUSTER_REGISTRY
    # Queues spread over the shards rather than pile on one, names that differ in
    # one character too (a CRC would put vq0@/topic/.* and vq1@/topic/.* together).
    used = {layout.shard(f"queue-{n}") for n in range(1000)}
    assert len(used) == CLUSTER_SHARDS
    assert len({layout.shard(f"vq{n}@/topic/.*") for n in range(12)}) >= 8
    assert len({shard_of(list(layout.topic_channels), f"/topic/{c}") for c in "abcdefgh"}) >= 5


def test_one_redis_keeps_its_key_names() -> None:
    layout = single_layout()
    keys = layout.queue_keys(QUEUE)
    assert keys.block[2] == f"asbp:q:{QUEUE}:s0"
    assert keys.expiry == EXPIRY and keys.registry == REGISTRY and not keys.wait_replicas
    assert layout.shard("anything") == 0


async def test_a_publication_copies_once_into_virtual_queues_of_every_shard(
    redis_cluster: RedisCluster,
) -> None:
    redis_cluster.flush()
    layout = cluster_layout()
    names = [f"vq{n}" for n in range(12)]
    assert len({layout.shard(name) for name in names}) > 3  # several shards, so several slots
    engine = RedisEngine(redis_cluster.url, broker_id="b1", sweep_interval=None)
    await engine.start()
    try:
        for name in names:
            await engine.declare_virtual_queue(name, "/topic/.*")
        message = make_message("/topic/x", payload=b"copy")
        await engine.publish(message)
        for name in names:
            full = f"{name}@/topic/.*"
            got = await engine.fetch(full, "c", count=10)
            assert [d.message.id for d in got] == [message.id], full
            assert await engine.ack(full, [got[0].receipt]) == 1
        assert sorted(await engine.queues()) == sorted(f"{n}@/topic/.*" for n in names)
    finally:
        await engine.close()


async def test_concurrent_publications_share_the_version_read_and_the_copies(
    redis_cluster: RedisCluster,
) -> None:
    """50 publications at once: one version read and one COPY per shard in the
    pipeline (merged), every virtual queue gets every message in publication
    order, and a virtual queue with room for 30 gets the first 30."""
    redis_cluster.flush()
    layout = cluster_layout()
    names = ["vq0", "vq1", "vq2"]
    assert len({layout.shard(f"{n}@/topic/.*") for n in names}) > 1
    limits = EngineLimits(max_queue_depth=30)
    publisher = RedisEngine(redis_cluster.url, broker_id="p", limits=limits, sweep_interval=None)
    await publisher.start()
    try:
        for name in names:
            await publisher.declare_virtual_queue(name, "/topic/.*")
        await publisher.publish(make_message("/topic/warm"))  # the cache loaded
        for name in names:
            full = f"{name}@/topic/.*"
            warm = await publisher.fetch(full, "c")
            await publisher.ack(full, [warm[0].receipt])
        messages = [make_message("/topic/x", payload=b"%d" % n) for n in range(50)]
        await asyncio.gather(*(publisher.publish(m) for m in messages))
        for name in names:
            full = f"{name}@/topic/.*"
            got = await publisher.fetch(full, "c", count=100)
            assert [d.message.id for d in got] == [m.id for m in messages[:30]], full
    finally:
        await publisher.close()


async def test_a_virtual_queue_declared_at_another_broker_is_fed_at_once(
    redis_cluster: RedisCluster,
) -> None:
    redis_cluster.flush()
    publisher = RedisEngine(redis_cluster.url, broker_id="p", sweep_interval=None)
    declarer = RedisEngine(redis_cluster.url, broker_id="d", sweep_interval=None)
    await publisher.start()
    await declarer.start()
    try:
        await publisher.publish(make_message("/topic/x"))  # caches "no virtual queues"
        await declarer.declare_virtual_queue("late", "/topic/.*")
        message = make_message("/topic/x")
        await publisher.publish(message)  # the stale cache is found and reloaded
        got = await publisher.fetch("late@/topic/.*", "c", count=10)
        assert [d.message.id for d in got] == [message.id]
    finally:
        await declarer.close()
        await publisher.close()


async def test_a_new_queue_past_max_queues_is_refused_and_stores_nothing(
    redis_cluster: RedisCluster,
) -> None:
    redis_cluster.flush()
    limits = EngineLimits(max_queues=1)
    engine = RedisEngine(redis_cluster.url, broker_id="b1", limits=limits, sweep_interval=None)
    await engine.start()
    try:
        first = [engine.enqueue(make_message("q1")) for _ in range(3)]  # held, then in order
        await asyncio.gather(*first)
        refused = [engine.enqueue(make_message("q2")) for _ in range(2)]
        for future in refused:
            with pytest.raises(QueueLimitReached):
                await future
        assert await engine.depth("q2") == 0
        assert await engine.depth("q1") == 3
        assert await engine.queues() == ["q1"]
    finally:
        await engine.close()


async def test_an_engine_remembers_a_bounded_number_of_registered_queues(
    redis_cluster: RedisCluster,
) -> None:
    redis_cluster.flush()
    wide = RedisEngine(
        redis_cluster.url, broker_id="w", limits=EngineLimits(max_queues=10), sweep_interval=None
    )
    # max_queues 1: it remembers 4 names, then forgets them all and registers again
    # (idempotently: the registry knows them, so the limit does not refuse them).
    narrow = RedisEngine(
        redis_cluster.url, broker_id="n", limits=EngineLimits(max_queues=1), sweep_interval=None
    )
    await wide.start()
    await narrow.start()
    try:
        names = [f"q{n}" for n in range(6)]
        for name in names:
            await wide.enqueue(make_message(name))
        for _ in range(2):
            for name in names:
                await narrow.enqueue(make_message(name))
        assert await narrow.depths() == dict.fromkeys(names, 3)
    finally:
        await narrow.close()
        await wide.close()


class Progress:
    """What the load did so far, and an event set at each change (to wait on)."""

    def __init__(self) -> None:
        self.accepted: set[str] = set()
        self.received: set[str] = set()
        self.faulted = 0
        self.stop = asyncio.Event()
        self._changed = asyncio.Event()

    def changed(self) -> None:
        self._changed.set()

    async def until(self, done: Callable[[], bool], *tasks: asyncio.Task[None]) -> None:
        """Return once ``done()``; a load task that failed raises here."""
        while not done():
            for task in tasks:
                if task.done():
                    task.result()
            self._changed.clear()
            await self._changed.wait()


async def _produce(engine: RedisEngine, progress: Progress) -> None:
    """Enqueue in windows of WINDOW until told to stop."""
    try:
        await _produce_windows(engine, progress)
    finally:
        progress.changed()


async def _produce_windows(engine: RedisEngine, progress: Progress) -> None:
    while not progress.stop.is_set():
        messages = [make_message(QUEUE) for _ in range(WINDOW)]
        results = await asyncio.gather(
            *(engine.enqueue(m) for m in messages), return_exceptions=True
        )
        for message, result in zip(messages, results, strict=True):
            if result is None:
                progress.accepted.add(message.id)
            else:
                assert isinstance(result, EngineUnavailable), result
                progress.faulted += 1
        progress.changed()


async def _consume(engine: RedisEngine, progress: Progress) -> None:
    try:
        while True:
            try:
                deliveries = await engine.fetch(QUEUE, "c", count=100, wait=T)
                if deliveries:
                    progress.received.update(d.message.id for d in deliveries)
                    progress.changed()
                    await engine.ack(QUEUE, [d.receipt for d in deliveries])
            except EngineUnavailable:
                continue  # the failover: fetch again (an unacknowledged lease comes back)
    finally:
        progress.changed()


async def _no_wait_without_a_replica(url: str, slot: int) -> None:
    """The promoted replica has no replica of its own: once a WAIT there timed out,
    the next are answered 0 at once (gateway/engines/redis/cluster.py, "lonely")."""
    layout = cluster_layout()
    probe = layout.prefixes[layout.shard(QUEUE)] + "probe"
    assert key_slot(probe.encode()) == slot
    client = connect(url, connect_timeout=T, command_timeout=5 * T)
    made = batcher(client, [])
    try:
        await made.load_scripts()
        # The first WAIT there times out (no replica confirms), and makes the
        # primary lonely: the next is answered 0 at once, however long its timeout.
        assert await made._pipeline([("SET", probe, "x"), ("WAIT", 1, 200)]) == [b"OK", 0]
        async with asyncio.timeout(10 * T):  # WAIT's own timeout is far longer
            replies = await made._pipeline([("SET", probe, "y"), ("WAIT", 1, 600_000)])
        assert replies == [b"OK", 0]
    finally:
        await made.close()
        await client.aclose()


async def _change_under_load(cluster: RedisCluster, change: Callable[[], object]) -> None:
    """Enqueue, fetch and acknowledge QUEUE; run ``change`` (in a thread) once BEFORE
    were accepted; go on until AFTER more were; then every accepted one must arrive."""
    producer = RedisEngine(cluster.url, broker_id="p", sweep_interval=None)
    consumer = RedisEngine(cluster.url, broker_id="c", sweep_interval=None)
    await producer.start()
    await consumer.start()
    progress = Progress()
    producing = asyncio.create_task(_produce(producer, progress))
    consuming = asyncio.create_task(_consume(consumer, progress))
    try:
        async with asyncio.timeout(60 * T):  # enqueues that hang fail the test
            await progress.until(lambda: len(progress.accepted) >= BEFORE, producing)
            await asyncio.to_thread(change)
            after = len(progress.accepted) + AFTER
            await progress.until(lambda: len(progress.accepted) >= after, producing)
            progress.stop.set()
            await producing
            # Every accepted message is delivered (duplicates allowed: at least once).
            await progress.until(lambda: progress.accepted <= progress.received, consuming)
    finally:
        progress.stop.set()
        consuming.cancel()
        for task in (producing, consuming):
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await task
        await consumer.close()
        await producer.close()


def queue_slot() -> int:
    return key_slot(cluster_layout().queue_keys(QUEUE).block[2].encode())


async def test_killing_the_primary_of_a_queue_loses_no_accepted_message(
    tmp_path: Path,
) -> None:
    with RedisCluster(tmp_path) as cluster:
        slot = queue_slot()
        primary = cluster.primary_of(slot)
        (replica,) = [n for n in cluster.nodes() if n.primary_id == primary.node_id]

        def kill() -> None:
            cluster.server(primary.port).kill()
            cluster.wait_ready()  # over once the replica serves the slot

        await _change_under_load(cluster, kill)
        assert cluster.primary_of(slot).node_id == replica.node_id
        await _no_wait_without_a_replica(cluster.url, slot)


async def test_moving_a_queue_s_slot_to_another_primary_loses_no_accepted_message(
    tmp_path: Path,
) -> None:
    with RedisCluster(tmp_path) as cluster:
        slot = queue_slot()
        source = cluster.primary_of(slot)
        target = next(n for n in cluster.nodes() if n.primary and n.node_id != source.node_id)

        def migrate() -> None:
            # What redis-cli --cluster reshard does: IMPORTING, MIGRATING, the keys
            # a few at a time (scripts meet TRYAGAIN or ASK meanwhile), then NODE.
            with redis.Redis(port=source.port) as old, redis.Redis(port=target.port) as new:
                new.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
                old.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id)
                while keys := old.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 3):
                    old.execute_command(
                        "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys
                    )
                for node in cluster.nodes():
                    if node.primary:
                        with redis.Redis(port=node.port) as each:
                            each.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target.node_id)

        await _change_under_load(cluster, migrate)
        assert cluster.primary_of(slot).node_id == target.node_id
