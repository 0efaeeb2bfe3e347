"""The Redis engine's one pub/sub connection: topics, notices and wake-ups.

Each engine holds one connection in subscribed mode, apart from the pool the
commands use (a subscribed connection can do nothing else). It listens to:

- the topic channel, shared by every broker (see :mod:`gateway.engines.redis.engine`
  for why one channel);
- its broker's notice channel;
- one wake-up channel per queue that has a consumer waiting in ``fetch``,
  subscribed while someone waits and dropped when nobody does.

A reader task reads replies forever and hands each message to
``on_message(channel, data)``. Subscribing is confirmed: :meth:`Subscriber.join`
returns once Redis has replied to SUBSCRIBE, so a message published after it
returns cannot be missed, which is what lets ``fetch`` arm its wake-up and
only then look at the queue.

When the connection drops, the reader reconnects with backoff and subscribes
again to every channel still wanted, then calls ``on_reconnect`` (the engine
wakes every waiting consumer, since wake-ups may have been lost meanwhile).
Pub/sub keeps nothing for a disconnected subscriber: topic messages and
notices published while the connection was down are lost, as topic messages
are for a subscriber that is offline.

On a Redis Cluster the engine holds no such connection: topics, notices and
wake-ups all go by sharded pub/sub (:mod:`gateway.engines.redis.sharded`), and
:class:`Wakeups` works over either (:class:`Channels`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Final, Protocol

from redis.asyncio.connection import AbstractConnection

from gateway.engines.base import EngineUnavailable
from gateway.engines.redis.batch import CONNECTION_ERRORS, unavailable
from gateway.tasks import cancel_and_wait

__all__ = ["HEALTH_INTERVAL", "Channels", "Subscriber", "Wakeups"]

_log = logging.getLogger(__name__)

#: First and longest pause between reconnection attempts (seconds).
RETRY_DELAY: Final = 0.05
MAX_RETRY_DELAY: Final = 2.0
#: Seconds of silence after which the subscriber PINGs Redis; as long again
#: without any reply and the connection counts as lost.
HEALTH_INTERVAL: Final = 10.0

_MESSAGE: Final = b"message"
_SUBSCRIBE: Final = b"subscribe"


class Channels(Protocol):
    """What :class:`Wakeups` needs of a subscriber: confirmed, counted subscriptions."""

    async def join(self, channel: bytes, *, timeout: float = 0.0) -> None:
        """Hold a subscription; returns once Redis confirmed it."""

    def leave(self, channel: bytes) -> None:
        """Drop one reference."""


class Subscriber:
    """A subscribed connection with reference-counted channels.

    Args:
        connect: makes a new, unconnected connection (with the pool's settings).
        on_message: called with ``(channel, data)`` for every message, in the reader task.
        on_reconnect: called after the connection came back and resubscribed.
        health_interval: seconds of silence before a PING, and then before the
            connection counts as lost. A connection can die without a reset (a
            host gone, a NAT or proxy dropping it): TCP keeps it open for hours,
            and without this the broker would hear no topic message meanwhile.
    """

    def __init__(
        self,
        connect: Callable[[], AbstractConnection],
        on_message: Callable[[bytes, bytes], None],
        on_reconnect: Callable[[], None],
        *,
        health_interval: float = HEALTH_INTERVAL,
    ) -> None:
        self._connect = connect
        self._health_interval = health_interval
        self._on_message = on_message
        self._on_reconnect = on_reconnect
        self._connection: AbstractConnection | None = None
        self._channels: dict[bytes, int] = {}
        self._confirming: dict[bytes, asyncio.Future[None]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._sending = asyncio.Lock()
        self._up = asyncio.Event()
        self._closed = False

    async def start(self, channels: Iterable[bytes]) -> None:
        """Connect, subscribe to ``channels`` for good, and start reading.

        Raises:
            EngineUnavailable: Redis cannot be reached.
        """
        connection = self._connect()
        try:
            await connection.connect()  # type: ignore[no-untyped-call]  # unannotated upstream
        except CONNECTION_ERRORS as exc:
            raise unavailable(exc) from exc
        self._connection = connection
        self._up.set()
        self._reader = asyncio.get_running_loop().create_task(self._read())
        await asyncio.gather(*(self.join(channel) for channel in channels))

    async def join(self, channel: bytes, *, timeout: float = 0.0) -> None:
        """Hold a subscription to ``channel``; returns once Redis confirmed it.

        Args:
            channel: the channel.
            timeout: seconds to wait for the connection to come back if it is down.

        Raises:
            EngineUnavailable: the connection is down and did not come back in
                time, or dropped before Redis confirmed (the reference is not kept).
        """
        if self._connection is None:
            try:
                async with asyncio.timeout(timeout):
                    await self._up.wait()
            except TimeoutError:
                raise EngineUnavailable("the Redis pub/sub connection is down") from None
        count = self._channels.get(channel, 0)
        self._channels[channel] = count + 1
        try:
            if count == 0:
                await self._subscribe(channel)
            else:
                confirming = self._confirming.get(channel)
                if confirming is not None:
                    await asyncio.shield(confirming)
        except BaseException:
            self.leave(channel)
            raise

    def leave(self, channel: bytes) -> None:
        """Drop one reference; unsubscribe when it was the last."""
        count = self._channels.get(channel, 0) - 1
        if count > 0:
            self._channels[channel] = count
            return
        self._channels.pop(channel, None)
        if self._connection is not None and not self._closed:
            task = asyncio.get_running_loop().create_task(self._unsubscribe(channel))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        """Stop reading and disconnect."""
        self._closed = True
        tasks = [*self._background]
        if self._reader is not None:
            tasks.append(self._reader)
        for task in tasks:
            task.cancel()
        for task in tasks:
            # A task cancelled mid-send can fail inside redis-py (a connection
            # torn down under it raises AttributeError or a connection error);
            # at close nothing it was doing matters any more.
            await cancel_and_wait(task, ignore=(AttributeError, *CONNECTION_ERRORS))
        self._fail_confirming(EngineUnavailable("the Redis engine is closed"))
        if self._connection is not None:
            await self._connection.disconnect()
            self._connection = None

    async def _subscribe(self, channel: bytes) -> None:
        if self._connection is None:
            raise EngineUnavailable("the Redis pub/sub connection is down")
        confirming = self._confirming.get(channel)
        if confirming is None:
            confirming = self._confirming[channel] = asyncio.get_running_loop().create_future()
            try:
                await self._send("SUBSCRIBE", channel)
            except CONNECTION_ERRORS as exc:
                self._confirming.pop(channel, None)
                raise unavailable(exc) from exc
        await asyncio.shield(confirming)

    async def _unsubscribe(self, channel: bytes) -> None:
        # The lock orders this after any SUBSCRIBE already being written; a
        # channel joined again meanwhile stays. A dead connection needs nothing:
        # the reader resubscribes to the channels still wanted.
        async with self._sending:
            if channel not in self._channels and self._connection is not None:
                with contextlib.suppress(*CONNECTION_ERRORS):
                    await self._connection.send_command("UNSUBSCRIBE", channel, check_health=False)

    async def _send(self, *args: bytes | str) -> None:
        async with self._sending:
            if self._connection is None:
                raise ConnectionError("the Redis pub/sub connection is down")
            await self._connection.send_command(*args, check_health=False)

    async def _read(self) -> None:
        delay = RETRY_DELAY
        pinged: AbstractConnection | None = None  # the connection a PING is pending on
        while not self._closed:
            connection = self._connection
            try:
                if connection is None:
                    raise ConnectionError("not connected")
                # A float timeout: redis-py returns None and keeps the partial
                # reply, if any, buffered for the next read.
                reply = await connection.read_response(
                    timeout=self._health_interval, push_request=True
                )
                if reply is None:
                    if pinged is connection:
                        raise ConnectionError(
                            f"no reply to PING for {self._health_interval:g} seconds"
                        )
                    pinged = connection
                    await self._send("PING")  # any reply proves the connection alive
                    continue
                pinged = None
            except CONNECTION_ERRORS as exc:
                self._fail_confirming(unavailable(exc))
                self._up.clear()
                if connection is not None:
                    self._connection = None
                    with contextlib.suppress(*CONNECTION_ERRORS):
                        await connection.disconnect()
                    _log.warning("Redis pub/sub connection lost: %s", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_RETRY_DELAY)
                await self._reconnect()
                continue
            delay = RETRY_DELAY
            kind = reply[0]
            if kind == _MESSAGE:
                try:
                    self._on_message(reply[1], reply[2])
                except Exception:  # the edge: a bad message or listener must not stop the reader
                    _log.exception("Redis pub/sub message on %r not handled", reply[1])
            elif kind == _SUBSCRIBE:
                confirming = self._confirming.pop(reply[1], None)
                if confirming is not None and not confirming.done():
                    confirming.set_result(None)

    async def _reconnect(self) -> None:
        connection = self._connect()
        try:
            await connection.connect()  # type: ignore[no-untyped-call]  # unannotated upstream
            if self._channels:
                await connection.send_command("SUBSCRIBE", *self._channels, check_health=False)
        except CONNECTION_ERRORS:
            with contextlib.suppress(*CONNECTION_ERRORS):
                await connection.disconnect()
            return
        self._connection = connection
        self._up.set()
        _log.info("Redis pub/sub connection restored")
        self._on_reconnect()

    def _fail_confirming(self, error: EngineUnavailable) -> None:
        confirming, self._confirming = self._confirming, {}
        for future in confirming.values():
            if not future.done():
                future.set_exception(error)
                future.exception()  # retrieved here: each joiner gets its own raise


class Wakeups:
    """Consumers waiting in ``fetch``, per queue, and their wake-up channels.

    Args:
        subscriber: holds the channel subscriptions (classic, or sharded on a cluster).
        channel_of: the wake-up channel of a queue.
    """

    def __init__(self, subscriber: Channels, channel_of: Callable[[str], bytes]) -> None:
        self._subscriber = subscriber
        self._channel_of = channel_of
        self._waiting: dict[str, set[asyncio.Event]] = {}

    async def join(self, queue: str, *, timeout: float = 0.0) -> asyncio.Event:
        """An event set whenever ``queue`` may have changed, armed once this returns.

        Raises:
            EngineUnavailable: the pub/sub connection is down for ``timeout`` seconds.
        """
        event = asyncio.Event()
        self._waiting.setdefault(queue, set()).add(event)
        try:
            await self._subscriber.join(self._channel_of(queue), timeout=timeout)
        except BaseException:
            self._forget(queue, event)
            raise
        return event

    def leave(self, queue: str, event: asyncio.Event) -> None:
        """Stop waiting (the ``event`` from :meth:`join`)."""
        self._forget(queue, event)
        self._subscriber.leave(self._channel_of(queue))

    def wake(self, queue: str) -> None:
        """Set every waiter's event for ``queue``."""
        for event in self._waiting.get(queue, ()):
            event.set()

    def wake_all(self) -> None:
        """Set every waiter's event (after a reconnection, or on close)."""
        for events in self._waiting.values():
            for event in events:
                event.set()

    def _forget(self, queue: str, event: asyncio.Event) -> None:
        events = self._waiting.get(queue)
        if events is not None:
            events.discard(event)
            if not events:
                del self._waiting[queue]
