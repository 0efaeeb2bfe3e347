"""User-Agent Channels: the two transports behind ``agents.UserAgent``.

Both speak to the broker's ``/asbp`` endpoint (docs/protocol.md,
"Transports") and do the same three things: open a Channel and learn its
``i``, send one Command, and hand every Command that arrives to a callback.

* :class:`WebSocketChannel`: one WebSocket; the broker's first message is
  ``asbp.channel`` with ``i`` and ``b``; then one message per Command.
* :class:`HttpChannel`: stateless HTTP (§2.6). ``POST c=asbp.channel;``
  opens the Channel; every later POST carries ``i``. One background task
  long-polls ``GET /asbp?i=&after=&wait=`` for as long as the Channel is
  open. ``after`` is the highest ``ASBP-Seq`` read so far, which also
  acknowledges it; the broker resends anything not acknowledged, so a
  response lost on the way costs nothing, and a repeated ``ASBP-Seq`` is
  dropped here. Failed polls are retried with backoff (at least the
  ``Retry-After`` of a 503 or 429: :mod:`agents.retry_after`); a Channel the
  broker no longer knows (404 or 410 with a fault) ends the transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import ssl as ssl_module
from collections import deque
from collections.abc import Callable, Sequence
from typing import Final, Protocol

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.typing import Subprotocol

import asbp
from agents import control
from agents.backoff import Backoff
from agents.errors import AgentError, BrokerBusy, ConnectionLost, FaultError
from agents.multipart import MEDIA_TYPE, boundary_of, parse_parts
from agents.retry_after import RETRY_STATUSES, retry_after_in, retry_after_of, wait_before
from asbp import ChannelId, Command, FaultCode, ProtocolError
from asbp.names import NOTIFICATION, RESUME, RESUMED, SECRET_HEADER, SECRET_KEY

__all__ = [
    "CLOSE_SERVICE_RESTART",
    "COUNT_QUERY",
    "ChannelTransport",
    "Closed",
    "Deliver",
    "HttpChannel",
    "ResumeRefused",
    "WebSocketChannel",
    "is_queue_delivery",
]

#: Called with every Command that arrives.
Deliver = Callable[[Command], None]
#: Called once when the Channel ends: None for a clean close, else why.
Closed = Callable[[BaseException | None], None]

_SUBPROTOCOL: Final = Subprotocol("asbp")
#: The largest single-Command HTTP response we read (a POST's answer).
_MAX_ANSWER_BYTES: Final = 1024 * 1024
#: HTTP statuses that mean the Channel is gone for good.
_GONE: Final = frozenset({404, 410})
#: Fault codes of a resume (docs/protocol.md, "Resuming a Channel"), as header values.
_GAP: Final = str(int(FaultCode.RESUME_GAP))
_NOT_RESUMABLE: Final = frozenset(
    {str(int(FaultCode.RESUME_REFUSED)), str(int(FaultCode.RESUME_UNAVAILABLE))}
)
#: The close reason of a connection whose Channel another connection resumed.
_TAKEN: Final = str(int(FaultCode.CHANNEL_RESUMED))
#: The close code of a broker that stops and hands its Channels to the rest of its
#: bus ("Service Restart", with fault 2114 as the reason): resume elsewhere at once.
CLOSE_SERVICE_RESTART: Final = 1012
#: How many frames sent on a connection the Channel keeps, to send again after a 1012
#: whose ``read=<n>`` says the broker did not act on them: at a stop the broker
#: leaves unread only what was in flight, far fewer.
RESEND_WINDOW: Final = 4096
_READ: Final = re.compile(r"\bread=(\d+)")
#: Sent on every connection to ``/asbp``, new or resumed: this Channel does not count
#: queue deliveries, so the broker leaves them out of the Channel's log (without it,
#: as from an older client, the broker logs them and the client must count them).
COUNT_QUERY: Final = "count=2"


class ChannelTransport(Protocol):
    """What ``UserAgent`` needs from a transport."""

    #: What followed the Channel on its last resume, as the broker said (``kept``
    #: of ``asbp.resumed``: ``groups``, ``subjects``, ``subscriptions``); empty when
    #: it was not resumed.
    kept: frozenset[str]
    #: The ``s`` of the Subjects that followed it on its last resume (``subjects``
    #: of ``asbp.resumed``).
    subjects: frozenset[str]
    #: The broker said it is stopping (close 1012): come back elsewhere at once.
    restarting: bool

    def elsewhere(self) -> None:
        """Use the next broker URL, if there are several, for the next attempt."""

    async def open(self, deliver: Deliver, closed: Closed) -> tuple[ChannelId, str | None]:
        """Open a Channel; return its ``i`` and the broker's ``b``."""

    async def send(self, command: Command) -> None:
        """Send one Command (the transport adds ``i`` if it must).

        Raises:
            FaultError: the broker refused it outright (HTTP only).
            ConnectionLost: the Channel is closed.
        """

    async def close(self) -> None:
        """Close the Channel; ``closed`` is called if it was not already."""

    async def resume(self, deliver: Deliver, closed: Closed) -> tuple[ChannelId, str | None] | None:
        """Take the lost Channel back (docs/protocol.md, "Resuming a Channel"):
        its ``i`` and the ``b`` of the broker that took it; None: nothing to resume.

        Raises:
            ResumeRefused: the broker has no such Channel to resume (open a new one).
            OSError, websockets errors: could not connect (try again later).
        """


