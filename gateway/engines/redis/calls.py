"""The Redis engine's keys, and its operations as batcher calls.

Each class here is one engine operation as a :class:`~gateway.engines.redis.batch.Call`:
the script command(s) it writes and how it turns the replies into results.
Enqueues to one queue merge into one call, as do acks (or releases) of one
queue. Times are read from the engine's clock when the pipeline is written,
not when the call was made, so a call that waited for a busy pipeline does not
act on a stale ``now``.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, Final, Generic, TypeVar

from gateway.engines.base import Delivery, EngineLimits, NoticeEvent, QueueFull, new_delivery
from gateway.engines.redis.batch import Call, fail_future, reply_error, settle_future
from gateway.engines.redis.codec import receipt, unpack_message
from gateway.engines.redis.scripts import (
    ACK,
    COPY,
    ENQUEUE,
    FETCH,
    PUBLISH,
    RELEASE,
    SWEEP,
    Script,
)

__all__ = [
    "EXPIRY",
    "FETCH_SLACK",
    "KEY_PREFIX",
    "MAX_PER_SCRIPT",
    "NOTICES",
    "REGISTRY",
    "TOPICS",
    "VQUEUES",
    "VQ_VERSION",
    "WAIT_REPLICA",
    "WAKE",
    "CommandCall",
    "CopyCall",
    "EnqueueCall",
    "FetchCall",
    "FutureCall",
    "LeasesCall",
    "PublishCall",
    "QueueKeys",
    "Stored",
    "SweepCall",
    "VersionCall",
    "script_command",
]

#: Every key and channel of the engine starts with this.
KEY_PREFIX: Final = "asbp:"
#: Every queue and virtual queue (a set).
REGISTRY: Final = KEY_PREFIX + "queues"
#: Virtual queues: full name -> pattern (a hash).
VQUEUES: Final = KEY_PREFIX + "vqueues"
#: Bumped when a virtual queue is declared. Its hash tag is the whole name of
#: VQUEUES, so that on a Redis Cluster the two share a slot (the scripts that
#: read the virtual queues read both).
VQ_VERSION: Final = "{" + VQUEUES + "}:version"
#: The topic channel every engine subscribes to.
TOPICS: Final = KEY_PREFIX + "topics"
#: Prefix of a broker's notice channel (then the broker id).
NOTICES: Final = KEY_PREFIX + "notices:"
#: Prefix of a queue's wake-up channel (then the queue name).
WAKE: Final = KEY_PREFIX + "wake:"
#: Queues by when they next need the sweep (a sorted set; see gateway.engines.redis.engine).
#: Tagged like VQ_VERSION: a topic publication's script touches both, so on a Redis
#: Cluster a publication that feeds no virtual queue stays in one slot.
EXPIRY: Final = "{" + VQUEUES + "}:expiry"
#: What follows a write that accepts messages on a Redis Cluster: answered once
#: one replica has it too, or after a second without (docs/kubernetes.md,
#: "Durability on a cluster"); the cluster batcher sends it to the primary the
#: write went to.
WAIT_REPLICA: Final = ("WAIT", 1, 1000)
#: Entries a fetch script may look at beyond ``count`` (expired, delayed, discarded).
FETCH_SLACK: Final = 1000
#: Messages per enqueue, or receipts per ack, in one script call (merged calls are split).
MAX_PER_SCRIPT: Final = 500

_PRIORITIES: Final = range(10)
_DEQUEUED: Final = frozenset({NoticeEvent.CONSUMED, NoticeEvent.EXPIRED, NoticeEvent.DISCARDED})

#: A message as the store helper takes it: priority, not_before ('' if none),
#: expiration, header, payload, notice spec ('' if none).
Stored = tuple[int, str, str, bytes, bytes, str]
Clock = Callable[[], float]
T = TypeVar("T")


class QueueKeys:
    """One queue's keys and wake-up channel, in the orders the scripts take them."""

    __slots__ = (
        "block",
        "enqueue",
        "expiry",
        "fetch",
        "registry",
        "release",
        "sweep",
        "wait_replicas",
        "wake",
    )

    def __init__(
        self,
        queue: str,
        *,
        prefix: str = KEY_PREFIX + "q:",
        expiry: str = EXPIRY,
        registry: str | None = REGISTRY,
        wait_replicas: bool = False,
    ) -> None:
        base = f"{prefix}{queue}:"
        #: Follow each write that accepts messages with WAIT_REPLICA (a Redis Cluster).
        self.wait_replicas = wait_replicas
        #: The index of queues by next sweep that this queue is in (its shard's).
        self.expiry = expiry
        #: The registry the enqueue script adds the queue to; None on a Redis
        #: Cluster, where it is another slot's (gateway.engines.redis.layout).
        self.registry = registry
        #: The merge key of the queue's EnqueueCall.
        self.enqueue = ("enqueue", queue)
        #: delayed, waiting, s0..s9: the block the store and depth helpers use.
        self.block: tuple[str, ...] = (
            f"{base}dl",
            f"{base}wt",
            *(f"{base}s{p}" for p in _PRIORITIES),
        )
        #: The block, then l0..l9, then the lease lists: fetch, ack, release.
        self.fetch: tuple[str, ...] = (
            *self.block,
            *(f"{base}l{p}" for p in _PRIORITIES),
            f"{base}lb",
        )
        #: Release: fetch's, then the expiry index.
        self.release: tuple[str, ...] = (*self.fetch, expiry)
        #: Sweep: the expiry index, then fetch's.
        self.sweep: tuple[str, ...] = (expiry, *self.fetch)
        #: The wake-up channel.
        self.wake = WAKE + queue


