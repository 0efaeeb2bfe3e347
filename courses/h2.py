"""A Course's WebSocket over HTTP/2 (RFC 8441, extended CONNECT), the dialling side.

Theory of operation
-------------------
One TLS connection offering ALPN ``h2`` carries one HTTP/2 stream, and that stream
carries the WebSocket. The dialler sends the connection preface and its SETTINGS and
waits for the server's: only a server that sets ``SETTINGS_ENABLE_CONNECT_PROTOCOL``
to 1 (RFC 8441 §3) accepts a WebSocket on a stream, so one that does not, or that
picks ``http/1.1`` by ALPN, ends the attempt with :class:`Http2Unavailable` and the
caller (courses.transport) dials again over HTTP/1.1 when ``http2 = "auto"``.

The request is ``HEADERS`` with ``:method CONNECT``, ``:protocol websocket``,
``:scheme https``, ``:path`` and ``:authority``, plus the headers the HTTP/1.1
handshake sends (the Course credential in ``authorization``). ``:status 200`` opens
the stream; any other status is the server's refusal, raised as websockets'
:class:`~websockets.exceptions.InvalidStatus` with the body, exactly as the HTTP/1.1
client raises it, so courses.link treats a refused Course the same on both.

From then on WebSocket frames travel in DATA frames. The frames are websockets'
sans-I/O :class:`~websockets.protocol.Protocol`, started OPEN (RFC 8441 drops the
key/accept exchange, not the framing: the client still masks), so pings are
answered, close codes checked and messages bounded by the same code as the
HTTP/1.1 client; closing sends a close frame, waits for the server's, then
END_STREAM. HTTP/2 flow control is honoured both ways: what arrives is
acknowledged (WINDOW_UPDATE) as it is read, with the read itself stopped while
:data:`_INBOX` messages wait unread, so a peer cannot fill our memory; what is sent
waits for the peer's window. A keepalive ping every ``ping_interval`` fails a
stream whose pong does not come back within ``ping_timeout``, as websockets' own
client does, so a silent peer is noticed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from collections import deque
from collections.abc import AsyncIterator, Coroutine
from typing import Final

import h2.config
import h2.connection
import h2.events
import h2.exceptions
from websockets.datastructures import Headers
from websockets.exceptions import (
    ConnectionClosed,
    ConnectionClosedError,
    ConnectionClosedOK,
    InvalidStatus,
    WebSocketException,
)
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.protocol import CLOSED, OPEN, Protocol, Side

from gateway.errors import LocalError

__all__ = ["MAX_MESSAGE", "H2WebSocket", "Http2Unavailable", "h2_ssl_context", "open_h2_websocket"]

#: Messages read and not yet taken before we stop reading the socket.
_INBOX: Final = 64
#: The largest message a dialler reads, on either HTTP (courses.transport). What a
#: Course receives is its peer's greeting and acknowledgements (8 KiB headers): a
#: megabyte is far above either and bounds what a hostile peer can make us hold.
MAX_MESSAGE: Final = 2**20
#: A refusal's body read at most (the peer's fault Command).
_MAX_REFUSAL_BODY: Final = 64 * 1024
_READ: Final = 65536


class Http2Unavailable(LocalError, WebSocketException):
    """The server does not take a WebSocket over HTTP/2: it chose another protocol
    by ALPN, or did not enable extended CONNECT. ``auto`` falls back to HTTP/1.1.

    In the one error tree (a :class:`~gateway.errors.LocalError`: logged, never sent),
    and a ``WebSocketException`` too, so the link treats it as any failed handshake
    under ``always``."""


class H2WebSocket:
    """One WebSocket on one HTTP/2 stream of its own connection.

    The part of websockets' ``ClientConnection`` a Course uses: :meth:`send`,
    :meth:`recv`, ``async for``, :meth:`ping`, :meth:`close` and :attr:`close_code`. Made by
    :func:`open_h2_websocket`.
    """

    #: Which HTTP the WebSocket runs on (courses.transport reports it).
    http2: Final = True

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        ping_interval: float | None,
        ping_timeout: float,
        close_timeout: float,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._h2 = h2.connection.H2Connection(
            config=h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self._ws = Protocol(Side.CLIENT, state=OPEN, max_size=MAX_MESSAGE)
        self._stream = 0
        self._settings = asyncio.Event()
        self._status = 0
        self._response_headers: list[tuple[bytes, bytes]] = []
        self._responded = asyncio.Event()
        self._refusal = bytearray()
        #: Messages read and not yet taken; the reader stops at _INBOX.
        self._messages: deque[bytes | str] = deque()
        self._arrived = asyncio.Event()
        self._room = asyncio.Event()
        self._fragments: list[bytes] = []
        self._fragment_text = False
        #: WebSocket bytes waiting for the peer's flow-control window.
        self._pending = bytearray()
        self._eof = False
        self._local_ended = False
        self._window = asyncio.Event()
        self._remote_ended = False
        #: The server's close frame came: nothing more goes on the stream.
        self._close_rcvd = asyncio.Event()
        self._closed = asyncio.Event()
        self._closing_watched = False
        self._pongs: dict[bytes, asyncio.Future[None]] = {}
        self._ping_interval = ping_interval
        self._ping_timeout = ping_timeout
        self._close_timeout = close_timeout
        self._tasks: list[asyncio.Task[None]] = []

    # -- what a Course uses ----------------------------------------------------------

    @property
    def close_code(self) -> int | None:
        """The WebSocket close code, once closed (None before, or if none came)."""
        return self._ws.close_code if self._ws.state is CLOSED else None

    async def send(self, message: bytes | str, /) -> None:
        """Send one message (binary, or text for a ``str``); returns once it is
        within the peer's window and the socket's buffer has drained.

        Raises:
            ConnectionClosed: the WebSocket is closed or closing.
        """
        if self._ws.state is not OPEN or self._closed.is_set():
            raise self._closed_exc()
        if isinstance(message, str):
            self._ws.send_text(message.encode("utf-8"))
        else:
            self._ws.send_binary(message)
        self._pump_out()
        while self._pending and not self._closed.is_set():
            self._window.clear()
            await self._window.wait()  # set by a WINDOW_UPDATE, or the end
            self._pump_out()
        if self._pending:
            raise self._closed_exc()
        try:
            await self._writer.drain()
        except OSError as exc:
            raise self._closed_exc() from exc

    async def recv(self) -> bytes | str:
        """The next message.

        Raises:
            ConnectionClosed: the WebSocket closed (normally or not).
        """
        while not self._messages:
            if self._closed.is_set():
                raise self._closed_exc()
            self._arrived.clear()
            # One event, set by a message or by the end: no task per wait, since
            # this is every acknowledgement's path.
            await self._arrived.wait()
        message = self._messages.popleft()
        self._room.set()
        return message

    async def __aiter__(self) -> AsyncIterator[bytes | str]:
        """Every message until the WebSocket closes; a normal close ends the loop,
        any other raises, as websockets' connections do."""
        while True:
            try:
                yield await self.recv()
            except ConnectionClosedOK:
                return

    async def ping(self) -> asyncio.Future[None]:
        """Send a ping; the future returned is done when its pong comes back (and
        fails with :class:`ConnectionClosed` if the WebSocket closes first).

        Raises:
            ConnectionClosed: the WebSocket is closed or closing.
        """
        if self._ws.state is not OPEN or self._closed.is_set():
            raise self._closed_exc()
        payload = os.urandom(4)
        while payload in self._pongs:
            payload = os.urandom(4)
        pong: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pongs[payload] = pong
        self._ws.send_ping(payload)
        self._pump_out()
        return pong

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Close the WebSocket (a close frame, the peer's, END_STREAM) and the connection."""
        if self._ws.state is OPEN and not self._closed.is_set():
            self._ws.send_close(code, reason)
            self._eof = True  # a close frame, then END_STREAM (RFC 8441 §5)
            self._pump_out()
            with contextlib.suppress(TimeoutError):
                # The closing handshake is done when the server's close frame comes
                # (or its END_STREAM, or the connection's end).
                async with asyncio.timeout(self._close_timeout):
                    await _first(self._close_rcvd.wait(), self._closed)
        await self._shutdown()

    async def __aenter__(self) -> H2WebSocket:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- opening ---------------------------------------------------------------------

    async def _open(self, headers: list[tuple[bytes, bytes]], timeout: float) -> None:
        h2c = self._h2
        h2c.initiate_connection()
        self._write()
        self._tasks.append(asyncio.create_task(self._read_loop(), name="asbp-course-h2-read"))
        async with asyncio.timeout(timeout):
            await _first(self._settings.wait(), self._closed)
            if not self._settings.is_set():
                raise Http2Unavailable("the connection closed before the server's SETTINGS")
            if h2c.remote_settings.enable_connect_protocol != 1:
                raise Http2Unavailable("the server does not enable extended CONNECT (RFC 8441)")
            self._stream = h2c.get_next_available_stream_id()
            h2c.send_headers(self._stream, headers)
            self._write()
            await _first(self._responded.wait(), self._closed)
            if not self._responded.is_set():
                raise ConnectionResetError("the connection closed before the answer")
            if self._status != 200:
                # The refusal's body (the peer's fault) comes before END_STREAM.
                await self._closed.wait()
                raise InvalidStatus(
                    Response(
                        self._status,
                        "",
                        Headers(
                            (k.decode("latin-1"), v.decode("latin-1"))
                            for k, v in self._response_headers
                            if not k.startswith(b":")
                        ),
                        bytes(self._refusal),
                    )
                )
        if self._ping_interval is not None:
            self._tasks.append(asyncio.create_task(self._keepalive(), name="asbp-course-h2-ping"))

    # -- reading ---------------------------------------------------------------------

    async def _read_loop(self) -> None:
        try:
            while not self._remote_ended:
                data = await self._reader.read(_READ)
                if not data:
                    break
                for event in self._h2.receive_data(data):
                    await self._event(event)
                # SETTINGS and PING acknowledgements, WINDOW_UPDATEs, pongs, and what
                # was waiting for a window that just opened.
                self._pump_out()
        except (OSError, h2.exceptions.ProtocolError):
            pass  # the connection is gone or broken: the WebSocket ends below
        finally:
            self._end()

    async def _event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RemoteSettingsChanged):
            self._settings.set()
        elif isinstance(event, h2.events.WindowUpdated):
            self._window.set()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._remote_ended = True
        elif getattr(event, "stream_id", None) != self._stream or not self._stream:
            return
        elif isinstance(event, h2.events.ResponseReceived):
            headers = [(bytes(k), bytes(v)) for k, v in event.headers or ()]
            self._status = next((int(v) for k, v in headers if k == b":status"), 0)
            self._response_headers = headers
            self._responded.set()
        elif isinstance(event, h2.events.DataReceived):
            self._h2.acknowledge_received_data(event.flow_controlled_length or 0, self._stream)
            data = event.data or b""
            if self._status != 200:
                room = _MAX_REFUSAL_BODY - len(self._refusal)
                self._refusal += data[: max(room, 0)]
                return
            self._ws.receive_data(data)
            await self._frames()
            if self._ws.close_expected() and not self._closing_watched:
                # The WebSocket layer failed the connection (a message too big, a
                # protocol error) or is done: give the server close_timeout to end
                # the stream, as websockets' client gives it to close TCP.
                self._closing_watched = True
                self._tasks.append(asyncio.create_task(self._end_after_close_timeout()))
        elif isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
            self._remote_ended = True

    async def _frames(self) -> None:
        for frame in self._ws.events_received():
            assert isinstance(frame, Frame)
            if frame.opcode is Opcode.CLOSE:
                self._close_rcvd.set()
            elif frame.opcode is Opcode.PONG:
                waiter = self._pongs.pop(bytes(frame.data), None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
            elif frame.opcode in (Opcode.TEXT, Opcode.BINARY, Opcode.CONT):
                if frame.opcode is not Opcode.CONT:
                    self._fragment_text = frame.opcode is Opcode.TEXT
                self._fragments.append(bytes(frame.data))
                if frame.fin:
                    data = b"".join(self._fragments)
                    self._fragments.clear()
                    while len(self._messages) >= _INBOX:
                        # Nobody is taking messages: stop reading the socket, so the
                        # peer's window, then TCP, hold it back instead of our memory.
                        self._room.clear()
                        await self._room.wait()
                    self._messages.append(data.decode("utf-8") if self._fragment_text else data)
                    self._arrived.set()

    # -- writing ---------------------------------------------------------------------

    def _pump_out(self) -> None:
        """Move what the WebSocket layer has to send into DATA frames, as far as the
        peer's window allows; never waits (the reader calls it too)."""
        for chunk in self._ws.data_to_send():
            if chunk:
                self._pending += chunk
            else:
                self._eof = True  # the WebSocket is done sending: so is the stream
        if not self._stream or self._local_ended or self._close_rcvd.is_set():
            # After the server's close frame we send nothing, not even the close frame
            # RFC 6455 answers with: RFC 8441 §5 makes the server's END_STREAM what a
            # TCP close is, and Hypercorn (0.18) ends the stream right after its close
            # frame and fails the whole connection (a KeyError in its H2Protocol) on
            # DATA for a stream it has dropped. The connection's GOAWAY ends ours.
            self._pending.clear()
            return
        h2c = self._h2
        try:
            while self._pending:
                window = min(
                    h2c.local_flow_control_window(self._stream), h2c.max_outbound_frame_size
                )
                if window <= 0:
                    break
                chunk = bytes(self._pending[:window])
                del self._pending[:window]
                # Our close frame ends our half of the stream in the same DATA frame:
                # an empty DATA frame after it could reach a server that has already
                # let the stream go (see above).
                last = self._eof and not self._pending
                h2c.send_data(self._stream, chunk, end_stream=last)
                self._local_ended = last
            if self._eof and not self._pending and not self._local_ended:
                self._local_ended = True
                h2c.end_stream(self._stream)
        except h2.exceptions.ProtocolError:
            # The stream is closed (reset, or ended by the peer and by us): nothing
            # more can go on it.
            self._local_ended = True
            self._pending.clear()
        self._write()

    def _write(self) -> None:
        data = self._h2.data_to_send()
        if data and not self._writer.is_closing():
            self._writer.write(data)

    # -- ending ----------------------------------------------------------------------

    def _end(self) -> None:
        """The stream or connection ended: the WebSocket is closed, everyone waiting told."""
        self._ws.receive_eof()
        self._ws.data_to_send()
        self._closed.set()
        # Wake whoever waits for a message, a window or room: they see the end.
        self._arrived.set()
        self._window.set()
        self._room.set()
        for waiter in self._pongs.values():
            if not waiter.done():
                waiter.set_exception(self._closed_exc())
                waiter.exception()  # retrieved: nobody need be waiting for it
        self._pongs.clear()

    def _closed_exc(self) -> ConnectionClosed:
        if self._ws.state is not CLOSED:
            return ConnectionClosedError(None, None)
        return self._ws.close_exc

    async def _end_after_close_timeout(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closed.wait(), self._close_timeout)
        if not self._closed.is_set():
            self._writer.transport.abort()  # the reader sees the end, and ends it

    async def _keepalive(self) -> None:
        interval = self._ping_interval
        assert interval is not None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closed.wait(), interval)
            try:
                pong = await self.ping()
                await asyncio.wait_for(pong, self._ping_timeout)
            except TimeoutError:
                # No pong: the peer is gone without telling. Drop the connection; the
                # reader ends the WebSocket and the Course dials again.
                self._writer.transport.abort()
                return
            except ConnectionClosed:
                return

    async def _shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self._h2.close_connection()
            self._write()
        self._writer.close()
        with contextlib.suppress(OSError, ssl.SSLError, TimeoutError):
            await asyncio.wait_for(self._writer.wait_closed(), self._close_timeout)
        self._end()


