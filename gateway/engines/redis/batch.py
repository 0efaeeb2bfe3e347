"""Coalescing concurrent Redis calls into pipelines: one round trip per batch.

One awaited Redis call costs about 200 µs, most of it the round trip and the
client's per-call overhead, so an engine that awaits Redis once per message
tops out near 5,000 messages per second. The broker, though, calls the engine
concurrently: every WebSocket connection is its own task, and each awaits its
own ``enqueue`` or ``ack``.

:class:`Batcher` turns that concurrency into batching. ``submit`` appends a
:class:`Call` to a pending list and, if none is running, starts the flusher
task. The flusher takes everything pending, writes it as one pipeline (one
write, one round trip), settles every call's future from its replies, and
repeats while calls kept arriving during the round trip. A lone call pays one
round trip plus one trip through the event loop; under load, calls that
arrive during a round trip share the next one. This is Nagle's algorithm
without the timer, the same trade nats.py's flusher makes.

Calls with the same ``merge_key`` waiting for the same pipeline become one
call before they are written: the engine merges every ``enqueue`` to one
queue into one script call, and every ``ack`` of one queue into one
multi-receipt script call, so Redis runs one script, not a hundred.

The flusher packs commands itself (with hiredis's C packer when hiredis is
installed) and writes them on a connection of its own, a lean
:class:`~gateway.engines.redis.resp.RespConnection` made as the client's pool
would make one: redis-py's own pipeline packs every argument in Python, which
cost more than all the engine's other work for a batch of 100 messages, and its
connection's write and per-reply reads cost the broker more CPU per round trip
than the round trip's own system calls (gateway/engines/redis/resp.py). The
flusher keeps that connection from one pipeline to the next and closes it at
close: under a bus's load a pipeline carries only a few Commands
(bench/cluster.py), so what each pipeline costs counts. A connection that Redis
closed meanwhile (a restart, say) is seen closed (or fails on use), and the
next pipeline (or the retry below) opens a new one. A Redis Cluster's batcher
(gateway/engines/redis/cluster.py) keeps one such connection per node.

Scripts are called by SHA-1 (EVALSHA). Redis forgets its script cache when it
restarts, so a NOSCRIPT reply makes the flusher load every script and send the
refused commands again: NOSCRIPT means the script did not run, so resending is
safe.

Errors: a batch whose connection fails is written once more on a new
connection, because a pooled connection may have died while idle (Redis
restarted) and only says so when used. If that fails too (refused, reset, timed
out, Redis still loading its data), every call of the batch fails with
``EngineUnavailable``; an error reply fails only its own call, through
:func:`reply_error`. The retry has a price: had Redis run the batch and then
lost the connection before replying, it runs twice. Queues are at-least-once
anyway; a repeated ``enqueue`` stores a duplicate, a repeated ``ack`` finds its
leases gone and counts 0. That is why ``EngineUnavailable`` means "may not have
happened", never "did not happen".
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Final

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.engines.base import EngineUnavailable, QueueFull, QueueLimitReached
from gateway.engines.redis.resp import RespConnection, open_connection
from gateway.engines.redis.scripts import Script

__all__ = [
    "CONNECTION_ERRORS",
    "Batcher",
    "Call",
    "fail_future",
    "reply_error",
    "settle_future",
    "unavailable",
]


def _pack_python(args: tuple[Any, ...]) -> bytes:
    """One command in RESP, without hiredis (arguments: bytes, str or int)."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, str):
            arg = arg.encode()
        elif isinstance(arg, int):
            arg = b"%d" % arg
        out += (b"$%d\r\n" % len(arg), arg, b"\r\n")
    return b"".join(out)


_pack_command: Callable[[tuple[Any, ...]], bytes]
try:
    from hiredis import pack_command as _pack_command
except ImportError:  # pragma: no cover - hiredis is a dependency; this keeps it optional
    _pack_command = _pack_python


