"""``redis_url`` naming one Redis or a Redis Cluster: the URL read, the client made,
and raw pipelines split by slot on a real cluster (tests/support/redis_cluster.py)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as ClusterClient
from redis.exceptions import ResponseError

from gateway.config.errors import ConfigError
from gateway.config.loading import load_config
from gateway.engines.base import EngineUnavailable
from gateway.engines.redis.batch import Batcher, reply_error
from gateway.engines.redis.cluster import ClusterBatcher, command_slot
from gateway.engines.redis.cluster_url import is_cluster_url, parse_cluster_url
from gateway.engines.redis.connection import batcher, connect, node_connection, refresh
from gateway.engines.redis.scripts import Script
from tests.support import T
from tests.support.redis_cluster import RedisCluster

pytestmark = pytest.mark.anyio

ECHO_KEY = Script(
    "test_echo_key", "if #KEYS == 0 then return 'anywhere' end return redis.call('GET', KEYS[1])"
)


def test_a_cluster_url_is_read() -> None:
    address = parse_cluster_url("rediss+cluster://me:p%40ss@10.0.0.1:7000,[::1]:7001/0")
    assert address.seeds == (("10.0.0.1", 7000), ("::1", 7001))
    assert (address.username, address.password, address.tls) == ("me", "p@ss", True)
    plain = parse_cluster_url("redis+cluster://h:1")
    assert (plain.username, plain.password, plain.tls) == (None, None, False)
    assert is_cluster_url("redis+cluster://h:1")
    assert not is_cluster_url("redis://h:1/0")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://h:1", "not a"),
        ("redis+cluster://h", "host:port"),
        ("redis+cluster://h:x", "host:port"),
        ("redis+cluster://h:1,", "host:port"),
        ("redis+cluster://h:70000", "out of range"),
        ("redis+cluster://h:1/2", "database 0"),
    ],
)
def test_a_bad_cluster_url_is_refused(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_cluster_url(url)


def test_the_configuration_takes_a_cluster_url_and_refuses_a_bad_one() -> None:
    config = load_config(environ={"ASBP_REDIS_URL": "redis+cluster://a:7000,b:7001"})
    assert config.redis_url == "redis+cluster://a:7000,b:7001"
    with pytest.raises(ConfigError, match="host:port"):
        load_config(environ={"ASBP_REDIS_URL": "redis+cluster://a"})


def test_a_command_s_slot_is_its_first_key_s() -> None:
    assert command_slot(("GET", "{x}a")) == command_slot(("SET", b"{x}b", 1))
    assert command_slot(("EVALSHA", "sha", 1, "{x}c")) == command_slot(("GET", "{x}a"))
    assert command_slot(("EVALSHA", "sha", 0)) is None
    assert command_slot(("GET", 5)) == command_slot(("GET", "5"))


async def test_one_redis_gets_the_plain_client() -> None:
    client = connect("redis://127.0.0.1:1/0", connect_timeout=T, command_timeout=T)
    try:
        assert isinstance(client, redis.asyncio.Redis)
        made = batcher(client, [])
        assert type(made) is Batcher
        plain = node_connection(client, "k")
        assert isinstance(plain, redis.asyncio.Connection)
        assert plain.port == 1
        await refresh(client)  # nothing to reload
    finally:
        await client.aclose()


async def test_a_pipeline_on_a_cluster_reaches_every_primary_in_order(
    redis_cluster: RedisCluster,
) -> None:
    redis_cluster.flush()
    client = connect(redis_cluster.url, connect_timeout=T, command_timeout=5 * T)
    assert isinstance(client, ClusterClient)
    made = batcher(client, [ECHO_KEY])
    assert isinstance(made, ClusterBatcher)
    try:
        await made.load_scripts()
        keys = [f"conn-test:{n}" for n in range(60)]
        commands: list[tuple[object, ...]] = [("SET", key, key) for key in keys]
        commands += [("EVALSHA", ECHO_KEY.sha, 1, key) for key in keys]
        commands += [("EVALSHA", ECHO_KEY.sha, 0)]  # no KEYS: any primary
        replies = await made._pipeline(commands)
        assert replies[: len(keys)] == [b"OK"] * len(keys)
        assert replies[len(keys) : -1] == [key.encode() for key in keys]
        assert replies[-1] == b"anywhere"
        assert len({redis_cluster.primary_of(command_slot(c) or 0).port for c in commands}) == 3
        connection = node_connection(client, keys[0])
        assert isinstance(connection, redis.asyncio.Connection)
        assert connection.port == redis_cluster.primary_of(client.keyslot(keys[0])).port
    finally:
        await made.close()
        await client.aclose()


async def test_a_cluster_script_cache_is_reloaded_after_script_flush(
    redis_cluster: RedisCluster,
) -> None:
    redis_cluster.flush()
    client = connect(redis_cluster.url, connect_timeout=T, command_timeout=5 * T)
    assert isinstance(client, ClusterClient)
    made = batcher(client, [ECHO_KEY])
    try:
        await made.load_scripts()
        for node in redis_cluster.nodes():
            if node.primary:
                async with redis.asyncio.Redis(host="127.0.0.1", port=node.port) as plain:
                    await plain.script_flush()
        assert await made._execute([("EVALSHA", ECHO_KEY.sha, 1, "absent")]) == [None]
    finally:
        await made.close()
        await client.aclose()


async def test_waits_after_writes_to_one_primary_share_one_wait(
    redis_cluster: RedisCluster,
) -> None:
    redis_cluster.flush()
    client = connect(redis_cluster.url, connect_timeout=T, command_timeout=5 * T)
    assert isinstance(client, ClusterClient)
    made = batcher(client, [])
    try:
        await made.load_scripts()
        keys = [f"wait-test:{n}" for n in range(30)]
        commands: list[tuple[object, ...]] = []
        for key in keys:
            commands += [("SET", key, key), ("WAIT", 1, 5000)]
        replies = await made._pipeline(commands)
        assert replies[0::2] == [b"OK"] * len(keys)
        # Every write reached its primary's replica: each WAIT answers 1.
        assert replies[1::2] == [1] * len(keys)
    finally:
        await made.close()
        await client.aclose()


async def command(client: redis.asyncio.Redis, *args: object) -> object:
    return await client.execute_command(*args)  # type: ignore[no-untyped-call]  # upstream


async def test_a_command_for_a_slot_being_migrated_follows_ask_to_the_importing_primary(
    redis_cluster: RedisCluster,
) -> None:
    redis_cluster.flush()
    client = connect(redis_cluster.url, connect_timeout=T, command_timeout=5 * T)
    assert isinstance(client, ClusterClient)
    made = batcher(client, [])
    key = "ask-test:{moving}"
    slot = command_slot(("GET", key))
    assert slot is not None
    source = redis_cluster.primary_of(slot)
    target = next(n for n in redis_cluster.nodes() if n.primary and n.node_id != source.node_id)
    try:
        await made.load_scripts()
        async with (
            redis.asyncio.Redis(port=source.port) as old,
            redis.asyncio.Redis(port=target.port) as new,
        ):
            await command(new, "CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
            await command(old, "CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id)
            # The key is not at the source: it answers ASK, and the write lands at the target.
            assert await made._pipeline([("SET", key, "v"), ("GET", key)]) == [b"OK", b"v"]
            assert await command(new, "ASKING") is True
            assert await new.get(key) == b"v"
            for node in redis_cluster.nodes():
                if node.primary:
                    async with redis.asyncio.Redis(port=node.port) as each:
                        await command(each, "CLUSTER", "SETSLOT", slot, "NODE", target.node_id)
        # The slot map moved on: MOVED is followed too.
        assert await made._pipeline([("GET", key)]) == [b"v"]
    finally:
        await made.close()
        await client.aclose()
        redis_cluster.flush()


async def slot_served_by(cluster: RedisCluster, slot: int, port: int) -> None:
    """Return once every node, replicas included, names the primary on ``port`` for
    ``slot``: the replicas learn of a SETSLOT by gossip, and a client that asks one of
    them for the slot map before then is sent back to the old primary (CI, load 8-11)."""
    with anyio.fail_after(10 * T):
        while True:
            views = []
            for server in cluster.servers:
                async with redis.asyncio.Redis(port=server.port) as each:
                    slots = await command(each, "CLUSTER", "SLOTS")
                assert isinstance(slots, list)
                views.append(next((r[2][1] for r in slots if r[0] <= slot <= r[1]), None))
            if all(view == port for view in views):
                return
            await anyio.sleep(0.05)  # a poll: gossip announces nothing when it settles


async def wait_calls(client: redis.asyncio.Redis) -> int:
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_wait", {}).get("calls", 0))


async def test_a_write_sent_again_after_moved_takes_its_wait_along(
    redis_cluster: RedisCluster,
) -> None:
    """The WAIT after a write answered MOVED ran where the write was refused; it is
    sent again with the write, to the primary that took it."""
    redis_cluster.flush()
    client = connect(redis_cluster.url, connect_timeout=T, command_timeout=5 * T)
    assert isinstance(client, ClusterClient)
    made = batcher(client, [])
    key = "wait-moved-test:{moved}"
    slot = command_slot(("GET", key))
    assert slot is not None
    source = redis_cluster.primary_of(slot)
    target = next(n for n in redis_cluster.nodes() if n.primary and n.node_id != source.node_id)
    try:
        await made.load_scripts()  # the slot map, before the slot moves: stale after
        async with redis.asyncio.Redis(port=target.port) as new:
            # The target's config epoch the highest, so that every node, replicas too,
            # takes its claim as soon as gossip carries it: without IMPORTING first a
            # SETSLOT NODE bumps no epoch, and a replica could keep the source's claim
            # past slot_served_by's deadline (CI, once).
            await command(new, "CLUSTER", "BUMPEPOCH")
        for node in redis_cluster.nodes():
            if node.primary:
                async with redis.asyncio.Redis(port=node.port) as each:
                    await command(each, "CLUSTER", "SETSLOT", slot, "NODE", target.node_id)
        await slot_served_by(redis_cluster, slot, target.port)
        async with redis.asyncio.Redis(port=target.port) as new:
            waits = await wait_calls(new)
            answers = await made._pipeline([("SET", key, "v"), ("WAIT", 1, 5000)])
            assert answers == [b"OK", 1], [str(answer) for answer in answers]
            assert await wait_calls(new) == waits + 1
            assert await new.get(key) == b"v"
    finally:
        await made.close()
        await client.aclose()
        redis_cluster.flush()


async def test_a_slot_nobody_serves_fails_its_calls_as_unavailable_and_no_others(
    tmp_path: Path,
) -> None:
    with RedisCluster(tmp_path) as cluster:
        client = connect(cluster.url, connect_timeout=T, command_timeout=5 * T)
        assert isinstance(client, ClusterClient)
        made = ClusterBatcher(client, [], redirect_deadline=0.5)
        try:
            await made.load_scripts()
            keys = [f"gone-test:{n}" for n in range(30)]
            lost = cluster.primary_of(command_slot(("GET", keys[0])) or 0)
            on_lost = {
                key: cluster.primary_of(command_slot(("GET", key)) or 0).port == lost.port
                for key in keys
            }
            # The primary and its replica both gone: no failover can serve its slots.
            for node in cluster.nodes():
                if node.node_id == lost.node_id or node.primary_id == lost.node_id:
                    cluster.server(node.port).kill()
            replies = await made._pipeline([("SET", key, key) for key in keys])
            for key, reply in zip(keys, replies, strict=True):
                if on_lost[key]:
                    assert isinstance(reply, Exception)
                    assert isinstance(reply_error(ResponseError(str(reply))), EngineUnavailable)
                else:
                    assert reply == b"OK"  # the other primaries' calls are unaffected
            assert any(on_lost.values())
            assert not all(on_lost.values())
        finally:
            await made.close()
            await client.aclose()