async def open_h2_websocket(
    host: str,
    port: int,
    *,
    path: str,
    authority: str,
    headers: list[tuple[str, str]],
    ssl_context: ssl.SSLContext | None,
    open_timeout: float = 10.0,
    ping_interval: float | None = 20.0,
    ping_timeout: float = 20.0,
    close_timeout: float = 10.0,
) -> H2WebSocket:
    """Dial ``https://<authority><path>`` and open a WebSocket on an HTTP/2 stream.

    ``ssl_context`` must offer ``h2`` by ALPN (:func:`h2_ssl_context`); None: plain
    TCP with prior knowledge (h2c, RFC 9113 section 3.3), for the development flag
    only: there is no ALPN to ask, so the server must speak HTTP/2 or the CONNECT
    fails.

    Raises:
        Http2Unavailable: the server chose another protocol or does not enable
            extended CONNECT (nothing was sent but the preface).
        InvalidStatus: the server answered the CONNECT with another status than 200.
        OSError, TimeoutError: the connection failed or was too slow.
    """
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(
            host,
            port,
            ssl=ssl_context,
            server_hostname=host if ssl_context is not None else None,
        ),
        open_timeout,
    )
    ssl_object = writer.get_extra_info("ssl_object")
    selected = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
    if ssl_context is not None and selected != "h2":
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()
        raise Http2Unavailable(f"the server chose {selected or 'no protocol'} by ALPN, not h2")
    socket = H2WebSocket(
        reader,
        writer,
        ping_interval=ping_interval,
        ping_timeout=ping_timeout,
        close_timeout=close_timeout,
    )
    request = [
        (b":method", b"CONNECT"),
        (b":protocol", b"websocket"),
        (b":scheme", b"https" if ssl_context is not None else b"http"),
        (b":path", path.encode("ascii")),
        (b":authority", authority.encode("ascii")),
        (b"sec-websocket-version", b"13"),
        *((name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers),
    ]
    try:
        await socket._open(request, open_timeout)
    except BaseException:
        await socket._shutdown()
        raise
    return socket


def h2_ssl_context(cafile: str | None) -> ssl.SSLContext:
    """A client context trusting ``cafile`` (or the system's roots) offering ALPN
    ``h2`` then ``http/1.1``; a separate context from the HTTP/1.1 client's, which
    must not offer ``h2`` (a server would pick it and the handshake would fail)."""
    context = ssl.create_default_context(cafile=cafile)
    context.set_alpn_protocols(["h2", "http/1.1"])
    return context


async def _first(waiting: Coroutine[object, object, object], closed: asyncio.Event) -> None:
    """Until ``waiting`` returns or ``closed`` is set, whichever is first."""
    waiter = asyncio.ensure_future(waiting)
    ender = asyncio.ensure_future(closed.wait())
    try:
        await asyncio.wait({waiter, ender}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        ender.cancel()
