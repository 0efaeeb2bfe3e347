"""The routing plane on a Redis Cluster that changes under load: a primary killed
(its replica takes over) and a slot moved (``MIGRATING``/``IMPORTING``,
``MIGRATE``, ``SETSLOT NODE``) while one broker forwards to another.

What must hold: every forward reported sent (the future said ``broker-a``)
reaches broker A, none is lost; forwards during the change either succeed or
fault (``PlaneUnavailable``), never hang; and forwards succeed again afterwards.
Each test starts a six-node cluster of its own (tests/support/redis_cluster.py),
since it breaks it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from gateway.plane.base import Envelope, EnvelopeKind, PlaneUnavailable
from gateway.plane.redis.keys import directory_prefix, stream_key
from gateway.plane.redis.plane import RedisPlane
from tests.support import T
from tests.support.redis_cluster import RedisCluster

pytestmark = pytest.mark.anyio

PREFIX = "faults:"
#: Long enough that neither broker's lease runs out while a primary fails over.
LEASE = 30.0
CHANNEL = "channel-on-a"
#: Forwards reported sent before the change, and again after it.
BEFORE = 40
AFTER = 40


@dataclass
class Brokers:
    a: RedisPlane
    b: RedisPlane
    inbound: asyncio.Queue[Envelope] = field(default_factory=asyncio.Queue)


@contextlib.asynccontextmanager
async def two_brokers(url: str) -> AsyncIterator[Brokers]:
    a = RedisPlane(url, broker_id="broker-a", lease=LEASE, prefix=PREFIX)
    b = RedisPlane(url, broker_id="broker-b", lease=LEASE, prefix=PREFIX)
    brokers = Brokers(a, b)
    await a.start(brokers.inbound.put_nowait, lambda peer: None)
    await b.start(lambda envelope: None, lambda peer: None)
    try:
        a.channel_opened(CHANNEL)
        assert await a.locate_channel(CHANNEL) == "broker-a"
        yield brokers
    finally:
        await b.close()
        await a.close()


@dataclass
class Load:
    """B forwarding numbered frames to A's Channel, one after another."""

    sent: list[int] = field(default_factory=list)
    faulted: list[int] = field(default_factory=list)
    sent_after_change: int = 0
    changed: bool = False


async def forward_until(brokers: Brokers, load: Load, change: Callable[[], object]) -> None:
    """Forward until BEFORE were sent, run ``change`` (in a thread) meanwhile, and go
    on until AFTER were sent after it finished."""
    async with asyncio.timeout(60 * T):  # forwards that fault for ever fail the test
        await _forward_until(brokers, load, change)


async def _forward_until(brokers: Brokers, load: Load, change: Callable[[], object]) -> None:
    number = 0
    changing: asyncio.Task[object] | None = None
    while load.sent_after_change < AFTER:
        envelope = Envelope(EnvelopeKind.CHANNEL, "broker-b", CHANNEL, b"n=%d;" % number)
        try:
            async with asyncio.timeout(30 * T):  # never hangs
                target = await brokers.b.forward_to_channel(CHANNEL, envelope)
        except PlaneUnavailable:
            load.faulted.append(number)
        else:
            assert target == "broker-a", (number, target)
            load.sent.append(number)
            if load.changed:
                load.sent_after_change += 1
        number += 1
        if changing is None and len(load.sent) >= BEFORE:
            changing = asyncio.create_task(asyncio.to_thread(change))
        if changing is not None and changing.done() and not load.changed:
            changing.result()
            load.changed = True


async def received_all(brokers: Brokers, load: Load) -> set[int]:
    """Wait until A received every frame B was told was sent; return what A got."""
    got: set[int] = set()
    missing = set(load.sent)
    async with asyncio.timeout(30 * T):
        while missing - got:
            envelope = await brokers.inbound.get()
            got.add(int(envelope.frame[2:-1]))
    return got


def stream_slot() -> int:
    return key_slot(stream_key(PREFIX, "broker-a").encode())


async def test_killing_the_primary_of_a_broker_s_stream_loses_no_forward(
    tmp_path: Path,
) -> None:
    with RedisCluster(tmp_path) as cluster:
        primary = cluster.primary_of(stream_slot())
        (replica,) = [n for n in cluster.nodes() if n.primary_id == primary.node_id]
        async with two_brokers(cluster.url) as brokers:
            load = Load()

            def kill() -> None:
                cluster.server(primary.port).kill()
                # Over once the replica serves the slot.
                cluster.wait_ready()

            await forward_until(brokers, load, kill)
            await received_all(brokers, load)
        assert cluster.primary_of(stream_slot()).node_id == replica.node_id
        assert load.sent_after_change == AFTER


async def test_killing_the_primary_of_the_directory_loses_no_forward(tmp_path: Path) -> None:
    with RedisCluster(tmp_path) as cluster:
        directory = key_slot((directory_prefix(PREFIX) + "ch").encode())
        primary = cluster.primary_of(directory)
        async with two_brokers(cluster.url) as brokers:
            load = Load()

            def kill() -> None:
                cluster.server(primary.port).kill()
                cluster.wait_ready()

            await forward_until(brokers, load, kill)
            await received_all(brokers, load)
        assert cluster.primary_of(directory).node_id != primary.node_id


async def test_moving_a_broker_s_stream_to_another_primary_loses_no_forward(
    tmp_path: Path,
) -> None:
    with RedisCluster(tmp_path) as cluster:
        slot = stream_slot()
        source = cluster.primary_of(slot)
        target = next(n for n in cluster.nodes() if n.primary and n.node_id != source.node_id)

        def migrate() -> None:
            with (
                redis.Redis(port=source.port) as old,
                redis.Redis(port=target.port) as new,
            ):
                new.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
                old.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id)
                while keys := old.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 10):
                    old.execute_command(
                        "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys
                    )
                for node in cluster.nodes():
                    if node.primary:
                        with redis.Redis(port=node.port) as each:
                            each.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target.node_id)

        async with two_brokers(cluster.url) as brokers:
            load = Load()
            await forward_until(brokers, load, migrate)
            await received_all(brokers, load)
        assert cluster.primary_of(slot).node_id == target.node_id
