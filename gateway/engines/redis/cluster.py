"""Pipelines on a Redis Cluster: each command to the primary serving its slot.

:class:`~gateway.engines.redis.batch.Batcher` writes a batch as one raw
pipeline on one connection. On a cluster the commands of one batch belong to
different slots, so :class:`ClusterBatcher` splits the batch by the primary
that serves each command's slot (from the client's slot map), writes one raw
pipeline per primary, all at once, and puts the replies back in the batch's
order. The commands themselves are unchanged: the callers' keys already keep
what one script touches in one slot (a hash tag; docs/architecture.md).

A command's slot is its first key's: ``EVALSHA sha numkeys key ...`` the first
of its KEYS, any other command its first argument. A script without KEYS may
run anywhere (redis-py does the same) and goes to the first primary. ``WAIT``
has no key: it goes where the command before it in the batch went, which is
what it waits for (the plane follows each send with one, the engine each write
that accepts messages). A primary whose ``WAIT`` timed out with no replica
confirming is *lonely* for :data:`LONELY_FOR` seconds: its ``WAIT``s are
answered 0 at once, without being sent, since they could only wait out their
timeout (a cluster run without replicas, or a primary whose replica died, as
after a failover) and would make every accepted write that much later. The
first ``WAIT`` after that is sent again, so a replica that came back (or
joined) is waited for within :data:`LONELY_FOR`. (The slot map's list of
replicas is not trusted for this: loaded before a replica attached, it would
skip the waits for good.)

*Redirections and failures.* The slot map can be stale: a slot moved
(``MOVED``), is moving (``ASK``: the command goes once more to the importing
node, after ``ASKING``; ``TRYAGAIN``: a multi-key command met a half-moved
slot), or a primary died and its replica is not promoted yet (the connection
fails, or ``CLUSTERDOWN``). Those commands alone are sent again after the map
is reloaded, with a growing pause between rounds, until
:data:`REDIRECT_DEADLINE` has passed; then each fails with a ``CLUSTERDOWN``
error reply, which the callers already read as "Redis is unavailable" (2005).
Resending a command whose connection failed may run it twice, exactly as
Batcher's one retry may on one Redis: at least once, never silently lost.

Scripts are loaded on every primary (and after a failover, the promoted
replica answers NOSCRIPT once and Batcher loads them again).

Each primary's pipelines go on a lean connection kept for that node
(:mod:`gateway.engines.redis.resp`, made as the node's redis-py connections
are), as one Redis's do.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any, Final

from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from redis.exceptions import AskError, ClusterDownError, MovedError, ResponseError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.engines.redis.batch import CONNECTION_ERRORS, Batcher, _pack_command, unavailable
from gateway.engines.redis.resp import RespConnection, open_connection
from gateway.engines.redis.scripts import Script

__all__ = ["LONELY_FOR", "REDIRECT_DEADLINE", "ClusterBatcher", "command_slot"]

#: Seconds a command keeps being sent again after redirections or a lost primary:
#: long enough for a replica to be promoted (a few ``cluster-node-timeout``s).
REDIRECT_DEADLINE: Final = 15.0
#: Seconds a primary whose WAIT timed out is not waited for (module docstring).
LONELY_FOR: Final = 5.0
_FIRST_PAUSE: Final = 0.02
_ASKING: Final = _pack_command(("ASKING",))
_MAX_PAUSE: Final = 0.5


def command_slot(command: tuple[Any, ...]) -> int | None:
    """The slot of ``command``'s first key; None for a script without KEYS."""
    name = command[0]
    name = name.decode() if isinstance(name, bytes) else str(name)
    if name.upper() in ("EVALSHA", "EVAL"):
        if int(command[2]) == 0:
            return None
        key = command[3]
    else:
        key = command[1]
    if isinstance(key, str):
        key = key.encode()
    elif isinstance(key, int):
        key = b"%d" % key
    return key_slot(key)