def script_command(script: Script, keys: Sequence[str], args: Sequence[Any]) -> tuple[Any, ...]:
    """EVALSHA of ``script``."""
    return ("EVALSHA", script.sha, len(keys), *keys, *args)


def _now(clock: Clock) -> str:
    return repr(float(clock()))


class FutureCall(Call, Generic[T]):
    """A call with one waiter, ``future``."""

    __slots__ = ("future",)

    def __init__(self) -> None:
        self.future: asyncio.Future[T] = asyncio.get_running_loop().create_future()

    def fail(self, error: BaseException) -> None:
        fail_future(self.future, error)


class CommandCall(FutureCall[Any]):
    """One command; the result is its reply."""

    __slots__ = ("_command",)

    def __init__(self, command: tuple[Any, ...]) -> None:
        super().__init__()
        self._command = command

    def commands(self) -> Sequence[tuple[Any, ...]]:
        return (self._command,)

    def settle(self, replies: Sequence[Any]) -> None:
        error = reply_error(replies[0])
        if error is not None:
            self.fail(error)
        else:
            settle_future(self.future, replies[0])


class EnqueueCall(Call):
    """Messages for one queue: concurrent enqueues to it merge into one script call."""

    __slots__ = ("_clock", "_futures", "_keys", "_limits", "_queue", "_stored", "merge_key")

    def __init__(
        self,
        queue: str,
        keys: QueueKeys,
        stored: Stored,
        future: asyncio.Future[None],
        *,
        limits: EngineLimits,
        clock: Clock,
    ) -> None:
        self._queue = queue
        self._keys = keys
        self._limits = limits
        self._clock = clock
        self._stored = [stored]
        self._futures = [future]
        self.merge_key = keys.enqueue

    def merge(self, other: Call) -> None:
        assert isinstance(other, EnqueueCall)
        self._stored += other._stored
        self._futures += other._futures

    def add(self, stored: Stored, future: asyncio.Future[None]) -> None:
        """One more message, as merging a call of its own would add it."""
        self._stored.append(stored)
        self._futures.append(future)

    def commands(self) -> Sequence[tuple[Any, ...]]:
        keys, limits = self._keys, self._limits
        registry = keys.registry
        head = (
            "EVALSHA",
            ENQUEUE.sha,
            2 + len(keys.block),
            # On a cluster, no registry (another slot): a key of the queue's slot
            # stands in, and an empty max_queues tells the script to skip it.
            keys.expiry if registry is None else registry,
            *keys.block,
            keys.expiry,
            self._queue,
            keys.wake,
            "" if registry is None else limits.max_queues,
            limits.max_queue_depth,
            _now(self._clock),
        )
        stored = self._stored
        commands = [
            (*head, *chain.from_iterable(stored[i : i + MAX_PER_SCRIPT]))
            for i in range(0, len(stored), MAX_PER_SCRIPT)
        ]
        if keys.wait_replicas:
            commands.append(WAIT_REPLICA)
        return commands

    def settle(self, replies: Sequence[Any]) -> None:
        if self._keys.wait_replicas:
            # WAIT's count is not checked: the promise is "a replica has it, or a
            # second passed" (docs/kubernetes.md), as the routing plane's.
            replies = replies[:-1]
        for chunk, reply in enumerate(replies):
            waiting = self._futures[chunk * MAX_PER_SCRIPT : (chunk + 1) * MAX_PER_SCRIPT]
            error = reply_error(reply)
            stored = 0 if error is not None else int(reply)
            for future in waiting[:stored]:
                settle_future(future, None)
            for future in waiting[stored:]:  # the first ones fitted, these did not
                fail_future(future, error or QueueFull(f"queue {self._queue!r} is full"))

    def fail(self, error: BaseException) -> None:
        for future in self._futures:
            fail_future(future, error)