class ResumeRefused(AgentError):
    """The broker cannot resume the Channel (fault 2110 or 2113): open a new one."""


def is_queue_delivery(command: Command) -> bool:
    """Whether ``command`` is a queue delivery: an ``asbp.notification`` with a
    ``receipt``. A resumable Channel opened with ``count=2`` (:data:`COUNT_QUERY`)
    counts every frame after its greeting but these (docs/protocol.md, "Resuming a
    Channel")."""
    return command.name == NOTIFICATION and "receipt" in command


def _counts_deliveries(greeting: Command) -> bool:
    """Whether the broker's ``asbp.channel`` or ``asbp.resumed`` leaves queue
    deliveries in the log: it did not say ``count=2`` back."""
    return greeting.get("count") != "2"


def _with_count(url: str) -> str:
    """``url`` declaring how this Channel counts frames (:data:`COUNT_QUERY`)."""
    return f"{url}{'&' if '?' in url else '?'}{COUNT_QUERY}"


def _greeting(command: Command, expected: str) -> tuple[ChannelId, str | None]:
    channel_id = command.channel_id
    if command.name == control.FAULT:
        raise FaultError.from_command(command)
    if command.name != expected or channel_id is None:
        raise AgentError(f"expected {expected} with 'i' from the broker, got {command!r}")
    return channel_id, command.broker_id


