"""A private Redis Cluster: six ``redis-server --cluster-enabled yes``, three primaries.

Theory of operation
-------------------
Each node is a :class:`tests.support.redis.RedisServer` (its own free loopback
port and data directory, readiness from its log, stopped by PID) started with
the cluster options. ``redis-cli --cluster create ... --cluster-replicas 1``
then hands the 16,384 slots to three primaries and makes each other node a
replica of one of them; it returns once every node agrees on the slot map.

"Ready" is what the tests need, checked on every node: ``cluster_state:ok``,
every slot assigned, all six nodes known, and every replica's link to its
primary up (``master_link_status:up``), so that a test which kills a primary
has a replica with the data to promote. Those conditions settle within a
second or two of ``create`` and nothing announces them, so :meth:`wait_ready`
polls them with a deadline (``CLUSTER INFO`` is cheap) rather than sleeping.

The nodes run with the AOF on and ``appendfsync always`` (as
:class:`RedisServer` with ``appendonly``), the durability the gateway documents,
and ``cluster-node-timeout`` short (:data:`NODE_TIMEOUT_MS`) so that a killed
primary's replica takes over within a few seconds of the kill.

``redis-cli`` ships with ``redis-server`` (Debian's ``redis-tools``); missing,
it is an error, never a skip.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final, Self

import redis

from .ports import listen_port
from .redis import RedisServer, RedisServerError
from .timing import T

__all__ = ["NODE_TIMEOUT_MS", "ClusterNode", "RedisCluster"]

#: Milliseconds a node may be unreachable before the others count it as failed: short,
#: so that a failover test's replica is promoted within seconds.
NODE_TIMEOUT_MS: Final = 1000
_HOST: Final = "127.0.0.1"
#: How long one round of readiness checks rests before the next (a poll, not a wait
#: for something to happen: the cluster announces nothing when it settles).
_POLL: Final = 0.05


@dataclass(frozen=True, slots=True)
class ClusterNode:
    """One node as ``CLUSTER NODES`` describes it."""

    node_id: str
    port: int
    primary: bool
    #: The node id of this replica's primary ("" for a primary).
    primary_id: str
    #: The slot ranges a primary serves, inclusive.
    slots: tuple[tuple[int, int], ...]


class RedisCluster:
    """Six Redis nodes on free loopback ports, formed into a cluster with one replica each.

    Args:
        directory: a directory of its own; each node gets a subdirectory.
        nodes: how many nodes (a multiple of two: half primaries, half replicas).
        appendonly: the AOF with ``appendfsync always`` on every node (benchmarks
            comparing with a Redis without it turn it off).
    """

    def __init__(self, directory: Path, *, nodes: int = 6, appendonly: bool = True) -> None:
        if nodes < 6 or nodes % 2:
            raise ValueError("a cluster with one replica per primary needs 6, 8, ... nodes")
        options = (
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            # A replica promotes itself however stale it thinks it is: the tests kill
            # primaries deliberately, and an idle test cluster has no other writer.
            "--cluster-replica-validity-factor", "0",
        )  # fmt: skip
        # The cluster bus defaults to the port plus 10,000, which may be taken or past
        # 65,535: each node gets a port of its own for it instead, below the ephemeral
        # range like the node's own (see listen_port).
        self.servers = [
            RedisServer(
                directory / f"node{index}",
                appendonly=appendonly,
                options=(*options, "--cluster-port", str(listen_port())),
            )
            for index in range(nodes)
        ]

    @property
    def ports(self) -> list[int]:
        """Every node's port, in start order."""
        return [server.port for server in self.servers]

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:P1,127.0.0.1:P2,...``: every node as a seed."""
        return "redis+cluster://" + ",".join(f"{_HOST}:{port}" for port in self.ports)

    def server(self, port: int) -> RedisServer:
        """The node listening on ``port``."""
        for server in self.servers:
            if server.port == port:
                return server
        raise KeyError(port)

    def start(self, timeout: float = 30 * T) -> None:
        """Start every node, form the cluster, and return once it is ready.

        Raises:
            RedisServerError: a node did not start, ``redis-cli`` is missing or failed,
                or the cluster was not ready within ``timeout`` seconds.
        """
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RedisServerError(
                "'redis-cli' was not found on PATH. The cluster tests need it; it comes "
                "with redis-server (Debian: redis-tools)."
            )
        try:
            for server in self.servers:
                server.start()
            created = subprocess.run(
                [cli, "--cluster", "create", *[f"{_HOST}:{p}" for p in self.ports],
                 "--cluster-replicas", "1", "--cluster-yes"],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout,
                check=False,
            )  # fmt: skip
            if created.returncode != 0:
                raise RedisServerError(
                    "redis-cli --cluster create failed:\n"
                    + created.stdout.decode(errors="replace")
                    + created.stderr.decode(errors="replace")
                )
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def wait_ready(self, timeout: float = 30 * T) -> None:
        """Return once every live node says the cluster is whole; see the module docstring.

        Raises:
            RedisServerError: not ready within ``timeout`` seconds (the last answer says why).
        """
        deadline = time.monotonic() + timeout
        why = "not checked yet"
        while time.monotonic() < deadline:
            why = self._unready()
            if not why:
                return
            time.sleep(_POLL)
        raise RedisServerError(f"the Redis Cluster was not ready within {timeout:g}s: {why}")

    def _unready(self) -> str:
        live = [server for server in self.servers if server.running]
        for server in live:
            try:
                with redis.Redis(host=_HOST, port=server.port, socket_timeout=T) as client:
                    info = _fields(client.execute_command("CLUSTER", "INFO"))
                    replication = client.info("replication")
            except redis.RedisError as exc:
                return f"node {server.port}: {exc}"
            if info.get("cluster_state") != "ok":
                return f"node {server.port}: cluster_state {info.get('cluster_state')}"
            if info.get("cluster_slots_ok") != "16384":
                return f"node {server.port}: {info.get('cluster_slots_ok')} slots ok"
            if int(info.get("cluster_known_nodes", 0)) < len(live):
                return f"node {server.port}: knows {info.get('cluster_known_nodes')} nodes"
            if replication.get("role") == "slave" and replication.get("master_link_status") != "up":
                return f"replica {server.port}: link to its primary is down"
        return ""

    def nodes(self, via: int | None = None) -> list[ClusterNode]:
        """The cluster's nodes, as the node on port ``via`` (default: any live one) sees them."""
        port = via if via is not None else next(s.port for s in self.servers if s.running)
        with redis.Redis(host=_HOST, port=port, socket_timeout=T) as client:
            raw = client.execute_command("CLUSTER", "NODES")
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        if isinstance(raw, dict):  # redis-py may parse it; ask for the raw text then
            raise RedisServerError("unexpected parsed CLUSTER NODES reply")
        found: list[ClusterNode] = []
        for line in text.splitlines():
            parts = line.split()
            if len(parts) < 8 or "fail" in parts[2].split(","):
                continue
            address = parts[1].split("@")[0]
            slots: list[tuple[int, int]] = []
            for spec in parts[8:]:
                if spec.startswith("["):  # a slot being migrated, not served
                    continue
                first, _, last = spec.partition("-")
                slots.append((int(first), int(last or first)))
            found.append(
                ClusterNode(
                    node_id=parts[0],
                    port=int(address.rsplit(":", 1)[1]),
                    primary="master" in parts[2].split(","),
                    primary_id="" if parts[3] == "-" else parts[3],
                    slots=tuple(slots),
                )
            )
        return found

    def primary_of(self, slot: int) -> ClusterNode:
        """The primary serving ``slot`` now."""
        for node in self.nodes():
            if node.primary and any(first <= slot <= last for first, last in node.slots):
                return node
        raise RedisServerError(f"no primary serves slot {slot}")

    def flush(self) -> None:
        """FLUSHALL on every primary: a clean cluster for the next test."""
        for node in self.nodes():
            if node.primary:
                with redis.Redis(host=_HOST, port=node.port, socket_timeout=T) as client:
                    client.flushall()

    def stop(self, timeout: float = 10 * T) -> None:
        """Stop every node that runs (SIGTERM, then SIGKILL), by PID."""
        for server in self.servers:
            server.stop(timeout)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def _fields(raw: object) -> dict[str, str]:
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition(":")
        if sep:
            fields[key] = value
    return fields