#: What a lost or refused connection raises (redis-py wraps most OSErrors, not all).
CONNECTION_ERRORS: Final = (RedisConnectionError, RedisTimeoutError, OSError)

#: Error replies that say Redis cannot serve writes now, rather than that the call is wrong.
_UNAVAILABLE_PREFIXES: Final = (
    "BUSY",
    "LOADING",
    "OOM",
    "READONLY",
    "MISCONF",
    "MASTERDOWN",
    "NOREPLICAS",
    "TRYAGAIN",
    "CLUSTERDOWN",
)


def unavailable(exc: BaseException) -> EngineUnavailable:
    """``EngineUnavailable`` for a Redis failure, with ``exc`` as its cause."""
    error = EngineUnavailable(f"Redis is unavailable: {exc}")
    error.__cause__ = exc
    return error


def reply_error(reply: Any) -> BaseException | None:
    """The exception an error reply stands for, or None for a good reply.

    The scripts signal a refused queue with ``QLIMIT <queue>`` and a full one
    with ``QFULL <queue>``.
    """
    if not isinstance(reply, ResponseError):
        return None
    text = str(reply)
    if text.startswith("QLIMIT "):
        return QueueLimitReached(f"queue {text[7:]!r} would pass the limit on queues")
    if text.startswith("QFULL "):
        return QueueFull(f"queue {text[6:]!r} is full")
    if text.startswith(_UNAVAILABLE_PREFIXES):
        return unavailable(reply)
    return reply


class Call(ABC):
    """One operation waiting for a pipeline: its commands and what to do with the replies."""

    __slots__ = ()

    #: Calls with equal keys waiting for the same pipeline are merged (None: never).
    merge_key: Hashable | None = None

    def merge(self, other: Call) -> None:
        """Take over ``other`` (same ``merge_key``): its work and its waiters."""
        raise NotImplementedError

    @abstractmethod
    def commands(self) -> Sequence[tuple[Any, ...]]:
        """The commands to write, computed when the pipeline is written."""

    @abstractmethod
    def settle(self, replies: Sequence[Any]) -> None:
        """Resolve the waiters from the replies (one per command, errors as values)."""

    @abstractmethod
    def fail(self, error: BaseException) -> None:
        """Resolve every waiter with ``error``."""


