"""The ``redis`` engine: durable queues and topics shared by many brokers.

Every broker of a cluster runs a :class:`RedisEngine` on the same Redis. Queued
messages live in Redis, so they survive a broker's restart, and with the AOF on
(``appendfsync always``) a Redis restart too: Redis fsyncs before it replies, and
``enqueue`` returns only after the reply.

Theory of operation
-------------------
Keys (``Q`` is a queue's name, a virtual queue's being ``name@pattern``)::

    asbp:queues              set     every queue and virtual queue (max_queues)
    asbp:vqueues             hash    virtual queue full name -> pattern
    {asbp:vqueues}:version   string  bumped when a virtual queue is declared
    asbp:q:Q:s0 .. s9        stream  the messages of priority 0..9; group "asbp"
    asbp:q:Q:l0 .. l9        zset    leases: one batch per fetch call ("<tag>") by deadline (ms)
    asbp:q:Q:lb              hash    "<priority>:<tag>" -> the batch's lease tokens
    asbp:q:Q:dl              zset    delayed messages (msgpack of the fields) by not_before
    asbp:q:Q:wt              string  set while a consumer waits for Q
    {asbp:vqueues}:expiry    zset    queues by when they next need the sweep
    channels: asbp:topics, asbp:notices:<broker id>, asbp:wake:Q
              (on a Redis Cluster: asbp:{q<j>}:notices:<broker id>, asbp:{q<j>}:wake:Q)

Every suffix has two characters, so no two queues' keys can collide whatever
``:`` their names hold.

On a Redis Cluster (``redis+cluster://``) the same keys carry hash tags so that
each script touches one slot (:mod:`gateway.engines.redis.layout`): a queue's
keys are ``asbp:{q<j>}:q:Q:*``, ``j`` its shard (one of 64, by a hash of its
name), beside the shard's own expiry index ``asbp:{q<j>}:expiry``; the registry
is ``{asbp:vqueues}:queues``, in the virtual queues' slot; topics go to 16
shard channels ``asbp:topics:{n}`` (``SPUBLISH``), a topic always to the same;
notices and wake-ups go out with ``SPUBLISH`` on their queue's shard channel
(``asbp:{q<j>}:notices:<broker id>``, ``asbp:{q<j>}:wake:Q``).

*A queue* is ten streams, one per priority, each with one consumer group. A
message is a stream entry (fields ``h`` header, ``p`` payload, ``x`` expiration,
and ``n`` its notice spec when it has one; see :mod:`~gateway.engines.redis.codec`).
``fetch`` walks the priorities from 9 down and, in each, first reclaims leases
past their deadline (XCLAIM, which also counts the delivery in the group's
pending list), then reads new entries (XREADGROUP ``>``): highest priority
first, FIFO within one, a returning lease ahead of newer messages. Expired
entries met on the way leave (XACK + XDEL, EXPIRED notice); a lease ending after
``max_deliveries`` deliveries is discarded (DISCARDED notice). Delayed messages
wait in a sorted set and join their stream when a fetch finds them due. All of
that is one Lua script call (:mod:`~gateway.engines.redis.scripts`): one round
trip for ``fetch(count=100)``.

*Leases* are the group's pending entries, plus, per priority, a sorted set of
*batches* by deadline on the engine's clock: everything one ``fetch`` call leased
at one priority is one batch, named by the call's random tag, with one member in
``l<p>`` and its list of lease tokens in the ``lb`` hash (field ``<p>:<tag>``).
A token is the entry's stream id on its first delivery, ``<stream id>:<count>``
on a later one. One member and one list per batch, not one member per message,
because what Redis does per message is what limits a bus of brokers sharing it:
a ZADD of 100 members cost the fetch script as much as its XREADGROUP, and the
ack script as much again to find and remove them (bench/queues.py). The design
the issue sketched used XAUTOCLAIM with a minimum idle time; the sorted set
replaces it because

- deadlines follow the broker's clock (``Delivery.deadline`` is what the broker
  promised, and tests inject a clock), not Redis's idle timer;
- a fetch finds every ended batch by one ZRANGEBYSCORE instead of scanning the
  pending list, and a waiting consumer learns when the next lease ends;
- ``ack`` checks its receipts batch by batch: one ZSCORE says whether the batch's
  lease is live, one HGET what it still holds. A receipt is live when its token
  is in the list, which it leaves when acknowledged, released or reclaimed; so a
  receipt given twice counts once, and one from before a redelivery, or past its
  deadline, counts 0.

A batch leaves when its list is empty. A release moves its tokens to the batch
``<tag>:r`` scored 0, and a fetch that reclaims part of the ended batches leaves
the rest in ``<tag>:x``: no receipt names those (a receipt's tag has no ``:``),
and both are past their deadline, first in line for the next fetch. Ended
batches come back by deadline, then in stream order.

The delivery count itself is the pending list's counter, read back with
XPENDING after each XCLAIM. ``ack`` is XACK + XDEL of every live receipt, by
priority, in one script.

*Expiry.* A fetch removes the expired messages it meets; a sweeper removes the
others, so that a queue nobody consumes still loses its expired messages near
their expiration (:mod:`gateway.engines.redis.expiry`).

*Topics* are one pub/sub channel that every engine subscribes to. Regular
expression subscriptions live in the broker, which must see every topic
message to match them; per-topic channels with PSUBSCRIBE would have every
broker PSUBSCRIBE to ``*`` anyway and make Redis match a pattern per publish.
The cost of one channel: every broker receives every topic message, and drops
those nobody subscribed to. A topic message names its engine (``origin``), so
the publishing engine skips its own copy and hands the message to its own
listeners directly (on the next loop iteration).

*Virtual queues* are stored in a hash that every engine caches, with the
matching compiled (:class:`~gateway.engines.topic_patterns.TopicMatcher`). The
publishing engine copies a topic message into each matching virtual queue, in
the same script that publishes it, so each copy is made once across all
brokers. The script first compares the cache's version with Redis's and does
nothing if they differ; the engine then reloads the cache and tries again. So a
publication that starts after ``declare_virtual_queue`` returned (on any broker)
always feeds the new queue, and a cache costs no round trip of its own.

*Delivery notices* go to ``asbp:notices:<broker id>``, the id being the first
segment of the message's ``notify`` address (``"<broker id>/..."``, see
``Message.notify``). The scripts publish them where the event happens, so the
publishing broker hears of an acknowledgement made on another broker. Pub/sub
keeps nothing for an absent subscriber: a notice is lost if the publishing
broker is down or reconnecting, which is also when the channel it would go to
is gone.

*Waiting* (``fetch(wait=...)``) never polls and never blocks a pooled
connection. A consumer that found nothing subscribes to ``asbp:wake:Q`` (the
engine's one pub/sub connection) and fetches again with the ``arm`` flag: if
that finds nothing too, the script sets ``asbp:q:Q:wt``. Every script that
makes a message deliverable (enqueue, publish into a virtual queue, release)
deletes the flag and publishes a wake-up if it was set, so one PUBLISH per idle
period, not per message. The subscription is confirmed before the armed fetch,
so a wake-up cannot fall between them. Delayed messages and lease deadlines
need no wake-up: the fetch script returns the earliest of them, and the
consumer sleeps no longer than that.

*Batching.* Every operation goes through a :class:`~gateway.engines.redis.batch.Batcher`:
concurrent calls share one pipeline, and concurrent ``enqueue`` (or ``ack``)
calls on one queue become one script call. Calls reach Redis in the order they
were made (one flusher, pipelines one after another, merged calls in order),
so a caller may keep several ``enqueue`` calls to a queue in flight, without
awaiting each before making the next, and they are still stored in the order
made. That is what lets batching help a single publisher: one awaited
``enqueue`` at a time costs a round trip each.

*Consumers.* Redis records leases under one consumer name per engine,
``consumer_prefix`` or the broker id: a consumer group never forgets a consumer
by itself, and per-channel names would pile up forever. The ``consumer``
argument of ``fetch`` is therefore not stored; receipts, not names, identify
leases.

*On a Redis Cluster* every call goes to the primary of its slot
(:mod:`gateway.engines.redis.cluster`), and what spans slots is split out of
the per-message scripts (:mod:`gateway.engines.redis.layout`): a queue is
registered once per engine before its first enqueue there
(:mod:`gateway.engines.redis.registry`); a topic publication reads the
virtual-queue version, then copies with one script call per shard its virtual
queues live in and publishes on its shard channel, which every engine holds
with ``SSUBSCRIBE`` (:mod:`gateway.engines.redis.sharded`, following slot moves
and failovers); the scripts publish notices and wake-ups with ``SPUBLISH`` on
their shard's channels (a classic ``PUBLISH`` is repeated to every node,
redis/redis#2672): each broker holds its notice channel of every shard, a
waiting consumer its queue's wake-up channel, all on the sharded subscriber.
Each enqueue and copy is followed by ``WAIT 1 1000`` on its primary,
so an accepted message is on a replica too (or a second passed without one:
docs/kubernetes.md, "Durability on a cluster").
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar

from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import AbstractConnection

from gateway.engines.base import (
    Delivery,
    EngineLimits,
    EngineUnavailable,
    Message,
    NoticeListener,
    QueuedMessage,
    QueueStats,
    TopicListener,
)
from gateway.engines.redis.batch import Batcher, Call
from gateway.engines.redis.calls import (
    NOTICES,
    TOPICS,
    VQ_VERSION,
    VQUEUES,
    CommandCall,
    CopyCall,
    EnqueueCall,
    FetchCall,
    FutureCall,
    LeasesCall,
    PublishCall,
    QueueKeys,
    Stored,
    VersionCall,
    script_command,
)
from gateway.engines.redis.cluster_url import is_cluster_url
from gateway.engines.redis.codec import (
    ORIGIN_BYTES,
    notice_spec,
    pack_header,
    parse_notice,
    receipt_token,
    unpack_topic,
)
from gateway.engines.redis.connection import Client, batcher, broadcast_connection, connect
from gateway.engines.redis.expiry import DEFAULT_SWEEP_INTERVAL, SWEEP_BUDGET, Sweeper
from gateway.engines.redis.inspection import Inspector
from gateway.engines.redis.layout import KeyLayout, cluster_layout, single_layout
from gateway.engines.redis.pubsub import HEALTH_INTERVAL, Subscriber, Wakeups
from gateway.engines.redis.registry import Registrations
from gateway.engines.redis.scripts import DECLARE, DEPTH, LOAD_VIRTUAL_QUEUES, SCRIPTS
from gateway.engines.redis.sharded import ShardedSubscriber, shard_of
from gateway.engines.topic_patterns import (
    InvalidVirtualQueue,
    TopicMatcher,
    parse_virtual_queue,
    virtual_queue,
)

__all__ = ["DEFAULT_SWEEP_INTERVAL", "MAX_FETCH", "SWEEP_BUDGET", "RedisEngine"]

_log = logging.getLogger(__name__)

#: The most messages one ``fetch`` leases (a larger ``count`` is cut to it).
MAX_FETCH: Final = 1000
#: Seconds to connect, and to wait for a reply, before Redis counts as unavailable.
CONNECT_TIMEOUT: Final = 5.0
COMMAND_TIMEOUT: Final = 10.0

_TOPICS_BYTES: Final = TOPICS.encode()
_PRIORITIES: Final = range(10)

T = TypeVar("T")


class RedisEngine:
    """Topics, queues and virtual queues in Redis; see the module docstring.

    Args:
        url: where Redis is (``redis://host:port/db``, ``rediss://`` for TLS,
            ``unix://``); redis-py's URL options (``socket_timeout=``...) apply.
        broker_id: this broker's id, the first segment of the ``notify``
            addresses it gives its messages.
        limits: the bounds to enforce; every broker sharing a Redis should use
            the same.
        clock: wall-clock seconds since the epoch.
        consumer_prefix: the consumer name Redis records this engine's leases
            under (default: ``broker_id``).
        sweep_interval: seconds between sweeps for expired messages, at most;
            None: no sweeper task (tests that call :meth:`sweep` themselves).
        pubsub_health_interval: seconds of silence on the pub/sub connection
            before it is PINGed, and then before it counts as lost and is
            replaced (see :class:`~gateway.engines.redis.pubsub.Subscriber`).
    """

    def __init__(
        self,
        url: str,
        *,
        broker_id: str,
        limits: EngineLimits = EngineLimits(),  # noqa: B008  # frozen, so sharing it is safe
        clock: Callable[[], float] = time.time,
        consumer_prefix: str | None = None,
        sweep_interval: float | None = DEFAULT_SWEEP_INTERVAL,
        pubsub_health_interval: float = HEALTH_INTERVAL,
    ) -> None:
        self._url = url
        self._pubsub_health_interval = pubsub_health_interval
        self._broker_id = broker_id
        self._limits = limits
        self._clock = clock
        self._consumer = consumer_prefix if consumer_prefix is not None else broker_id
        self._origin = uuid.uuid4().bytes
        assert len(self._origin) == ORIGIN_BYTES
        self._topic_listeners: list[TopicListener] = []
        self._notice_listeners: list[NoticeListener] = []
        self._keys_cache: dict[str, QueueKeys] = {}
        # Where the keys live: gateway/engines/redis/layout.py (one Redis, or a
        # cluster's shards; the registration of queues apart on a cluster).
        self._layout: KeyLayout = cluster_layout() if is_cluster_url(url) else single_layout()
        self._topic_channels = list(self._layout.topic_channels)
        self._registrations = (
            Registrations(
                self._submit,
                self._layout.registry,
                limits.max_queues,
                remembered=4 * limits.max_queues,
            )
            if self._layout.cluster
            else None
        )
        self._sharded: ShardedSubscriber | None = None
        self._client: Client | None = None
        self._pubsub_attempts = 0
        self._batcher: Batcher | None = None
        self._subscriber: Subscriber | None = None
        self._wakeups: Wakeups | None = None
        self._vq_version: bytes | None = None
        self._vq_matcher = TopicMatcher()
        self._vq_loading: asyncio.Future[None] | None = None
        self._sweep_interval = sweep_interval
        self._sweeper = Sweeper(self._submit, self._keys, clock, self._layout.expiries)
        self._inspector = Inspector(self._submit, self._keys, limits, clock)
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- life cycle --------------------------------------------------------

    async def start(self) -> None:
        """Connect, load the scripts and subscribe.

        Raises:
            EngineUnavailable: Redis cannot be reached.
        """
        # One Redis or a cluster (``redis+cluster://``): gateway/engines/redis/connection.py.
        client = connect(
            self._url, connect_timeout=CONNECT_TIMEOUT, command_timeout=COMMAND_TIMEOUT
        )
        self._loop = asyncio.get_running_loop()
        self._client = client
        self._batcher = batcher(client, SCRIPTS)
        notices = self._layout.notice_channels(self._broker_id)
        try:
            await self._batcher.load_scripts()
            if isinstance(client, RedisCluster):
                # Everything on sharded pub/sub: a classic PUBLISH is repeated to
                # every node. The scripts SPUBLISH notices and wake-ups on their
                # shard's channels (layout.py), so a broker holds its notice
                # channel of every shard and a waiter its queue's wake-up channel.
                sharded = ShardedSubscriber(
                    client,
                    self._on_message,
                    self._on_reconnect,
                    health_interval=self._pubsub_health_interval,
                )
                self._sharded = sharded
                self._wakeups = Wakeups(sharded, self._layout.wake_channel)
                await sharded.start([*self._topic_channels, *notices])
            else:
                subscriber = Subscriber(
                    self._new_connection,
                    self._on_message,
                    self._on_reconnect,
                    health_interval=self._pubsub_health_interval,
                )
                self._subscriber = subscriber
                self._wakeups = Wakeups(subscriber, self._layout.wake_channel)
                await subscriber.start([_TOPICS_BYTES, *notices])
        except BaseException:
            await self.close()
            raise
        if self._sweep_interval is not None:
            self._sweeper.start(self._sweep_interval)

    async def close(self) -> None:
        """Write what was submitted, stop listening and disconnect (idempotent).

        A ``fetch`` still waiting wakes up and raises EngineUnavailable.
        """
        await self._sweeper.stop()
        if self._batcher is not None:
            await self._batcher.close()
        if self._wakeups is not None:
            self._wakeups.wake_all()
        subscriber, self._subscriber = self._subscriber, None
        if subscriber is not None:
            await subscriber.close()
        sharded, self._sharded = self._sharded, None
        if sharded is not None:
            await sharded.close()
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    # -- topics ------------------------------------------------------------

    def listen(self, listener: TopicListener) -> None:
        """Receive every topic message published on any broker sharing the Redis."""
        self._topic_listeners.append(listener)

    async def publish(self, message: Message) -> None:
        """Publish to the topic and copy into matching virtual queues (one script call).

        On a Redis Cluster: a version check, then one call per shard of the
        copies and the publication on its shard channel (layout.py).
        """
        if self._layout.cluster:
            await self._publish_sharded(message)
            return
        header = pack_header(message)
        stored = None
        while True:
            version = self._vq_version
            if version is None:
                await self._load_virtual_queues()
                continue
            targets = self._vq_matcher.match(message.destination)
            if targets and stored is None:
                stored = self._stored_fields(message)
            call = PublishCall(
                self._origin + header,
                # Without copies the stored form is not needed: only its payload.
                stored or (message.priority, "", "", b"", message.payload, ""),
                [(name, self._keys(name)) for name in targets],
                version,
                limits=self._limits,
                clock=self._clock,
            )
            if await self._submit(call):
                break
            if self._vq_version == version:  # stale: reload, unless another call did
                self._vq_version = None
        loop = asyncio.get_running_loop()
        for listener in self._topic_listeners:
            loop.call_soon(listener, message)

    async def _publish_sharded(self, message: Message) -> None:
        header = pack_header(message)
        while True:
            version = self._vq_version
            if version is None:
                await self._load_virtual_queues()
                continue
            # The version is checked before anything is written, so a retry after
            # a stale cache copies nothing twice; a declaration that returned
            # before this publication started has bumped it already.
            if await self._version() == version:
                break
            if self._vq_version == version:  # stale: reload, unless another call did
                self._vq_version = None
        topic = self._origin + header + b"\n" + message.payload
        channel = shard_of(self._topic_channels, message.destination)
        writes: list[asyncio.Future[Any]] = [
            self._submit(CommandCall(("SPUBLISH", channel, topic)))
        ]
        targets = self._vq_matcher.match(message.destination)
        if targets:
            writes += self._copy(self._stored_fields(message), targets)
        await asyncio.gather(*writes)
        loop = asyncio.get_running_loop()
        for listener in self._topic_listeners:
            loop.call_soon(listener, message)

    def _copy(self, stored: Stored, targets: Sequence[str]) -> list[asyncio.Future[None]]:
        """Copy into ``targets``: one call per shard, joining one waiting for the pipeline."""
        shards: dict[str, list[tuple[str, QueueKeys]]] = {}
        for name in targets:
            keys = self._keys(name)
            # A shard's expiry index names it, and comes with the cached keys.
            shards.setdefault(keys.expiry, []).append((name, keys))
        batcher = self._batcher
        futures: list[asyncio.Future[None]] = []
        for shard_targets in shards.values():
            future: asyncio.Future[None] = self._running_loop().create_future()
            futures.append(future)
            key = ("copy", *(name for name, _ in shard_targets))
            waiting = None if batcher is None else batcher.waiting(key)
            if waiting is not None:
                assert isinstance(waiting, CopyCall)
                waiting.add(stored, future)
            else:
                call = CopyCall(
                    stored, shard_targets, future, limits=self._limits, clock=self._clock
                )
                self._submit_call(call)
        return futures

    def _version(self) -> asyncio.Future[bytes]:
        """The virtual-queue version, read in the next pipeline (shared by callers)."""
        batcher = self._batcher
        waiting = None if batcher is None else batcher.waiting(VersionCall.merge_key)
        if waiting is not None:
            assert isinstance(waiting, VersionCall)
            return waiting.future
        return self._submit(VersionCall())

    # -- queues ------------------------------------------------------------

    def enqueue(self, message: Message) -> asyncio.Future[None]:
        """Store ``message`` in its queue; done once Redis has it (and, with AOF, fsynced it).

        A plain method returning the future the batcher settles, not a coroutine:
        the broker makes one call per queue publication, and a coroutine, with the
        task or callbacks that drive it, would cost more than the rest of the call.
        The call is submitted before this returns, so calls made one after another
        reach Redis in that order.

        Raises (from the future):
            QueueLimitReached: the queue is new and there are max_queues already.
            QueueFull: the queue holds max_queue_depth messages already.
            ValueError: the priority is outside 0 to 9.
            EngineUnavailable: Redis cannot be reached.
        """
        future: asyncio.Future[None] = self._running_loop().create_future()
        registrations = self._registrations
        if registrations is not None and not registrations.known(message.destination):
            # A Redis Cluster: register the queue first (registry.py).
            registrations.hold(
                message.destination, lambda error: self._enqueue_held(message, future, error)
            )
            return future
        self._enqueue_into(message, future)
        return future

    def _enqueue_held(
        self, message: Message, future: asyncio.Future[None], error: BaseException | None
    ) -> None:
        if error is not None:
            if not future.done():
                future.set_exception(error)
        elif not future.done():
            self._enqueue_into(message, future)

    def _enqueue_into(self, message: Message, future: asyncio.Future[None]) -> None:
        queue = message.destination
        try:
            stored = self._stored_fields(message)
            keys = self._keys(queue)
            batcher = self._batcher
            waiting = None if batcher is None else batcher.waiting(keys.enqueue)
            if waiting is not None:
                assert isinstance(waiting, EnqueueCall)
                waiting.add(stored, future)  # joins the call waiting for the next pipeline
            else:
                self._submit_call(
                    EnqueueCall(queue, keys, stored, future, limits=self._limits, clock=self._clock)
                )
        except Exception as exc:
            future.set_exception(exc)

    async def fetch(
        self, queue: str, consumer: str, *, count: int = 1, wait: float = 0.0
    ) -> list[Delivery]:
        """Lease up to ``count`` (at most MAX_FETCH) messages; see ``Engine.fetch``."""
        if count < 1:
            return []
        count = min(count, MAX_FETCH)
        loop = asyncio.get_running_loop()
        end = loop.time() + wait
        event: asyncio.Event | None = None
        wakeups = self._wakeups
        keys = self._keys(queue)
        try:
            while True:
                if event is not None:
                    event.clear()
                call = FetchCall(
                    queue,
                    keys,
                    count,
                    consumer=self._consumer,
                    armed=event is not None,
                    limits=self._limits,
                    clock=self._clock,
                )
                deliveries, more, next_due = await self._submit(call)
                if deliveries:
                    return deliveries
                if more:
                    continue
                remaining = end - loop.time()
                if remaining <= 0:
                    return []
                if event is None:
                    assert wakeups is not None
                    event = await wakeups.join(queue, timeout=remaining)
                    continue  # look again, armed: a wake-up can no longer be missed
                if next_due is not None:
                    remaining = min(remaining, next_due - self._clock())
                if remaining > 0:
                    try:
                        async with asyncio.timeout(remaining):
                            await event.wait()
                    except TimeoutError:
                        pass
        finally:
            if event is not None and wakeups is not None:
                wakeups.leave(queue, event)

    def ack(self, queue: str, receipts: Sequence[str]) -> asyncio.Future[int]:
        """Acknowledge leases; how many were live (a future, as ``enqueue`` returns)."""
        return self._settle_leases(queue, receipts, release=False)

    def release(self, queue: str, receipts: Sequence[str]) -> asyncio.Future[int]:
        """End leases early; their messages are deliverable again at once."""
        return self._settle_leases(queue, receipts, release=True)

    # -- virtual queues ----------------------------------------------------

    async def declare_virtual_queue(self, name: str, pattern: str) -> None:
        """Create ``name@pattern`` (idempotent) and make every broker copy into it.

        Raises:
            InvalidVirtualQueue: the name or the pattern is refused.
            QueueLimitReached: it is new and there are max_queues already.
            EngineUnavailable: Redis cannot be reached.
        """
        full_name = virtual_queue(name, pattern).full_name
        args = (full_name, pattern, self._limits.max_queues)
        keys = (self._layout.registry, VQUEUES, VQ_VERSION)
        await self._command(script_command(DECLARE, keys, args))
        self._vq_version = None  # our cache is stale now: reload before the next publish

    # -- expiry ------------------------------------------------------------

    async def sweep(self) -> int:
        """Remove the expired messages of every queue that is due (see "Expiry").

        What the sweeper task runs; tests with a fake clock call it directly.
        Returns how many messages it removed.

        Raises:
            EngineUnavailable: Redis cannot be reached.
        """
        removed, _ = await self._sweeper.sweep_once()
        return removed

    # -- observation -------------------------------------------------------

    def on_notice(self, listener: NoticeListener) -> None:
        """Receive delivery notices for messages published through this broker."""
        self._notice_listeners.append(listener)

    async def depth(self, queue: str) -> int:
        """Messages in ``queue``: ready, leased and delayed."""
        return int(await self._command(script_command(DEPTH, self._keys(queue).block, ())))

    async def queues(self) -> list[str]:
        """Every queue and virtual queue (virtual ones as ``name@pattern``)."""
        members = await self._command(("SMEMBERS", self._layout.registry))
        return sorted(member.decode() for member in members)

    async def depths(self) -> dict[str, int]:
        """Every queue's depth: concurrent calls, which the batcher sends as one
        pipeline (gateway.engines.redis.batch)."""
        names = await self.queues()
        values = await asyncio.gather(*(self.depth(name) for name in names))
        return dict(zip(names, values, strict=True))

    # -- inspection (gateway.engines.redis.inspection) -----------------------

    async def peek(self, queue: str, count: int) -> list[QueuedMessage]:
        """Up to ``count`` ready or leased messages of ``queue``, leasing none."""
        return await self._inspector.peek(queue, count)

    async def queue_stats(self, queue: str) -> QueueStats:
        """``queue``'s depth, oldest message's age and dead letters."""
        return await self._inspector.stats(queue)

    async def dead_letters(self, queue: str, count: int) -> list[QueuedMessage]:
        """Up to ``count`` of ``queue``'s dead letters, oldest first."""
        return await self._inspector.dead_letters(queue, count)

    async def requeue_dead_letters(self, queue: str, count: int) -> int:
        """Move up to ``count`` dead letters back into ``queue``; how many moved."""
        return await self._inspector.requeue(queue, count)

    async def ping(self) -> None:
        """One ``PING`` through the batcher, as every other command goes."""
        await self._command(("PING",))

    # -- internals ---------------------------------------------------------

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The loop the engine started in, without asking asyncio each time.

        ``asyncio.get_running_loop`` makes a system call (``getpid``) on every
        call; ``enqueue`` runs once per queue publication.
        """
        loop = self._loop
        if loop is None:
            loop = asyncio.get_running_loop()  # not started: fails (EngineUnavailable) later
        return loop

    def _keys(self, queue: str) -> QueueKeys:
        keys = self._keys_cache.get(queue)
        if keys is None:
            if len(self._keys_cache) >= 4 * self._limits.max_queues:
                self._keys_cache.clear()  # names that were never queues; start over
            keys = self._keys_cache[queue] = self._layout.queue_keys(queue)
        return keys

    def _stored_fields(self, message: Message) -> Stored:
        """``message`` as a queue stores it, with ``default_ttl`` if it has no expiration."""
        priority = message.priority
        if priority not in _PRIORITIES:
            raise ValueError(f"priority must be 0 to 9, got {priority}")
        expiration = message.expiration
        if expiration is None:
            expiration = message.timestamp + self._limits.default_ttl
        header = pack_header(message, expiration)
        not_before = "" if message.not_before is None else repr(message.not_before)
        spec = notice_spec(message, NOTICES)
        return priority, not_before, repr(expiration), header, message.payload, spec

    def _submit(self, call: FutureCall[T]) -> asyncio.Future[T]:
        self._submit_call(call)
        return call.future

    def _submit_call(self, call: Call) -> None:
        if self._batcher is None:
            raise EngineUnavailable("the Redis engine is not started")
        self._batcher.submit(call)

    async def _command(self, command: tuple[Any, ...]) -> Any:
        return await self._submit(CommandCall(command))

    def _settle_leases(
        self, queue: str, receipts: Sequence[str], *, release: bool
    ) -> asyncio.Future[int]:
        future: asyncio.Future[int] = self._running_loop().create_future()
        parsed = [found for text in receipts if (found := receipt_token(text)) is not None]
        if not parsed:
            future.set_result(0)
            return future
        call = LeasesCall(
            queue,
            self._keys(queue),
            parsed,
            future,
            release=release,
            limits=self._limits,
            clock=self._clock,
        )
        try:
            self._submit_call(call)
        except Exception as exc:
            future.set_exception(exc)
        return future

    async def _load_virtual_queues(self) -> None:
        """Load the virtual queues into the cache; concurrent callers share one load.

        A caller that found a load under way waits for it to end, whatever its
        outcome, and returns: ``publish`` then looks at the cache again and, if
        the load failed, loads (and fails) itself.
        """
        loading = self._vq_loading
        if loading is not None:
            await asyncio.wait([loading])
            return
        loading = self._vq_loading = asyncio.get_running_loop().create_future()
        try:
            command = script_command(LOAD_VIRTUAL_QUEUES, (VQ_VERSION, VQUEUES), ())
            version, flat = await self._command(command)
            matcher = TopicMatcher()
            for raw_name in flat[::2]:
                full_name = raw_name.decode()
                try:
                    matcher.add(full_name, parse_virtual_queue(full_name))
                except InvalidVirtualQueue as exc:  # declared under other rules: skip it
                    _log.warning("virtual queue %r ignored: %s", full_name, exc)
            self._vq_matcher, self._vq_version = matcher, version
        finally:
            self._vq_loading = None
            loading.set_result(None)

    def _new_connection(self) -> AbstractConnection:
        assert self._client is not None
        # Classic pub/sub: on a cluster any node will do, and each reconnection
        # tries the next, so a dead node is not tried for ever.
        self._pubsub_attempts += 1
        return broadcast_connection(self._client, self._pubsub_attempts)

    def _on_message(self, channel: bytes, data: bytes) -> None:
        woken = self._layout.woken_queue(channel)
        if woken is not None:
            assert self._wakeups is not None
            self._wakeups.wake(woken)
        elif channel in self._topic_channels:
            origin, message = unpack_topic(data)
            if origin != self._origin:
                for listener in self._topic_listeners:
                    listener(message)
        else:
            notice = parse_notice(data)
            for notice_listener in self._notice_listeners:
                notice_listener(notice)

    def _on_reconnect(self) -> None:
        self._vq_version = None  # a declaration may have happened meanwhile: cheap to reload
        if self._wakeups is not None:
            self._wakeups.wake_all()


if TYPE_CHECKING:  # mypy checks that RedisEngine implements the Engine protocol
    from gateway.engines.base import Engine

    _conforms: Engine = RedisEngine("redis://", broker_id="")