class ClusterBatcher(Batcher):
    """Batcher for a Redis Cluster; see the module docstring.

    Args:
        client: the cluster client (its slot map and node connections are used).
        scripts: every script the calls use, loaded on every primary.
        max_calls: the most calls in one batch.
        redirect_deadline: seconds a command keeps being sent again (see the
            module docstring).
    """

    def __init__(
        self,
        client: RedisCluster,
        scripts: Sequence[Script],
        *,
        max_calls: int = 512,
        redirect_deadline: float = REDIRECT_DEADLINE,
    ) -> None:
        # Batcher's own client is used only by the two methods overridden here.
        super().__init__(client, scripts, max_calls=max_calls)  # type: ignore[arg-type]
        self._cluster = client
        self._redirect_deadline = redirect_deadline
        #: Primaries whose last WAIT timed out, by name: until when (monotonic).
        self._lonely: dict[str, float] = {}
        #: The connection kept for each node, by name (see _send).
        self._connections: dict[str, RespConnection] = {}

    async def load_scripts(self) -> None:
        """SCRIPT LOAD every script on every primary.

        Raises:
            EngineUnavailable: the cluster cannot be reached.
        """
        try:
            if not self._cluster.nodes_manager.slots_cache:
                await self._cluster.initialize()
            for node in self._cluster.get_primaries():
                await self._send(node, [("SCRIPT", "LOAD", s.source) for s in self._scripts])
        except CONNECTION_ERRORS as exc:
            raise unavailable(exc) from exc

    async def _pipeline(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        if not self._cluster.nodes_manager.slots_cache:
            await self._cluster.initialize()
        replies: list[Any] = [None] * len(commands)
        todo = list(range(len(commands)))
        asking: dict[int, ClusterNode] = {}
        #: WAITs answered by a later WAIT on the same primary (see below).
        followers: dict[int, int] = {}
        deadline = time.monotonic() + self._redirect_deadline
        pause = _FIRST_PAUSE
        while True:
            groups: dict[str, tuple[ClusterNode, list[int]]] = {}
            waits: dict[str, list[int]] = {}
            previous: ClusterNode | None = None
            now = time.monotonic()
            #: Each WAIT, by the command it follows (sent again with it: below).
            wait_after: dict[int, int] = {}
            before = -1
            for index in todo:
                command = commands[index]
                if command[0] == "WAIT" and previous is not None:
                    wait_after[index] = before
                    if self._lonely.get(previous.name, 0.0) > now:
                        replies[index] = 0  # no replica to wait for (module docstring)
                        continue
                    # One WAIT at the end of a primary's pipeline waits for every
                    # write before it: the others of the batch share its reply.
                    waits.setdefault(previous.name, []).append(index)
                    continue
                node = asking.get(index) or self._node(command)
                previous, before = node, index
                groups.setdefault(node.name, (node, []))[1].append(index)
            for name, indices in waits.items():
                *shared, last = indices
                groups[name][1].append(last)
                for index in shared:
                    followers[index] = last
            results = await asyncio.gather(
                *(
                    # ASKING before a command for a slot the node owns changes nothing.
                    self._send(
                        node, [commands[i] for i in indices], ask=any(i in asking for i in indices)
                    )
                    for node, indices in groups.values()
                ),
                return_exceptions=True,
            )
            again: list[int] = []
            asking = {}
            for (node, indices), result in zip(groups.values(), results, strict=True):
                if isinstance(result, BaseException):
                    if not isinstance(result, CONNECTION_ERRORS):
                        raise result
                    again += indices
                    for index in indices:
                        replies[index] = result
                    continue
                for index, reply in zip(indices, result, strict=True):
                    replies[index] = reply
                    if commands[index][0] == "WAIT" and isinstance(reply, int):
                        if reply == 0:  # timed out: lonely for a while (module docstring)
                            self._lonely[node.name] = time.monotonic() + LONELY_FOR
                        else:
                            self._lonely.pop(node.name, None)
                    if isinstance(reply, MovedError | TryAgainError | ClusterDownError):
                        again.append(index)
                    elif isinstance(reply, AskError):
                        target = self._cluster.get_node(reply.host, reply.port)
                        if target is None:
                            again.append(index)
                        else:
                            asking[index] = target
                            again.append(index)
            # A write sent again (MOVED, ASK...) takes its WAIT along: the WAIT that
            # ran where the write was refused waited for nothing of it.
            retried = set(again)
            for wait, write in wait_after.items():
                if write in retried and wait not in retried:
                    again.append(wait)
                    followers.pop(wait, None)
            if not again:
                return _shared(replies, followers)
            if time.monotonic() >= deadline:
                # Callers read a reply starting CLUSTERDOWN as "Redis is unavailable".
                for index in again:
                    replies[index] = ResponseError(f"CLUSTERDOWN {replies[index]}")
                return _shared(replies, followers)
            if any(i not in asking for i in again):
                await asyncio.sleep(pause)
                pause = min(pause * 2, _MAX_PAUSE)
                # Every seed away for now: the next round tries again.
                with contextlib.suppress(*CONNECTION_ERRORS, ResponseError):
                    await self._cluster.nodes_manager.initialize()
            todo = sorted(again)  # a WAIT stays after the command it follows

    def _node(self, command: tuple[Any, ...]) -> ClusterNode:
        slot = command_slot(command)
        if slot is None:
            return self._cluster.get_primaries()[0]
        return self._cluster.nodes_manager.get_node_from_slot(slot)

    async def close(self) -> None:
        """As Batcher's, and the connection kept for each node is closed."""
        try:
            await super().close()
        finally:  # a caller's timeout too: what is still waiting fails as they close
            connections, self._connections = self._connections, {}
            for connection in connections.values():
                connection.close()

    async def _send(
        self, node: ClusterNode, commands: Sequence[tuple[Any, ...]], *, ask: bool = False
    ) -> list[Any]:
        """One raw pipeline on ``node``: one reply per command, errors as values.

        With ``ask``, each command is preceded by ASKING (its reply is dropped): the
        command is for a slot that ``node`` is importing.

        On a lean connection of its own per node (gateway/engines/redis/resp.py),
        made as the node's redis-py connections are and kept from one pipeline to
        the next; one that failed is closed, and the next pipeline opens another.
        """
        connection = self._connections.pop(node.name, None)
        if connection is None or connection.closed:
            connection = await open_connection(node.connection_class(**node.connection_kwargs))
        packed: list[bytes] = []
        for command in commands:
            if ask:
                packed.append(_ASKING)
            packed.append(_pack_command(command))
        try:
            replies = await connection.execute(b"".join(packed), len(packed))
            for reply in replies:
                # What redis-py raises rather than returns (LOADING, NOAUTH, too many
                # clients): this node cannot serve the connection now.
                if isinstance(reply, RedisConnectionError):
                    raise reply
        except BaseException:
            connection.close()  # lost, refused, or its waiter cancelled: never reuse it
            raise
        kept = self._connections.setdefault(node.name, connection)
        if kept is not connection:  # another send to this node meanwhile kept its own
            connection.close()
        # ASKING's own replies (OK: it cannot fail on a node that imports) are dropped.
        return replies[1::2] if ask else replies


def _shared(replies: list[Any], followers: dict[int, int]) -> list[Any]:
    for index, last in followers.items():
        replies[index] = replies[last]
    return replies