class WebSocketChannel:
    """A Channel over one WebSocket (``ws://host/asbp`` or ``wss://``).

    ``url`` is one broker (or a Service in front of several), or several
    brokers of one bus: the Channel opens at the first that answers, and after
    a loss the User-Agent resumes it at the next (:meth:`elsewhere`), where the
    bus has kept what was routed to it meanwhile.

    Raises:
        ValueError: no URL at all.
    """

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        ssl: ssl_module.SSLContext | None = None,
        timeout: float = 10.0,
        logger: logging.Logger | None = None,
    ) -> None:
        #: Every broker (or Service) URL this Channel may use, in the order tried.
        self.urls: tuple[str, ...] = (url,) if isinstance(url, str) else tuple(url)
        if not self.urls:
            raise ValueError("a WebSocket Channel needs at least one URL")
        #: The URL in use (or tried next).
        self.url = self.urls[0]
        #: The broker said it is stopping (close 1012, fault 2114): resume at
        #: another one at once, without a backoff delay.
        self.restarting = False
        self._ssl = ssl
        self._timeout = timeout
        self._log = logger or logging.getLogger("asbp.user_agent")
        self._websocket: ClientConnection | None = None
        self.kept: frozenset[str] = frozenset()
        self.subjects: frozenset[str] = frozenset()
        self._reader: asyncio.Task[None] | None = None
        #: The Channel and its secret (from the greeting), to resume it; never logged.
        self._channel_id: ChannelId | None = None
        self._secret: str | None = None
        #: Frames received after the greeting: the number of the last one (resume).
        self.received = 0
        #: Whether queue deliveries count too: the broker did not say ``count=2``
        #: back (one from before the parameter logs them, so they must count).
        self.counts_deliveries = True
        #: Frames sent on this connection (counted as the broker counts them for
        #: ``read=<n>``), the last :data:`RESEND_WINDOW` of them kept; and the ``n``
        #: of a stopping broker's close: the frames after the n-th go again, first,
        #: where the Channel resumes.
        self._sent_count = 0
        self._sent: deque[bytes] = deque(maxlen=RESEND_WINDOW)
        self._read_by_broker: int | None = None

    async def _connect(self, url: str) -> ClientConnection:
        try:
            return await connect(
                _with_count(url),
                subprotocols=[_SUBPROTOCOL],
                ssl=self._ssl if url.startswith("wss:") else None,
                open_timeout=self._timeout,
                close_timeout=self._timeout,
            )
        except InvalidStatus as exc:
            # 503 past the broker's handshakes in flight (2115), 429 past a rate:
            # its Retry-After comes with the error, for the reconnect loop to honour.
            response = exc.response
            status = response.status_code
            if status not in RETRY_STATUSES:
                raise
            retry_after = retry_after_in(response.headers, status)
            body = bytes(response.body or b"")
            raise BrokerBusy.from_response(
                status, body, retry_after, default=FaultCode.BROKER_BUSY
            ) from exc

    def elsewhere(self) -> None:
        """Use the next URL of :attr:`urls` from now on (one URL: that one again)."""
        self.url = self.urls[(self.urls.index(self.url) + 1) % len(self.urls)]

    async def _connect_any(self) -> ClientConnection:
        """Connect at :attr:`url`, or the next URL that answers; the last error if none."""
        for _ in self.urls[1:]:
            try:
                return await self._connect(self.url)
            except (OSError, InvalidHandshake, TimeoutError, BrokerBusy) as exc:
                self._log.info("channel %s: not reachable (%s); the next URL", self.url, exc)
                self.elsewhere()
        return await self._connect(self.url)

    async def open(self, deliver: Deliver, closed: Closed) -> tuple[ChannelId, str | None]:
        websocket = await self._connect_any()
        self.restarting = False
        try:
            async with asyncio.timeout(self._timeout):
                first = await websocket.recv(decode=False)
            greeting = asbp.decode(first)
            identity = _greeting(greeting, control.CHANNEL)
        except BaseException:
            await websocket.close()
            raise
        secret = greeting.get(SECRET_KEY)
        self._channel_id = identity[0]
        self._secret = secret if isinstance(secret, str) else None
        self.received = 0
        self.counts_deliveries = _counts_deliveries(greeting)
        # What the old Channel's broker did not act on was for that Channel.
        self._forget_sent()
        self.kept = frozenset()
        self.subjects = frozenset()
        self._websocket = websocket
        self._reader = asyncio.create_task(self._read(websocket, deliver, closed))
        return identity

    @property
    def resumable(self) -> bool:
        """Whether :meth:`resume` will try: the Channel's ``i`` and secret are known."""
        return self._channel_id is not None and self._secret is not None

    async def resume(self, deliver: Deliver, closed: Closed) -> tuple[ChannelId, str | None] | None:
        channel_id, secret = self._channel_id, self._secret
        if channel_id is None or secret is None:
            return None
        separator = "&" if "?" in self.url else "?"
        websocket = await self._connect(f"{self.url}{separator}resume={channel_id}")
        self.restarting = False
        try:
            await websocket.send(
                asbp.encode(
                    Command(c=RESUME, i=channel_id, secret=secret, received=str(self.received))
                )
            )
            async with asyncio.timeout(self._timeout):
                answer = asbp.decode(await websocket.recv(decode=False))
                if answer.name == control.FAULT and answer.get("code") == _GAP:
                    # Retention dropped some of what was routed while away: said, then on.
                    self._log.warning("channel %s: %s", channel_id, answer.body.decode())
                    answer = asbp.decode(await websocket.recv(decode=False))
            if answer.name == control.FAULT and answer.get("code") in _NOT_RESUMABLE:
                raise ResumeRefused(answer.body.decode("utf-8", "replace"))
            identity = _greeting(answer, RESUMED)
            kept = answer.get("kept") or ()
            # A broker that keeps nothing says nothing: sign in and subscribe again
            # whatever it does not name.
            self.kept = frozenset((kept,) if isinstance(kept, str) else kept)
            subjects = answer.get("subjects") or ()
            self.subjects = frozenset((subjects,) if isinstance(subjects, str) else subjects)
            received = answer.get("received")
            self.received = int(received) if isinstance(received, str) else self.received
            self.counts_deliveries = _counts_deliveries(answer)
            # A new connection counts afresh; what the stopping broker did not act on
            # goes first, in order, before anything sent from now on.
            unread = self._unread()
            self._forget_sent()
            if unread:
                self._log.info(
                    "channel %s: sending again %d frames its last broker did not read",
                    channel_id,
                    len(unread),
                )
            for frame in unread:
                await websocket.send(frame)
                self._count_sent(frame)
        except BaseException:
            await websocket.close()
            raise
        self._websocket = websocket
        self._reader = asyncio.create_task(self._read(websocket, deliver, closed))
        return identity

    async def _read(self, websocket: ClientConnection, deliver: Deliver, closed: Closed) -> None:
        error: BaseException | None = None
        try:
            async for message in websocket:
                frame = message.encode("utf-8") if isinstance(message, str) else message
                try:
                    command = asbp.decode(frame)
                except ProtocolError as exc:
                    # Counted all the same: the broker logged every frame but queue
                    # deliveries, and it sends those well formed.
                    self.received += 1
                    self._log.warning("channel %s: dropped a frame: %s", self.url, exc)
                    continue
                if self.counts_deliveries or not is_queue_delivery(command):
                    # A queue delivery is not in the Channel's log when the broker
                    # said count=2 (the queue is its log: redelivered after a
                    # resume), so then it is not counted.
                    self.received += 1
                deliver(command)
        except ConnectionClosed as exc:
            error = ConnectionLost(f"the Channel closed: {exc}")
            if exc.rcvd is not None and exc.rcvd.reason.startswith(_TAKEN):
                # Another connection resumed it: taking it back would only fight it.
                self._channel_id = self._secret = None
            elif exc.rcvd is not None and exc.rcvd.code == CLOSE_SERVICE_RESTART:
                # Its broker is stopping and released the Channel for another.
                self.restarting = True
                self._read_by_broker = _broker_read_count(exc)
        finally:
            closed(error)

    async def send(self, command: Command) -> None:
        websocket = self._websocket
        if websocket is None:
            raise ConnectionLost("the Channel is not open")
        frame = asbp.encode(command)
        # Counted before the await: websockets writes the frame before its first
        # suspension, so concurrent sends are counted in the order they go out.
        self._count_sent(frame)
        try:
            await websocket.send(frame)
        except ConnectionClosed as exc:
            read = _broker_read_count(exc)
            if read is None or not self.resumable:
                raise ConnectionLost(f"the Channel closed: {exc}") from exc
            # The broker stopped and said how many frames it acted on: this one,
            # written or not, goes again where the Channel resumes if it is past
            # that count. If a new Channel opens instead, the request fails there.
            self._read_by_broker = read

    def _count_sent(self, frame: bytes) -> None:
        self._sent_count += 1
        self._sent.append(frame)

    def _forget_sent(self) -> None:
        self._sent_count = 0
        self._sent.clear()
        self._read_by_broker = None

    def _unread(self) -> list[bytes]:
        """After a 1012: the frames sent after the ``read=<n>``-th, which the stopping
        broker never acted on (docs/protocol.md, "A broker that stops")."""
        if self._read_by_broker is None:
            return []
        unread = self._sent_count - self._read_by_broker
        if unread <= 0:
            return []
        if unread > len(self._sent):
            self._log.warning(
                "channel %s: %d frames the broker did not read are past the %d kept",
                self._channel_id,
                unread - len(self._sent),
                RESEND_WINDOW,
            )
        return list(self._sent)[-unread:]

    async def close(self) -> None:
        if self._websocket is not None:
            await self._websocket.close()
        if self._reader is not None:
            await self._reader


