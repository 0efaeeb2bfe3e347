"""A User-Agent in Python: requests, streams and pushes over one Channel.

Theory of operation
-------------------
A :class:`UserAgent` is one Channel (a ``agents.channel`` transport, over
WebSocket or HTTP long-polling; the API is the same) plus a table of the
Commands it awaits answers to, keyed by ``u``.

Every Command it sends to be answered gets a fresh ``u`` (0..65535,
wrapping, skipping those still awaited; §1.3.4.2 u). Every Command that
arrives is sorted by its ``u``:

* a ``u`` that is awaited: to that request or stream (a fault included,
  which the request raises as :class:`~agents.errors.FaultError`);
* no ``u``: *unsolicited* (group messages, pushes, faults about nothing in
  particular), queued for ``async for command in ua`` / :meth:`receive`;
* a ``u`` no longer awaited (a late answer after a timeout, the remaining
  parts of a stream read with :meth:`request`): dropped, logged at DEBUG.

Streams (§1.3.4.2 t and o): the first part carries ``t``, the total, and
each part ``o``, its one-based place. :meth:`stream` yields parts in ``o``
order whatever order they arrive in, holding early ones back, and ends
after part ``t``. An answer with neither ``t`` nor ``o`` is a stream of one.

Memory is bounded everywhere: the unsolicited queue drops its oldest
Command when full (with a warning), and a request's or stream's buffer
fails the stream when a slow reader lets it fill.

Reconnecting (``agents.reconnect``): when the Channel ends without
:meth:`UserAgent.close`, a task dials again with backoff and jitter, telling
``on_event`` each step; requests made meanwhile fail with ``ChannelLost``
(:meth:`UserAgent.wait_connected` waits for the Channel), and
:meth:`UserAgent.receive` keeps waiting across the gap. The requests awaiting
their answers at the drop wait too when the Channel can be resumed (a
WebSocket Channel whose secret is known): a resumed Channel gets every
Command routed to it while away, their answers included, so they are answered
as though nothing happened. They fail with :class:`~agents.errors.ChannelLost`
when it is not resumed (a new Channel was opened: fault 2110 or 2113, or
nothing to resume), with ``ConnectionLost`` when reconnecting gives up, and
each with ``TimeoutError`` when its own timeout passes first. A Channel that
cannot be resumed (HTTP) fails them at the drop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl as ssl_module
from collections import deque
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Final

from agents import control
from agents.backoff import Backoff
from agents.channel import ChannelTransport, HttpChannel, ResumeRefused, WebSocketChannel
from agents.errors import AgentError, ChannelLost, ConnectionLost, FaultError, NotConnected
from agents.messaging import DestinationType
from agents.reconnect import DEFAULT_RECONNECT, ChannelEvent, ChannelEventKind, Reconnect
from agents.retry_after import retry_after_of, wait_before
from asbp import ChannelId, Command, HeaderInput
from asbp.names import SUBSCRIBE, UNSUBSCRIBE

__all__ = ["UserAgent"]

#: Parts a stream may hold back while waiting for an earlier one.
_MAX_HELD: Final = 4096
#: Called with each step of losing the Channel and getting one back.
OnEvent = Callable[[ChannelEvent], object]


class _Answers:
    """The Commands that answer one ``u``, in arrival order, bounded."""

    __slots__ = ("_error", "_event", "_items", "_limit")

    def __init__(self, limit: int) -> None:
        self._items: deque[Command] = deque()
        self._event = asyncio.Event()
        self._error: BaseException | None = None
        self._limit = limit

    def put(self, command: Command) -> None:
        if len(self._items) >= self._limit:
            self.fail(AgentError(f"more than {self._limit} unread answers; read faster"))
            return
        self._items.append(command)
        self._event.set()

    def fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._event.set()

    async def get(self, timeout: float | None) -> Command:
        async with asyncio.timeout(timeout):
            while not self._items:
                if self._error is not None:
                    raise self._error
                self._event.clear()
                await self._event.wait()
        return self._items.popleft()


class UserAgent:
    """A User-Agent on one Channel; build it with :meth:`websocket` or :meth:`http`.

    ::

        async with UserAgent.websocket("ws://127.0.0.1:8080/asbp") as ua:
            reply = await ua.request("echo", b"hi")
            async for part in ua.stream("clock"):
                ...

    Args:
        transport: the Channel transport.
        max_queued: unsolicited Commands kept for :meth:`receive` before the
            oldest is dropped.
        logger: where to log.
        reconnect: how to dial again after the Channel is lost; None: stay
            closed (the first loss ends the UserAgent).
        on_event: called with every :class:`~agents.reconnect.ChannelEvent`.
    """

    def __init__(
        self,
        transport: ChannelTransport,
        *,
        max_queued: int = 1024,
        logger: logging.Logger | None = None,
        reconnect: Reconnect | None = DEFAULT_RECONNECT,
        on_event: OnEvent | None = None,
    ) -> None:
        if max_queued < 1:
            raise ValueError("max_queued must be at least 1")
        self._transport = transport
        self._log = logger or logging.getLogger("asbp.user_agent")
        self._ids = control.CommandIds()
        self._awaited: dict[int, _Answers] = {}
        self._unsolicited: deque[Command] = deque()
        self._max_queued = max_queued
        self._arrived = asyncio.Event()
        self._channel_id: ChannelId | None = None
        self._broker_id: str | None = None
        self._closed: BaseException | None = None
        self._opened = False
        self._reconnect = reconnect
        self._on_event = on_event
        #: Set while a Channel is open.
        self._connected = asyncio.Event()
        #: Set by :meth:`close`: a Channel ending now is not lost.
        self._closing = False
        self._reconnector: asyncio.Task[None] | None = None
        #: Topic and queue subscriptions made with :meth:`subscribe`: (type, destination),
        #: in the order made; subscribed again after a reconnection that did not keep them.
        self._subscriptions: dict[tuple[str, str], None] = {}
        self._restoring: asyncio.Task[None] | None = None

    @classmethod
    def websocket(
        cls,
        url: str | Sequence[str],
        *,
        ssl: ssl_module.SSLContext | None = None,
        timeout: float = 10.0,
        max_queued: int = 1024,
        logger: logging.Logger | None = None,
        reconnect: Reconnect | None = DEFAULT_RECONNECT,
        on_event: OnEvent | None = None,
    ) -> UserAgent:
        """A User-Agent over a WebSocket Channel (``ws(s)://host/asbp``).

        ``url`` may list several brokers of one bus: the Channel opens at the first
        that answers and, once lost, is resumed at the next (at once when its
        broker said it is stopping, close 1012; docs/user-agents.md).
        """
        transport = WebSocketChannel(url, ssl=ssl, timeout=timeout, logger=logger)
        return cls(
            transport,
            max_queued=max_queued,
            logger=logger,
            reconnect=reconnect,
            on_event=on_event,
        )

    @classmethod
    def http(
        cls,
        url: str,
        *,
        poll_wait: float = 20.0,
        ssl: ssl_module.SSLContext | None = None,
        timeout: float = 10.0,
        backoff: Backoff | None = None,
        max_poll_bytes: int = 32 * 1024 * 1024,
        max_queued: int = 1024,
        logger: logging.Logger | None = None,
        reconnect: Reconnect | None = DEFAULT_RECONNECT,
        on_event: OnEvent | None = None,
    ) -> UserAgent:
        """A User-Agent over a stateless HTTP Channel (``http(s)://host/asbp``).

        See :class:`~agents.channel.HttpChannel` for the parameters.
        """
        transport = HttpChannel(
            url,
            poll_wait=poll_wait,
            ssl=ssl,
            timeout=timeout,
            backoff=backoff,
            max_poll_bytes=max_poll_bytes,
            logger=logger,
        )
        return cls(
            transport,
            max_queued=max_queued,
            logger=logger,
            reconnect=reconnect,
            on_event=on_event,
        )

    # -- life cycle ------------------------------------------------------------

    async def connect(self) -> None:
        """Open the Channel.

        Raises:
            AgentError: already opened, or the broker's greeting was wrong.
            FaultError: the broker refused.
            OSError, httpx.HTTPError, websockets errors: could not connect.
        """
        if self._opened:
            raise AgentError("a UserAgent connects once")
        self._opened = True
        self._channel_id, self._broker_id = await self._transport.open(
            self._deliver, self._on_closed
        )
        self._connected.set()

    async def close(self) -> None:
        """Close the Channel (and stop reconnecting); pending requests fail with
        ConnectionLost."""
        self._closing = True
        reconnector, self._reconnector = self._reconnector, None
        restoring, self._restoring = self._restoring, None
        if restoring is not None:
            restoring.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await restoring
        if reconnector is not None:
            reconnector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reconnector
        if not self._connected.is_set():
            # Closed while reconnecting: the requests that waited for a resume end.
            self._fail_awaited(
                lambda: ConnectionLost("the Channel was closed before the answer came"), None
            )
        await self._transport.close()
        self._on_closed(None)

    async def wait_connected(self, timeout: float | None = None) -> None:
        """Wait until a Channel is open (at once if one is).

        Raises:
            NotConnected: before :meth:`connect`.
            ConnectionLost: the UserAgent is closed (or gave up reconnecting).
            TimeoutError: not within ``timeout``.
        """
        if not self._opened:
            raise NotConnected("the UserAgent is not connected")
        async with asyncio.timeout(timeout):
            while not self._connected.is_set():
                if self._closed is not None:
                    raise ConnectionLost("the Channel has ended") from self._closed
                self._arrived.clear()
                await self._arrived.wait()
        if self._closed is not None:
            raise ConnectionLost("the Channel has ended") from self._closed

    async def __aenter__(self) -> UserAgent:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def channel_id(self) -> ChannelId:
        """``i``, this Channel's identifier.

        Raises:
            NotConnected: before :meth:`connect`.
        """
        if self._channel_id is None:
            raise NotConnected("the UserAgent is not connected")
        return self._channel_id

    @property
    def broker_id(self) -> str | None:
        """``b`` of the broker, if it said."""
        return self._broker_id

    @property
    def closed(self) -> bool:
        """Whether the Channel has ended for good (not while reconnecting)."""
        return self._closed is not None

    @property
    def connected(self) -> bool:
        """Whether a Channel is open now."""
        return self._connected.is_set() and self._closed is None

    # -- sending -----------------------------------------------------------------

    async def send(self, command: Command) -> None:
        """Send ``command`` as it is; nothing is awaited (fire and forget).

        Raises:
            FaultError: the broker refused it outright (HTTP only).
            ConnectionLost: the Channel is closed.
        """
        self._check_open()
        await self._transport.send(command)

    async def request(
        self,
        name: str,
        body: bytes | str = b"",
        *,
        timeout: float | None = 30.0,
        **keys: HeaderInput,
    ) -> Command:
        """Send ``name`` with a fresh ``u`` and return the first Command answering it.

        Args:
            name: the Command-Name ``c``.
            body: the body; a ``str`` is sent as UTF-8 with ``e=UTF-8``.
            timeout: seconds to wait for the answer; None waits for ever.
            **keys: more header keys (not ``c`` or ``u``).

        Raises:
            FaultError: the answer is an ``asbp.fault``.
            ConnectionLost: the Channel closed first.
            TimeoutError: no answer within ``timeout``.
        """
        command_id, answers = self._await(1)
        try:
            await self._send_numbered(name, body, keys, command_id)
            return _checked(await answers.get(timeout))
        finally:
            self._awaited.pop(command_id, None)

    async def stream(
        self,
        name: str,
        body: bytes | str = b"",
        *,
        timeout: float | None = 30.0,
        **keys: HeaderInput,
    ) -> AsyncGenerator[Command, None]:
        """Send ``name`` and yield the parts of its answer in ``o`` order.

        The request goes out when iteration starts. Close the iterator if you
        stop early (``contextlib.aclosing``), so its ``u`` is released.

        Args:
            timeout: seconds to wait for each next part.

        Raises:
            FaultError: a part is an ``asbp.fault``.
            AgentError: a part is malformed, or too many arrived out of order.
            ConnectionLost, TimeoutError: as for :meth:`request`.
        """
        command_id, answers = self._await(_MAX_HELD)
        try:
            await self._send_numbered(name, body, keys, command_id)
            total: int | None = None
            expected = 1
            held: dict[int, Command] = {}
            while total is None or expected <= total:
                part = _checked(await answers.get(timeout))
                if part.total is not None:
                    total = part.total
                position = part.of_total
                if position is None:
                    if total is None:
                        yield part  # a plain reply: a stream of one
                        return
                    position = 1  # t without o: the first part
                if position < expected or position in held:
                    continue  # a repeat
                if total is not None and position > total:
                    raise AgentError(f"part {position} of a {total}-part stream")
                held[position] = part
                if len(held) > _MAX_HELD:
                    raise AgentError(f"more than {_MAX_HELD} parts arrived out of order")
                while expected in held:
                    yield held.pop(expected)
                    expected += 1
        finally:
            self._awaited.pop(command_id, None)

    # -- receiving -------------------------------------------------------------

    async def subscribe(
        self, destination: str, *, type: DestinationType = "TOPIC", timeout: float | None = 30.0
    ) -> Command:
        """``asbp.subscribe`` (docs/protocol.md, "Topics and queues"): its acceptance.

        Notifications arrive through :meth:`receive` (they carry no ``u``). The
        subscription is remembered: after a reconnection whose ``asbp.resumed`` does
        not say ``subscriptions`` were kept (a new Channel, or a broker that keeps
        none), it is made again (a failure is logged); a resumed Channel that kept
        them is not sent it again.

        Raises:
            FaultError: the broker refused it (2001, 2002, 2004, 3201, ...).
        """
        answer = await self.request(SUBSCRIBE, timeout=timeout, destination=destination, type=type)
        self._subscriptions[(type, destination)] = None
        return answer

    async def unsubscribe(
        self, destination: str, *, type: DestinationType = "TOPIC", timeout: float | None = 30.0
    ) -> Command:
        """``asbp.unsubscribe``: its acceptance; no longer made again after reconnecting."""
        self._subscriptions.pop((type, destination), None)
        return await self.request(UNSUBSCRIBE, timeout=timeout, destination=destination, type=type)

    async def _subscribe_again(self) -> None:
        for kind, destination in list(self._subscriptions):
            try:
                await self.request(SUBSCRIBE, destination=destination, type=kind)
            except AgentError as exc:
                self._log.warning(
                    "user agent: %s %s not subscribed again: %s", kind, destination, exc
                )

    async def receive(self, timeout: float | None = None) -> Command:
        """The next unsolicited Command (one answering no request of ours).

        Raises:
            ConnectionLost: the Channel has ended and nothing is queued.
            TimeoutError: nothing within ``timeout``.
        """
        async with asyncio.timeout(timeout):
            while not self._unsolicited:
                if self._closed is not None:
                    raise ConnectionLost("the Channel has ended") from self._closed
                self._arrived.clear()
                await self._arrived.wait()
        return self._unsolicited.popleft()

    async def __aiter__(self) -> AsyncGenerator[Command, None]:
        """Unsolicited Commands until the Channel ends."""
        while True:
            try:
                command = await self.receive()
            except ConnectionLost:
                return
            yield command

    # -- internals ---------------------------------------------------------------

    def _check_open(self) -> None:
        if self._channel_id is None:
            raise NotConnected("the UserAgent is not connected")
        if self._closed is not None:
            raise ConnectionLost("the Channel has ended") from self._closed
        if not self._connected.is_set():
            raise ChannelLost("the Channel was lost and is reconnecting; see wait_connected()")

    def _await(self, limit: int) -> tuple[int, _Answers]:
        self._check_open()
        command_id = self._ids.allocate(self._awaited)
        answers = _Answers(limit)
        self._awaited[command_id] = answers
        return command_id, answers

    async def _send_numbered(
        self, name: str, body: bytes | str, keys: dict[str, HeaderInput], command_id: int
    ) -> None:
        if "c" in keys or "u" in keys:
            raise TypeError("'c' and 'u' are set by the UserAgent")
        data = control.text_body(body, keys)
        keys["c"] = name
        keys["u"] = command_id
        await self._transport.send(Command(keys, data))

    def _deliver(self, command: Command) -> None:
        command_id = command.command_id
        if command_id is not None:
            answers = self._awaited.get(command_id)
            if answers is not None:
                answers.put(command)
            else:
                self._log.debug("user agent: dropped an answer nobody awaits: %r", command)
            return
        queue = self._unsolicited
        if len(queue) >= self._max_queued:
            dropped = queue.popleft()
            self._log.warning("user agent: queue full; dropped the oldest: %r", dropped)
        queue.append(command)
        self._arrived.set()

    def _on_closed(self, error: BaseException | None) -> None:
        if self._closed is not None or not self._connected.is_set():
            return
        self._connected.clear()
        lost = not self._closing and self._reconnect is not None
        if not lost:
            self._fail_awaited(
                lambda: ConnectionLost("the Channel ended before the answer came"), error
            )
        elif not getattr(self._transport, "resumable", False):
            self._fail_awaited(_channel_lost, error)
        # else: they wait for the resume, which replays their answers (or fails them).
        self._arrived.set()
        if not lost:
            self._closed = error or ConnectionLost("the Channel was closed")
            return
        self._log.warning("user agent: Channel %s lost (%s); reconnecting", self._channel_id, error)
        self._emit(ChannelEvent(ChannelEventKind.LOST, self._channel_id, error=error))
        self._reconnector = asyncio.get_running_loop().create_task(
            self._reconnect_loop(), name="asbp-user-agent-reconnect"
        )

    async def _reconnect_loop(self) -> None:
        settings = self._reconnect
        assert settings is not None
        previous = self._channel_id
        error: BaseException | None = None
        attempt = 0
        # A broker that stops on a bus (close 1012) released the Channel for another:
        # no reason to wait, and every other broker is ready for it.
        restarting = self._transport.restarting
        while True:
            delay = (
                0.0
                if restarting and attempt == 0
                # At least what a broker that turned the last attempt away asked for.
                else wait_before(retry_after_of(error), settings.backoff.delay(attempt))
            )
            self._emit(
                ChannelEvent(
                    ChannelEventKind.RECONNECTING,
                    previous,
                    attempt=attempt,
                    delay=delay,
                    error=error,
                )
            )
            await asyncio.sleep(delay)  # a backoff delay, not synchronisation
            # Each attempt at the next broker, if there are several: the last one
            # is stopping, or gone.
            self._transport.elsewhere()
            try:
                identity = await self._reopen(previous)
            except Exception as exc:  # any failure to dial is one more attempt
                error = exc
                attempt += 1
                self._log.info("user agent: reconnect attempt %d failed: %s", attempt, exc)
                if settings.max_attempts is not None and attempt >= settings.max_attempts:
                    self._reconnector = None
                    self._closed = ConnectionLost(f"gave up reconnecting after {attempt} attempts")
                    self._closed.__cause__ = exc
                    self._fail_awaited(functools.partial(ConnectionLost, str(self._closed)), exc)
                    self._arrived.set()
                    self._emit(
                        ChannelEvent(ChannelEventKind.GAVE_UP, previous, attempt=attempt, error=exc)
                    )
                    return
                continue
            self._reconnector = None
            self._channel_id, self._broker_id = identity
            self._connected.set()
            self._arrived.set()
            self._log.info("user agent: Channel %s replaces %s", identity[0], previous)
            resumed = identity[0] == previous
            if not resumed:
                # A new Channel: the answers owed to the old one will never come.
                self._fail_awaited(_channel_lost, error)
            kept = self._transport.kept if resumed else frozenset()
            subjects = self._transport.subjects if resumed else frozenset()
            if self._subscriptions and "subscriptions" not in kept:
                # Not kept by the broker (or a new Channel): made again, in the order made.
                self._restoring = asyncio.get_running_loop().create_task(
                    self._subscribe_again(), name="asbp-user-agent-subscribe-again"
                )
            self._emit(
                ChannelEvent(
                    ChannelEventKind.RECONNECTED,
                    identity[0],
                    previous=previous,
                    kept=kept,
                    subjects=subjects,
                )
            )
            return

    async def _reopen(self, previous: ChannelId | None) -> tuple[ChannelId, str | None]:
        """Open a Channel again after losing ``previous``: its ``i`` and the ``b``.

        A WebSocket Channel is resumed, on whichever broker answers: the same
        ``i``, and what was routed to it meanwhile arrives next, in order and
        once (docs/protocol.md, "Resuming a Channel"). A broker that has no
        such Channel to resume (it expired, or resume is off) refuses, and a
        new Channel is opened instead.
        """
        try:
            resumed = await self._transport.resume(self._deliver, self._on_closed)
        except ResumeRefused as exc:
            self._log.info("user agent: Channel %s not resumed (%s); opening anew", previous, exc)
            resumed = None
        if resumed is not None:
            return resumed
        return await self._transport.open(self._deliver, self._on_closed)

    def _fail_awaited(self, make: Callable[[], BaseException], cause: BaseException | None) -> None:
        """Every awaited answer fails, each with its own error from ``make``."""
        for answers in self._awaited.values():
            failure = make()
            failure.__cause__ = cause
            answers.fail(failure)

    def _emit(self, event: ChannelEvent) -> None:
        if self._on_event is None:
            return
        try:
            self._on_event(event)
        except Exception:  # the caller's callback must not stop reconnecting
            self._log.exception("user agent: on_event failed for %s", event.kind.value)


def _channel_lost() -> ChannelLost:
    return ChannelLost("the Channel was lost before the answer came; it may have been acted on")


def _checked(command: Command) -> Command:
    if command.name == control.FAULT:
        raise FaultError.from_command(command)
    return command
