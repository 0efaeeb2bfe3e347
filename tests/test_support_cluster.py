"""Self-tests of :mod:`tests.support.redis_cluster` against real ``redis-server`` nodes."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster as ClusterClient

from tests.support import RedisServerError
from tests.support.redis_cluster import RedisCluster


def test_cluster_has_three_primaries_each_with_a_replica(redis_cluster: RedisCluster) -> None:
    nodes = redis_cluster.nodes()
    primaries = [node for node in nodes if node.primary]
    replicas = [node for node in nodes if not node.primary]
    assert len(primaries) == 3
    assert sorted(node.primary_id for node in replicas) == sorted(n.node_id for n in primaries)
    served = sorted(r for node in primaries for r in node.slots)
    assert served[0][0] == 0
    assert served[-1][1] == 16383
    assert sum(last - first + 1 for first, last in served) == 16384
    assert redis_cluster.url.startswith("redis+cluster://127.0.0.1:")


def test_cluster_serves_keys_on_every_primary(redis_cluster: RedisCluster) -> None:
    port = redis_cluster.ports[0]
    with ClusterClient(host="127.0.0.1", port=port) as client:
        keys = [f"support-test:{n}" for n in range(64)]
        for key in keys:
            client.set(key, key)
        owners = {redis_cluster.primary_of(client.keyslot(key)).port for key in keys}
        assert len(owners) == 3
        assert [client.get(key) for key in keys] == [key.encode() for key in keys]
    redis_cluster.flush()
    with ClusterClient(host="127.0.0.1", port=port) as client:
        assert client.get(keys[0]) is None


def test_cluster_without_redis_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RedisServerError, match="redis-cli"):
        RedisCluster(tmp_path).start()


def test_cluster_needs_a_replica_per_primary(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="6, 8"):
        RedisCluster(tmp_path, nodes=5)


def test_cluster_server_by_port(redis_cluster: RedisCluster) -> None:
    port = redis_cluster.ports[2]
    assert redis_cluster.server(port).port == port
    with pytest.raises(KeyError):
        redis_cluster.server(1)
    with redis.Redis(port=port) as client:
        assert client.ping()