class _Gone(AgentError):
    """The broker no longer knows the Channel."""


class HttpChannel:
    """A stateless HTTP Channel: POST to send, one long-poll loop to receive.

    Args:
        url: the broker's ``http(s)://host/asbp``.
        poll_wait: seconds each long-poll may park at the broker (the broker
            caps it at its own long-poll timeout).
        ssl: TLS context for ``https://``; None verifies with the defaults.
        timeout: seconds for connecting and for a POST.
        backoff: delays between failed polls.
        max_poll_bytes: the largest long-poll response read; a larger one is
            an error (raise it, or the broker's ``long_poll_max_frames``).
        logger: where to log.
    """

    def __init__(
        self,
        url: str,
        *,
        poll_wait: float = 20.0,
        ssl: ssl_module.SSLContext | None = None,
        timeout: float = 10.0,
        backoff: Backoff | None = None,
        max_poll_bytes: int = 32 * 1024 * 1024,
        logger: logging.Logger | None = None,
    ) -> None:
        if poll_wait < 0:
            raise ValueError("poll_wait must not be negative")
        self.url = url
        #: Never set: an HTTP Channel is served by any broker of its bus anyway.
        self.restarting = False
        self._poll_wait = poll_wait
        self._ssl = ssl
        self._timeout = timeout
        self._backoff = backoff or Backoff()
        self._max_poll_bytes = max_poll_bytes
        self._log = logger or logging.getLogger("asbp.user_agent")
        #: Never resumed: any broker serves an HTTP Channel, which keeps everything.
        self.kept: frozenset[str] = frozenset()
        self.subjects: frozenset[str] = frozenset()
        self._client: httpx.AsyncClient | None = None
        self._channel_id: ChannelId | None = None
        self._poller: asyncio.Task[None] | None = None
        #: The highest ``ASBP-Seq`` read so far.
        self._after = 0
        #: The Channel's secret from ``asbp.accepted``: every later request presents
        #: it, because ``i`` alone proves nothing (docs/protocol.md). Never logged.
        self._secret: str | None = None

    def elsewhere(self) -> None:
        """Nothing to move to: one URL, whose brokers all serve the Channel."""

    async def open(self, deliver: Deliver, closed: Closed) -> tuple[ChannelId, str | None]:
        # Opened again after the Channel was lost: a new Channel starts its
        # ASBP-Seq from the beginning, and the old client's pool is dropped.
        previous, self._client = self._client, None
        if previous is not None:
            await previous.aclose()
        self._after = 0
        self._channel_id = None
        self._secret = None  # the lost Channel's: a new one gets its own
        self._client = httpx.AsyncClient(
            verify=self._ssl if self._ssl is not None else True,
            timeout=httpx.Timeout(self._timeout),
        )
        try:
            answer = await self._post(Command(c=control.CHANNEL))
            channel_id, broker_id = _greeting(answer, control.ACCEPTED)
            secret = answer.get(SECRET_KEY)
            if not isinstance(secret, str):
                raise AgentError("the broker's asbp.accepted carries no Channel secret")
            self._secret = secret
        except BaseException:
            await self._client.aclose()
            raise
        self._channel_id = channel_id
        self._poller = asyncio.create_task(self._poll(channel_id, deliver, closed))
        return channel_id, broker_id

    async def send(self, command: Command) -> None:
        if self._channel_id is None or self._poller is None or self._poller.done():
            raise ConnectionLost("the Channel is not open")
        answer = await self._post(command.with_keys(i=self._channel_id))
        if answer.name == control.FAULT:
            raise FaultError.from_command(answer)
        if answer.name != control.ACCEPTED:
            raise AgentError(f"expected {control.ACCEPTED} from the broker, got {answer!r}")

    async def resume(self, deliver: Deliver, closed: Closed) -> tuple[ChannelId, str | None] | None:
        """None: an HTTP Channel needs no resume on a bus (any broker serves it, and the
        broker resends what was not acknowledged); a lost one is opened anew."""
        return None

    async def close(self) -> None:
        poller = self._poller
        if poller is not None:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
        if self._client is not None:
            if self._channel_id is not None and poller is not None:
                # The cancelled long-poll may still be parked at the broker,
                # which does not notice a client leaving; a poll with wait=0
                # ends it at once (a newer poll replaces an older one) and
                # acknowledges what we read.
                with contextlib.suppress(httpx.HTTPError, AgentError):
                    await self._poll_once(self._channel_id, self._after, wait=0.0)
            await self._client.aclose()

    def _proof(self) -> dict[str, str]:
        return {SECRET_HEADER: self._secret} if self._secret is not None else {}

    async def _post(self, command: Command) -> Command:
        assert self._client is not None
        try:
            async with self._client.stream(
                "POST",
                self.url,
                content=asbp.encode(command),
                headers={"content-type": MEDIA_TYPE, **self._proof()},
            ) as response:
                body = await _read(response, _MAX_ANSWER_BYTES)
        except httpx.HTTPError as exc:
            raise ConnectionLost(f"POST {self.url} failed: {exc}") from exc
        status = response.status_code
        if status in RETRY_STATUSES:
            # Not now (2115, 2108, 2109): a FaultError that says when to come back.
            retry_after = retry_after_in(response.headers, status)
            raise BrokerBusy.from_response(status, body, retry_after, default=FaultCode.BROKER_BUSY)
        try:
            return asbp.decode(body)
        except ProtocolError as exc:
            raise AgentError(
                f"POST {self.url}: HTTP {response.status_code} without a Command ({exc})"
            ) from exc

    async def _poll(self, channel_id: ChannelId, deliver: Deliver, closed: Closed) -> None:
        attempt = 0
        error: BaseException | None = None
        try:
            while True:
                try:
                    parts = await self._poll_once(channel_id, self._after, wait=self._poll_wait)
                except _Gone as exc:
                    error = exc.__cause__ or exc
                    return
                except (httpx.HTTPError, AgentError) as exc:
                    delay = wait_before(retry_after_of(exc), self._backoff.delay(attempt))
                    attempt += 1
                    self._log.warning(
                        "channel %s: long-poll failed (%s); retrying in %.2f s",
                        self.url,
                        exc,
                        delay,
                    )
                    await asyncio.sleep(delay)  # a backoff delay, not synchronisation
                    continue
                attempt = 0
                for seq, frame in parts:
                    if seq <= self._after:
                        continue  # sent again because a response was lost: seen it
                    self._after = seq
                    try:
                        command = asbp.decode(frame)
                    except ProtocolError as exc:
                        self._log.warning("channel %s: dropped a frame: %s", self.url, exc)
                        continue
                    deliver(command)
        finally:
            closed(error)

    async def _poll_once(
        self, channel_id: ChannelId, after: int, *, wait: float
    ) -> list[tuple[int, bytes]]:
        assert self._client is not None
        params = {"i": channel_id, "after": str(after), "wait": f"{wait:g}"}
        timeout = httpx.Timeout(self._timeout, read=wait + self._timeout)
        async with self._client.stream(
            "GET", self.url, params=params, timeout=timeout, headers=self._proof()
        ) as response:
            status = response.status_code
            if status == 204:
                return []
            if status in _GONE:
                body = await _read(response, _MAX_ANSWER_BYTES)
                try:
                    fault = FaultError.from_command(asbp.decode(body))
                except ProtocolError:
                    fault = FaultError(2104, f"HTTP {status}")
                raise _Gone(str(fault)) from fault
            if status in RETRY_STATUSES:
                body = await _read(response, _MAX_ANSWER_BYTES)
                retry_after = retry_after_in(response.headers, status)
                raise BrokerBusy.from_response(
                    status, body, retry_after, default=FaultCode.ENGINE_UNAVAILABLE
                )
            if status != 200:
                raise AgentError(f"long-poll answered HTTP {status}")
            boundary = boundary_of(response.headers.get("content-type", ""))
            body = await _read(response, self._max_poll_bytes)
        return parse_parts(body, boundary)


async def _read(response: httpx.Response, limit: int) -> bytes:
    """The response body, refusing one longer than ``limit`` bytes."""
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise AgentError(f"a response of {declared} bytes is over the {limit}-byte limit")
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise AgentError(f"a response is over the {limit}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


def _broker_read_count(closed: ConnectionClosed) -> int | None:
    """The ``n`` of a stopping broker's close (1012, ``...; read=<n>``); None for any
    other close."""
    if closed.rcvd is None or closed.rcvd.code != CLOSE_SERVICE_RESTART:
        return None
    found = _READ.search(closed.rcvd.reason)
    return None if found is None else int(found.group(1))