@dataclass(frozen=True, slots=True)
class _Copy:
    name: str
    keys: QueueKeys


class PublishCall(FutureCall[bool]):
    """A topic message and its virtual-queue copies; the result is False if the cache was stale.

    Args:
        topic: origin tag + header, as published on the topic channel.
        stored: the stored form for the copies (its payload is published too).
        targets: the virtual queues to copy into, by full name.
        version: the virtual-queue version the targets were matched under.
    """

    __slots__ = ("_clock", "_head", "_keys", "_tail")

    def __init__(
        self,
        topic: bytes,
        stored: Stored,
        targets: Sequence[tuple[str, QueueKeys]],
        version: bytes,
        *,
        limits: EngineLimits,
        clock: Clock,
    ) -> None:
        super().__init__()
        self._clock = clock
        keys: list[str] = [VQ_VERSION]
        copies: list[str] = []
        for name, queue_keys in targets:
            keys += queue_keys.block
            copies += (name, queue_keys.wake)
        keys.append(targets[0][1].expiry if targets else EXPIRY)
        self._keys = keys
        self._head = (version, TOPICS, topic)
        self._tail = (limits.max_queue_depth, *stored, *copies)

    def commands(self) -> Sequence[tuple[Any, ...]]:
        args = (*self._head, _now(self._clock), *self._tail)
        return (script_command(PUBLISH, self._keys, args),)

    def settle(self, replies: Sequence[Any]) -> None:
        error = reply_error(replies[0])
        if error is not None:
            self.fail(error)
        else:
            settle_future(self.future, bool(replies[0]))


class VersionCall(FutureCall[bytes]):
    """The virtual-queue version, read before a publication copies (a Redis Cluster).

    Publications that start while one read waits for the next pipeline share it:
    it is written after each of them started, which is all the check needs
    (gateway.engines.redis.engine, "Virtual queues"). The result is the version,
    ``b"0"`` when none was ever declared.
    """

    __slots__ = ()

    merge_key = "vq-version"

    def commands(self) -> Sequence[tuple[Any, ...]]:
        return (("GET", VQ_VERSION),)

    def settle(self, replies: Sequence[Any]) -> None:
        error = reply_error(replies[0])
        if error is not None:
            self.fail(error)
        else:
            settle_future(self.future, replies[0] or b"0")