class Batcher:
    """Writes submitted calls in pipelines; see the module docstring.

    Args:
        client: the connection pool to take a connection from per pipeline.
        scripts: every script the calls use, for reloading after NOSCRIPT.
        max_calls: the most calls in one pipeline (after merging, before it).
    """

    def __init__(self, client: Redis, scripts: Sequence[Script], *, max_calls: int = 512) -> None:
        self._client = client
        self._scripts = scripts
        self._max_calls = max_calls
        self._pending: list[Call] = []
        self._mergeable: dict[Hashable, Call] = {}
        self._flusher: asyncio.Task[None] | None = None
        #: The connection of the pipeline just written, kept for the next one. One
        #: flusher runs at a time, so one connection is enough; closed at close.
        self._held: RespConnection | None = None
        self._closed = False

    def submit(self, call: Call) -> None:
        """Queue ``call`` for the next pipeline; its own future tells the result.

        Raises:
            EngineUnavailable: the batcher is closed.
        """
        if self._closed:
            raise EngineUnavailable("the Redis engine is closed")
        key = call.merge_key
        if key is not None:
            into = self._mergeable.get(key)
            if into is not None:
                into.merge(call)
                return
            self._mergeable[key] = call
        self._pending.append(call)
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush())

    def waiting(self, key: Hashable) -> Call | None:
        """The call with merge key ``key`` waiting for the next pipeline, if any.

        A caller may add its work to it (as :meth:`submit` would merge it) and skip
        building a call of its own: the one per-message cost a merged call adds.
        None once closed, so that the caller's submit refuses the work.
        """
        return None if self._closed else self._mergeable.get(key)

    async def load_scripts(self) -> None:
        """SCRIPT LOAD every script (one round trip).

        Raises:
            EngineUnavailable: Redis cannot be reached.
        """
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for script in self._scripts:
                    pipe.script_load(script.source)
                await pipe.execute()
        except CONNECTION_ERRORS as exc:
            raise unavailable(exc) from exc
        except ResponseError as exc:
            error = reply_error(exc)
            raise error if error is not None else exc from exc

    async def close(self) -> None:
        """Refuse new calls and wait for the submitted ones to be written and settled."""
        self._closed = True
        try:
            if self._flusher is not None:
                await asyncio.shield(self._flusher)
        finally:  # a caller's timeout too: what is still waiting fails as it closes
            held, self._held = self._held, None
            if held is not None:
                held.close()

    async def _flush(self) -> None:
        try:
            while self._pending:
                calls = self._pending[: self._max_calls]
                del self._pending[: self._max_calls]
                for call in calls:
                    if call.merge_key is not None:
                        self._mergeable.pop(call.merge_key, None)
                await self._run(calls)
        finally:
            self._flusher = None
            if self._closed and self._held is not None:  # outlived a close that gave up
                self._held.close()
                self._held = None

    async def _run(self, calls: list[Call]) -> None:
        commands: list[tuple[Any, ...]] = []
        spans: list[tuple[int, int]] = []
        try:
            for call in calls:
                own = call.commands()
                spans.append((len(commands), len(commands) + len(own)))
                commands.extend(own)
            replies = await self._execute(commands)
        except CONNECTION_ERRORS as exc:
            for call in calls:
                call.fail(unavailable(exc))
            return
        except Exception as exc:  # a bug: tell every waiter rather than strand them
            for call in calls:
                call.fail(exc)
            return
        except BaseException as exc:  # cancelled: the loop is going away
            for call in calls:
                call.fail(unavailable(exc))
            raise
        for call, (start, end) in zip(calls, spans, strict=True):
            try:
                call.settle(replies[start:end])
            except Exception as exc:  # a bug in one call must not strand the others
                call.fail(exc)

    async def _execute(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        if not commands:
            return []
        try:
            replies = await self._pipeline(commands)
        except CONNECTION_ERRORS:
            # A pooled connection can die while idle (Redis restarted, a proxy
            # dropped it) and fail only on use: try once more on a new one.
            replies = await self._pipeline(commands)
        refused = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if refused:  # Redis restarted and forgot its scripts: load them, send those again
            await self.load_scripts()
            for i, reply in zip(
                refused, await self._pipeline([commands[i] for i in refused]), strict=True
            ):
                replies[i] = reply
        return replies

    async def _pipeline(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        # The connection kept from the pipeline before: one that Redis closed while
        # idle is seen closed, or fails on use at worst, as an idle pooled one
        # could, and _execute tries once more on a new one.
        connection, self._held = self._held, None
        if connection is None or connection.closed:
            pool = self._client.connection_pool
            connection = await open_connection(pool.connection_class(**pool.connection_kwargs))
        try:
            packed = b"".join([_pack_command(command) for command in commands])
            replies = await connection.execute(packed, len(commands))
            for reply in replies:
                # What redis-py raises rather than returns (LOADING, NOAUTH, too many
                # clients): Redis cannot serve this connection now.
                if isinstance(reply, RedisConnectionError):
                    raise reply
        except BaseException:
            connection.close()  # lost, refused, or its waiter cancelled: never reuse it
            raise
        self._held = connection  # for the next pipeline (closed at close)
        return replies


def settle_future(future: asyncio.Future[Any], result: Any) -> None:
    """Set ``future``'s result unless its waiter gave up (cancelled)."""
    if not future.done():
        future.set_result(result)


def fail_future(future: asyncio.Future[Any], error: BaseException) -> None:
    """Set ``future``'s exception unless its waiter gave up (cancelled)."""
    if not future.done():
        future.set_exception(error)
