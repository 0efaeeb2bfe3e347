"""What the management API asks of a Redis queue: peek, stats, dead letters.

Read-only questions (peek, stats, the dead letters' list) are plain commands in
one pipeline, not scripts: they change nothing, so they need no atomicity, and
a reply a moment stale is what an operator's view is anyway. Moving dead
letters back changes the queue and is one script
(:data:`~gateway.engines.redis.scripts.REQUEUE_DEAD`).

Order: a queue's priority streams hold its ready *and* leased messages, in the
order they joined (leases stay in place in the stream), which is the order
``peek`` promises; the first entry of each stream is that priority's head, so
the oldest message's age costs one ``XRANGE ... COUNT 1`` per priority.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from gateway.engines.base import EngineLimits, QueuedMessage, QueueStats
from gateway.engines.redis.batch import reply_error, settle_future
from gateway.engines.redis.calls import FutureCall, QueueKeys, script_command
from gateway.engines.redis.codec import unpack_message
from gateway.engines.redis.dead_letters import DEAD_LETTERS_SUFFIX, LIST
from gateway.engines.redis.scripts import DEPTH, GROUP, REQUEUE_DEAD

__all__ = ["Commands", "Inspector", "dead_letters_key"]

#: Submits commands as one pipeline and returns their replies.
Submit = Callable[["Commands"], Awaitable[list[Any]]]

_DESCENDING = range(9, -1, -1)


def dead_letters_key(keys: QueueKeys) -> str:
    """The queue's dead-letter list: its streams' prefix, then ``dd``."""
    return keys.block[0][:-2] + DEAD_LETTERS_SUFFIX


class Commands(FutureCall[list[Any]]):
    """Several commands in one pipeline; the result is their replies (the first error fails it)."""

    __slots__ = ("_commands",)

    def __init__(self, commands: Sequence[tuple[Any, ...]]) -> None:
        super().__init__()
        self._commands = commands

    def commands(self) -> Sequence[tuple[Any, ...]]:
        return self._commands

    def settle(self, replies: Sequence[Any]) -> None:
        for reply in replies:
            error = reply_error(reply)
            if error is not None:
                self.fail(error)
                return
        settle_future(self.future, list(replies))


class Inspector:
    """The inspection operations of one Redis engine.

    Args:
        submit: runs a :class:`Commands` call through the engine's batcher.
        keys: a queue's keys (the engine's cache).
        limits: the engine's limits (``max_queue_depth`` bounds a move back).
        clock: the engine's clock (epoch seconds).
    """

    def __init__(
        self,
        submit: Submit,
        keys: Callable[[str], QueueKeys],
        limits: EngineLimits,
        clock: Callable[[], float],
    ) -> None:
        self._submit = submit
        self._keys = keys
        self._limits = limits
        self._clock = clock

    async def peek(self, queue: str, count: int) -> list[QueuedMessage]:
        """See ``Engine.peek``: two pipelines (the entries, then their delivery counts)."""
        if count < 1:
            return []
        streams = self._keys(queue).block[2:]
        ranges = await self._submit(
            Commands([("XRANGE", streams[p], "-", "+", "COUNT", count) for p in _DESCENDING])
        )
        picked: list[tuple[str, list[Any]]] = []  # (stream, entries) in priority order
        left = count
        for p, entries in zip(_DESCENDING, ranges, strict=True):
            if entries and left > 0:
                picked.append((streams[p], entries[:left]))
                left -= len(picked[-1][1])
        if not picked:
            return []
        # A stream's pending list holds its leased (and released) entries with
        # their delivery counts; the first ``n`` pending entries cover every
        # pending one among the stream's first ``n`` entries.
        pending = await self._submit(
            Commands(
                [("XPENDING", stream, GROUP, "-", "+", len(entries)) for stream, entries in picked]
            )
        )
        peeked: list[QueuedMessage] = []
        for (_, entries), counts in zip(picked, pending, strict=True):
            delivered = {row[0]: int(row[3]) for row in counts}
            for entry_id, fields in entries:
                values = dict(zip(fields[::2], fields[1::2], strict=True))
                message = unpack_message(values[b"h"], values[b"p"])
                peeked.append(QueuedMessage(message, delivered.get(entry_id, 0)))
        return peeked

    async def stats(self, queue: str) -> QueueStats:
        """See ``Engine.queue_stats``: one pipeline."""
        keys = self._keys(queue)
        streams = keys.block[2:]
        replies = await self._submit(
            Commands(
                [
                    script_command(DEPTH, keys.block, ()),
                    ("LLEN", dead_letters_key(keys)),
                    *(("XRANGE", stream, "-", "+", "COUNT", 1) for stream in streams),
                ]
            )
        )
        depth, dead, *heads = replies
        published = [
            unpack_message(dict(zip(f[::2], f[1::2], strict=True))[b"h"], b"").timestamp
            for entries in heads
            for _, f in entries
        ]
        oldest = min(published, default=None)
        return QueueStats(
            depth=int(depth),
            oldest_age=None if oldest is None else max(0.0, self._clock() - oldest),
            dead_letters=int(dead),
        )

    async def dead_letters(self, queue: str, count: int) -> list[QueuedMessage]:
        """See ``Engine.dead_letters``: one script sent with EVAL (read-only, rare)."""
        if count < 1:
            return []
        key = dead_letters_key(self._keys(queue))
        [flat] = await self._submit(Commands([("EVAL", LIST, 1, key, count)]))
        return [
            QueuedMessage(unpack_message(flat[i], flat[i + 1]), int(flat[i + 2]))
            for i in range(0, len(flat), 3)
        ]

    async def requeue(self, queue: str, count: int) -> int:
        """See ``Engine.requeue_dead_letters``: one script."""
        if count < 1:
            return 0
        keys = self._keys(queue)
        command = script_command(
            REQUEUE_DEAD,
            (*keys.block, dead_letters_key(keys), keys.expiry),
            (queue, count, self._limits.max_queue_depth, repr(float(self._clock())), keys.wake),
        )
        [moved] = await self._submit(Commands([command]))
        return int(moved)