class CopyCall(Call):
    """Topic messages' copies into the virtual queues of one shard (a Redis Cluster).

    On a cluster a publication's virtual queues live in several slots: the
    engine checks the version first, then copies with one of these per shard
    (gateway.engines.redis.layout), followed by WAIT_REPLICA. Concurrent
    publications copying into the same virtual queues merge into one script
    call, as concurrent enqueues to a queue do: one call per shard per
    pipeline, not per message.

    Args:
        stored: the stored form of the copies.
        targets: the virtual queues of one shard to copy into, by full name.
        future: settled once copied.
    """

    __slots__ = ("_clock", "_futures", "_keys", "_limits", "_names", "_stored", "merge_key")

    def __init__(
        self,
        stored: Stored,
        targets: Sequence[tuple[str, QueueKeys]],
        future: asyncio.Future[None],
        *,
        limits: EngineLimits,
        clock: Clock,
    ) -> None:
        self._clock = clock
        self._limits = limits
        keys: list[str] = []
        names: list[str] = []
        for name, queue_keys in targets:
            keys += queue_keys.block
            names += (name, queue_keys.wake)
        keys.append(targets[0][1].expiry)
        self._keys = keys
        self._names = names
        self._stored = [stored]
        self._futures = [future]
        self.merge_key = ("copy", *names[::2])

    def merge(self, other: Call) -> None:
        assert isinstance(other, CopyCall)
        self._stored += other._stored
        self._futures += other._futures

    def add(self, stored: Stored, future: asyncio.Future[None]) -> None:
        """One more message, as merging a call of its own would add it."""
        self._stored.append(stored)
        self._futures.append(future)

    def commands(self) -> Sequence[tuple[Any, ...]]:
        now, depth, stored = _now(self._clock), self._limits.max_queue_depth, self._stored
        commands: list[tuple[Any, ...]] = []
        for start in range(0, len(stored), MAX_PER_SCRIPT):
            chunk = stored[start : start + MAX_PER_SCRIPT]
            args = (now, depth, len(chunk), *chain.from_iterable(chunk), *self._names)
            commands.append(script_command(COPY, self._keys, args))
        commands.append(WAIT_REPLICA)
        return commands

    def settle(self, replies: Sequence[Any]) -> None:
        for chunk, reply in enumerate(replies[:-1]):  # WAIT's count is not checked
            error = reply_error(reply)
            for future in self._futures[chunk * MAX_PER_SCRIPT : (chunk + 1) * MAX_PER_SCRIPT]:
                if error is not None:
                    fail_future(future, error)
                else:
                    settle_future(future, None)

    def fail(self, error: BaseException) -> None:
        for future in self._futures:
            fail_future(future, error)


class FetchCall(FutureCall[tuple[list[Delivery], bool, float | None]]):
    """One fetch; the result is (deliveries, more to look at, next due time or None)."""

    __slots__ = (
        "_armed",
        "_clock",
        "_consumer",
        "_count",
        "_deadline",
        "_keys",
        "_limits",
        "_queue",
        "_tag",
    )

    def __init__(
        self,
        queue: str,
        keys: QueueKeys,
        count: int,
        *,
        consumer: str,
        armed: bool,
        limits: EngineLimits,
        clock: Clock,
    ) -> None:
        super().__init__()
        self._queue = queue
        self._keys = keys
        self._count = count
        self._consumer = consumer
        self._armed = armed
        self._limits = limits
        self._clock = clock
        self._deadline = 0.0
        self._tag = os.urandom(6).hex()

    def commands(self) -> Sequence[tuple[Any, ...]]:
        limits = self._limits
        now = float(self._clock())
        # Leases are scored in whole milliseconds (see gateway.engines.redis.scripts),
        # rounded down: the deadline promised is the one Redis keeps, at most 1 ms
        # short of ack_timeout, and a lease still ends once ack_timeout has passed.
        deadline_ms = math.floor((now + limits.ack_timeout) * 1000)
        self._deadline = deadline_ms / 1000
        args = (
            self._queue,
            self._consumer,
            self._count,
            repr(now),
            deadline_ms,
            limits.max_deliveries,
            "1" if self._armed else "0",
            self._count + FETCH_SLACK,
            self._tag,
        )
        return (script_command(FETCH, self._keys.fetch, args),)

    def settle(self, replies: Sequence[Any]) -> None:
        reply = replies[0]
        error = reply_error(reply)
        if error is not None:
            self.fail(error)
            return
        queue, deadline, tag = self._queue, self._deadline, self._tag
        deliveries: list[Delivery] = []
        # Groups: priority, delivery count, n, then n times (stream id, header, payload).
        start, end = 2, len(reply)
        while start < end:
            priority, count, size = reply[start : start + 3]
            start += 3
            entries = iter(reply[start : start + 3 * size])
            start += 3 * size
            tail = f":{count}:{tag}"
            for stream_id, header, payload in zip(entries, entries, entries, strict=True):
                message = unpack_message(header, payload)
                if message.notify is not None and not message.notices.isdisjoint(_DEQUEUED):
                    lease = receipt(priority, stream_id.decode(), count, tag, True)
                else:  # receipt() without the flag, in one step: one per message
                    lease = f"{priority}:{stream_id.decode()}{tail}"
                deliveries.append(new_delivery(message, queue, count, deadline, lease))
        next_due = float(reply[1]) if reply[1] else None
        settle_future(self.future, (deliveries, bool(reply[0]), next_due))


