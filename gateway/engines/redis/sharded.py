"""Sharded pub/sub on a Redis Cluster: SSUBSCRIBE per primary, followed as slots move.

Why sharded: a classic ``PUBLISH`` on a cluster is repeated to every node
(redis/redis#2672), so the cluster's pub/sub throughput is one node's however
many it has. ``SPUBLISH`` goes to the primary serving the channel's slot (and
its replicas) only; a subscriber ``SSUBSCRIBE``s there. A channel is a key as
far as slots go, so the channels must be spread over slots, or every message
lands on one primary and the others idle (centrifugal/centrifuge#554):
:func:`shard_channels` names ``count`` channels for one purpose, each with a
hash tag that puts it in a different slot, and :func:`shard_of` picks the one a
name belongs to (the same name, the same channel: per-name order is kept).

:class:`ShardedSubscriber` has the interface of
:class:`gateway.engines.redis.pubsub.Subscriber` (``start``, ``join``,
``leave``, ``close``, and ``on_message(channel, data)``) and holds one
connection per primary that serves a wanted channel.

*Slots move.* When a slot migrates or its primary fails over, Redis tells the
subscribers of its channels nothing useful: it sends an unannounced
``sunsubscribe`` (the slot left the node), or the connection drops (the
primary died), or a new ``SSUBSCRIBE`` is answered ``MOVED``. Each of those
makes the subscriber reload the slot map and subscribe the channel again where
it lives now, with backoff until that works, then call ``on_reconnect`` (the
engine wakes its waiters, since wake-ups may have been lost meanwhile). Several
clients got exactly this wrong (StackExchange.Redis#2969, node-redis#3098): a
subscriber that treats an unannounced ``sunsubscribe`` as final goes silent for
good. What was published while a channel was being moved is lost, as for any
pub/sub subscriber that is offline.

*Idle channels.* A shard channel may carry nothing for a long time. Each link
reads with a float timeout of ``health_interval`` (redis-py then returns None
and keeps any partial reply buffered), PINGs after that much silence (PING is
allowed in subscribed mode; its reply is ``[b"pong", b""]``), and counts the
connection lost only when the PING gets no reply for as long again: the
policy of :class:`gateway.engines.redis.pubsub.Subscriber`. Without a timeout
of its own, a read falls back to the connection's ``socket_timeout`` (the
command timeout) and raised on every idle channel, which dropped and placed
the link again, losing what was published meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Callable, Iterable
from typing import Any, Final

from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.crc import key_slot
from redis.exceptions import ResponseError

from gateway.engines.base import EngineUnavailable
from gateway.engines.redis.batch import CONNECTION_ERRORS, unavailable
from gateway.engines.redis.pubsub import HEALTH_INTERVAL
from gateway.tasks import cancel_and_wait

__all__ = ["ShardedSubscriber", "shard_channels", "shard_of", "spread"]

_log = logging.getLogger(__name__)

_SMESSAGE: Final = b"smessage"
_SSUBSCRIBE: Final = b"ssubscribe"
_SUNSUBSCRIBE: Final = b"sunsubscribe"
#: First and longest pause between attempts to place a moved channel again.
_RETRY_DELAY: Final = 0.05
_MAX_RETRY_DELAY: Final = 1.0


def shard_channels(base: str, count: int) -> list[bytes]:
    """``count`` channels ``base{0}`` ... whose hash tags put them in different slots."""
    names: list[bytes] = []
    slots: set[int] = set()
    tag = 0
    while len(names) < count:
        name = f"{base}{{{tag}}}".encode()
        slot = key_slot(name)
        if slot not in slots:
            slots.add(slot)
            names.append(name)
        tag += 1
    return names


def spread(name: str | bytes, count: int) -> int:
    """Which of ``count`` shards ``name`` belongs to (stable across runs and brokers).

    BLAKE2b, not CRC-32: a CRC is linear, so names that differ in one character
    and share a long suffix (``vq0@/topic/.*``, ``vq1@/topic/.*``) differ by a
    fixed pattern whose low bits are often zero, and land in the same shard.
    """
    raw = name.encode() if isinstance(name, str) else name
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest()) % count


def shard_of(channels: list[bytes], name: str | bytes) -> bytes:
    """The channel of ``channels`` that ``name`` is published on (stable across runs)."""
    return channels[spread(name, len(channels))]


class _NodeLink:
    """One subscribed connection to one primary, and the channels held on it."""

    def __init__(self, owner: ShardedSubscriber, node: ClusterNode) -> None:
        self.owner = owner
        self.node = node
        self.channels: set[bytes] = set()
        self.confirming: dict[bytes, asyncio.Future[None]] = {}
        self.connection: AbstractConnection | None = None
        self.reader: asyncio.Task[None] | None = None
        self.lock = asyncio.Lock()

    async def subscribe(self, channel: bytes) -> None:
        async with self.lock:
            if self.connection is None:
                connection = self.node.connection_class(**self.node.connection_kwargs)
                try:
                    await connection.connect()  # type: ignore[no-untyped-call]  # upstream
                except BaseException:
                    # A connect that failed or was cancelled after the socket opened
                    # (a primary silent mid-handshake) must not leave it to the GC.
                    with contextlib.suppress(*CONNECTION_ERRORS):
                        await connection.disconnect()
                    raise
                self.connection = connection
                self.reader = asyncio.get_running_loop().create_task(self._read(connection))
            confirming = self.confirming.get(channel)
            if confirming is None:
                confirming = asyncio.get_running_loop().create_future()
                self.confirming[channel] = confirming
                await self.connection.send_command("SSUBSCRIBE", channel, check_health=False)
        await asyncio.shield(confirming)
        self.channels.add(channel)

    async def ping(self, connection: AbstractConnection) -> None:
        # Under the lock: a PING must not interleave with an SSUBSCRIBE being written.
        async with self.lock:
            await connection.send_command("PING", check_health=False)

    async def unsubscribe(self, channel: bytes) -> None:
        # The lock orders this after any SSUBSCRIBE being written; a channel
        # joined again meanwhile stays.
        async with self.lock:
            if self.owner.wants(channel):
                return
            self.channels.discard(channel)
            if self.connection is not None:
                with contextlib.suppress(*CONNECTION_ERRORS):
                    await self.connection.send_command("SUNSUBSCRIBE", channel, check_health=False)

    async def close(self) -> None:
        reader, self.reader = self.reader, None
        connection, self.connection = self.connection, None
        if reader is not None:
            await cancel_and_wait(reader, ignore=CONNECTION_ERRORS)
        if connection is not None:
            with contextlib.suppress(*CONNECTION_ERRORS):
                await connection.disconnect()
        self._fail_confirming(EngineUnavailable("the Redis pub/sub connection is closed"))

    def _fail_confirming(self, error: BaseException) -> None:
        confirming, self.confirming = self.confirming, {}
        for future in confirming.values():
            if not future.done():
                future.set_exception(error)
                future.exception()  # each waiter gets its own raise

    async def _read(self, connection: AbstractConnection) -> None:
        interval = self.owner.health_interval
        pinged = False  # a PING is pending: the next silence is a lost connection
        try:
            while True:
                try:
                    # A float timeout: None after that much silence, never a
                    # TimeoutError from the connection's socket_timeout.
                    reply: Any = await connection.read_response(timeout=interval, push_request=True)
                except ResponseError as exc:
                    # MOVED to an SSUBSCRIBE: the slot map was stale. Its joiner hears
                    # it and places the channel again (after reloading the map).
                    self._fail_confirming(exc)
                    continue
                if reply is None:
                    if pinged:
                        raise ConnectionError(f"no reply to PING for {interval:g} seconds")
                    pinged = True
                    await self.ping(connection)  # any reply proves the connection alive
                    continue
                pinged = False
                if not isinstance(reply, list) or not reply:
                    continue
                kind = reply[0]
                if kind == _SMESSAGE:
                    self.owner._deliver(reply[1], reply[2])
                elif kind == _SSUBSCRIBE:
                    channel = reply[1]
                    # Held here from now on, even if its joiner gave up waiting (a
                    # fetch cancelled), so that a leave finds it and unsubscribes.
                    self.channels.add(channel)
                    confirming = self.confirming.pop(channel, None)
                    if confirming is not None and not confirming.done():
                        confirming.set_result(None)
                    if not self.owner.wants(channel):
                        self.owner._spawn(self.unsubscribe(channel))
                elif kind == _SUNSUBSCRIBE:
                    channel = reply[1]
                    # Ours (leave) or the slot's (it moved): only a wanted one goes back.
                    if channel in self.channels and self.owner.wants(channel):
                        self.channels.discard(channel)
                        self.owner._moved(self, {channel})
        except CONNECTION_ERRORS as exc:
            _log.warning("Redis shard pub/sub to %s lost: %s", self.node.name, exc)
            self._fail_confirming(unavailable(exc))
            channels, self.channels = set(self.channels), set()
            self.connection = None
            with contextlib.suppress(*CONNECTION_ERRORS):
                await connection.disconnect()
            self.owner._moved(self, channels, lost=True)


class ShardedSubscriber:
    """Shard channels held on the primaries serving them; see the module docstring.

    Args:
        client: the cluster client (its slot map, reloaded as slots move).
        on_message: called with ``(channel, data)`` for every message.
        on_reconnect: called after channels were subscribed again somewhere else.
        health_interval: seconds of silence on a primary's connection before a
            PING, and then before the connection counts as lost.
    """

    def __init__(
        self,
        client: RedisCluster,
        on_message: Callable[[bytes, bytes], None],
        on_reconnect: Callable[[], None],
        *,
        health_interval: float = HEALTH_INTERVAL,
    ) -> None:
        self._client = client
        self.health_interval = health_interval
        self._on_message = on_message
        self._on_reconnect = on_reconnect
        self._wanted: dict[bytes, int] = {}
        self._links: dict[str, _NodeLink] = {}
        self._moving: set[bytes] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        #: Set each time moved channels were placed again (for tests and metrics).
        self.replaced = 0

    def wants(self, channel: bytes) -> bool:
        """Whether ``channel`` is still subscribed by someone here."""
        return channel in self._wanted and not self._closed

    async def start(self, channels: Iterable[bytes]) -> None:
        """Subscribe to ``channels`` for good.

        Raises:
            EngineUnavailable: the cluster cannot be reached.
        """
        if not self._client.nodes_manager.slots_cache:
            await self._client.initialize()
        await asyncio.gather(*(self.join(channel) for channel in channels))

    async def join(self, channel: bytes, *, timeout: float = 0.0) -> None:
        """Hold a subscription to ``channel``; returns once its primary confirmed it.

        Raises:
            EngineUnavailable: the primary cannot be reached (the reference is not kept).
        """
        self._wanted[channel] = self._wanted.get(channel, 0) + 1
        if self._wanted[channel] > 1 and channel not in self._moving:
            # Joined already: wait for the SSUBSCRIBE in flight, if any, so that
            # this joiner too returns only once the channel is confirmed (a
            # wake-up published after join returns cannot be missed).
            confirming = self._confirming(channel)
            if confirming is not None:
                try:
                    await asyncio.shield(confirming)
                except BaseException:
                    self._release(channel)
                    raise
            return
        try:
            await self._place(channel)
        except BaseException:
            self._release(channel)
            raise

    def leave(self, channel: bytes) -> None:
        """Drop one reference; the last one unsubscribes (in the background)."""
        if self._release(channel):
            for link in self._links.values():
                if channel in link.channels:
                    self._spawn(link.unsubscribe(channel))

    async def close(self) -> None:
        """Unsubscribe from everything and disconnect."""
        self._closed = True
        tasks, self._tasks = set(self._tasks), set()
        for task in tasks:
            task.cancel()
        for task in tasks:
            await cancel_and_wait(task, ignore=(Exception,))
        links, self._links = self._links, {}
        for link in links.values():
            await link.close()

    def _confirming(self, channel: bytes) -> asyncio.Future[None] | None:
        for link in self._links.values():
            confirming = link.confirming.get(channel)
            if confirming is not None:
                return confirming
        return None

    def _release(self, channel: bytes) -> bool:
        count = self._wanted.get(channel, 0) - 1
        if count > 0:
            self._wanted[channel] = count
            return False
        self._wanted.pop(channel, None)
        return True

    async def _place(self, channel: bytes) -> None:
        node = self._client.nodes_manager.get_node_from_slot(key_slot(channel))
        link = self._links.get(node.name)
        if link is None:
            link = self._links[node.name] = _NodeLink(self, node)
        try:
            await link.subscribe(channel)
        except CONNECTION_ERRORS as exc:
            raise unavailable(exc) from exc
        except ResponseError as exc:  # MOVED: the map was stale; reload it for the retry
            with contextlib.suppress(*CONNECTION_ERRORS, ResponseError):
                await self._client.nodes_manager.initialize()
            raise unavailable(exc) from exc

    def _deliver(self, channel: bytes, data: bytes) -> None:
        try:
            self._on_message(channel, data)
        except Exception:  # the edge: a bad message or listener must not stop the reader
            _log.exception("Redis shard pub/sub message on %r not handled", channel)

    def _moved(self, link: _NodeLink, channels: set[bytes], *, lost: bool = False) -> None:
        if lost and self._links.get(link.node.name) is link:
            del self._links[link.node.name]
        wanted = {channel for channel in channels if self.wants(channel)} - self._moving
        if wanted and not self._closed:
            self._moving |= wanted
            self._spawn(self._replace(wanted))

    async def _replace(self, channels: set[bytes]) -> None:
        delay = _RETRY_DELAY
        pending = set(channels)
        try:
            while pending and not self._closed:
                with contextlib.suppress(*CONNECTION_ERRORS, ResponseError):
                    await self._client.nodes_manager.initialize()
                for channel in sorted(pending):
                    if not self.wants(channel):
                        pending.discard(channel)
                        continue
                    try:
                        await self._place(channel)
                    except EngineUnavailable:
                        continue
                    pending.discard(channel)
                if pending:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, _MAX_RETRY_DELAY)
        finally:
            self._moving -= channels
        if not self._closed:
            self.replaced += 1
            _log.info("Redis shard pub/sub: %d channels subscribed again", len(channels))
            self._on_reconnect()

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