class LeasesCall(Call):
    """Acks (or releases) of one queue: concurrent ones merge into one script call.

    Each waiter's result is how many of its receipts were live.
    """

    __slots__ = (
        "_clock",
        "_keys",
        "_limits",
        "_owners",
        "_queue",
        "_release",
        "_waiters",
        "merge_key",
    )

    def __init__(
        self,
        queue: str,
        keys: QueueKeys,
        receipts: list[tuple[str, str, str]],
        future: asyncio.Future[int],
        *,
        release: bool,
        limits: EngineLimits,
        clock: Clock,
    ) -> None:
        self._queue = queue
        self._keys = keys
        self._release = release
        self._limits = limits
        self._clock = clock
        self._waiters = [(receipts, future)]
        #: The waiter each receipt came from, in the order commands() sent them.
        self._owners: list[int] = []
        self.merge_key = ("release" if release else "ack", queue)

    def merge(self, other: Call) -> None:
        assert isinstance(other, LeasesCall)
        self._waiters += other._waiters

    def commands(self) -> Sequence[tuple[Any, ...]]:
        keys = self._keys
        head: tuple[Any, ...] = (self._queue, _now(self._clock))
        script = ACK
        if self._release:
            script = RELEASE
            head += (self._limits.max_deliveries, keys.wake)
        # The scripts take the receipts grouped by batch (the fetch call that
        # leased them) and priority: one lookup of the batch's lease per group.
        # Each receipt comes as (head, token, batch): codec.receipt_token.
        groups: dict[tuple[str, str], tuple[list[str], list[int]]] = {}
        for owner, (receipts, _) in enumerate(self._waiters):
            for receipt_head, token, batch in receipts:
                group = groups.get((receipt_head, batch))
                if group is None:
                    group = groups[receipt_head, batch] = ([], [])
                group[0].append(token)
                group[1].append(owner)
        commands: list[tuple[Any, ...]] = []
        owners: list[int] = []
        args: list[Any] = []
        size = 0
        script_keys = keys.release if self._release else keys.fetch
        for (receipt_head, batch), (tokens, group_owners) in groups.items():
            owners += group_owners
            for start in range(0, len(tokens), MAX_PER_SCRIPT):
                part = tokens[start : start + MAX_PER_SCRIPT]
                if size + len(part) > MAX_PER_SCRIPT:
                    commands.append(script_command(script, script_keys, (*head, *args)))
                    args, size = [], 0
                args += (receipt_head, batch, len(part), *part)
                size += len(part)
        commands.append(script_command(script, script_keys, (*head, *args)))
        self._owners = owners
        return commands

    def settle(self, replies: Sequence[Any]) -> None:
        live = [0] * len(self._waiters)
        flags: list[int] = []
        for reply in replies:
            error = reply_error(reply)
            if error is not None:
                self.fail(error)
                return
            flags += reply
        if len(live) == 1:  # one waiter (no merge): no per-receipt bookkeeping
            live[0] = sum(flags)
        else:
            for owner, flag in zip(self._owners, flags, strict=True):
                live[owner] += flag
        for (_, future), count in zip(self._waiters, live, strict=True):
            settle_future(future, count)

    def fail(self, error: BaseException) -> None:
        for _, future in self._waiters:
            fail_future(future, error)


class SweepCall(FutureCall[tuple[int, bool]]):
    """One queue's sweep; the result is (messages removed, budget ran out)."""

    __slots__ = ("_budget", "_clock", "_keys", "_queue")

    def __init__(self, queue: str, keys: QueueKeys, *, budget: int, clock: Clock) -> None:
        super().__init__()
        self._queue = queue
        self._keys = keys
        self._budget = budget
        self._clock = clock

    def commands(self) -> Sequence[tuple[Any, ...]]:
        args = (self._queue, _now(self._clock), self._budget)
        return (script_command(SWEEP, self._keys.sweep, args),)

    def settle(self, replies: Sequence[Any]) -> None:
        error = reply_error(replies[0])
        if error is not None:
            self.fail(error)
        else:
            removed, more = replies[0]
            settle_future(self.future, (int(removed), bool(more)))
