"""Hypercorn's WebSocket stream, failing a connection as Uvicorn does, and its fast path.

Why this exists
---------------
Hypercorn builds each WebSocket stream itself (``WSStream``, looked up as a
module attribute by ``hypercorn.protocol.h11`` for HTTP/1.1 and by
``hypercorn.protocol.h2`` for RFC 8441 over HTTP/2) and offers no setting to
choose another. Three things about it needed changing (issues 16 and 17):

* **Failing a connection.** On a protocol error (1002) or invalid UTF-8 (1007),
  wsproto yields a ``CloseConnection`` event with the code, and ``WSStream``
  treats it like a close the client started: it sends no close frame and just
  ends the stream, so the client sees 1006 (RFC 6455 §7.1.7: an endpoint that
  fails a connection SHOULD send a close frame first). Its size check closes
  with 1009 and no reason, and then keeps the connection open, reading whatever
  the client still sends (a 17 MiB message took about 20 s). Uvicorn's
  websockets sends the code and a reason and then closes the TCP connection
  (a server "closes the TCP connection immediately" on failure). Here a failed
  connection gets the close frame with wsproto's code and the reason in
  websockets' words (:func:`websockets_reason`), then the stream ends; an
  oversized message is refused from its frame header, before any of it is
  buffered, with the reason websockets gives (``frame with N bytes exceeds limit
  of M bytes``), so a client sees the same close frame from either server. After
  that refusal the framing is intact, so the connection waits for the client's
  close frame (up to :data:`CLOSE_TIMEOUT`), dropping the rest of the message:
  closed with bytes unread, the kernel resets it and a browser loses the close
  frame.
* **Compression.** Hypercorn accepts permessage-deflate whenever a client offers
  it; the broker's ``websocket_compression`` (off by default) reaches the stream
  as an attribute of Hypercorn's ``Config`` (:func:`configure_compression`).
* **Speed.** Per message, Hypercorn's path built wsproto event objects, queued
  a ``websocket.receive`` for the application's task, and wrote each message it
  sent with its own ``send(2)`` after awaiting the writer's drain under a lock.
  On ``bench/roundtrip.py`` that was half of Uvicorn's throughput. Here, once a
  connection without extensions is open, the plain messages are parsed by
  :class:`~gateway.transports.plain_frames.PlainFrameReader` (the same reader
  the Uvicorn path uses; every other frame goes to wsproto, whole and in
  order, which still decides what it means) and handed to the application's
  RECEIVE_FRAMES handler, and, on HTTP/1.1, SEND_FRAME writes a message
  without an ASGI ``send``, gathering what one loop turn sends into one write
  (as gateway.transports.coalescing does for Uvicorn). On HTTP/2 a message
  must go through h2's flow control, so SEND_FRAME declines there and ASGI
  ``send`` is used.
* **Handshakes in flight.** The broker's bound on them
  (gateway/transports/handshakes.py): an upgrade request past it is answered
  here with 503, ``Retry-After`` and fault 2115, before the application's task
  is spawned (as Hypercorn answers an invalid handshake with 400).

Upstream: the close frame on failure is a small fix to ``WSStream._handle_events``
(answer a ``CloseConnection`` the peer did not send with one of our own, then
end the stream) worth offering to Hypercorn, as is one to its ``H2Protocol``,
which fails the whole connection with a ``KeyError`` on a DATA frame for a stream
it has closed (so here a failed HTTP/2 stream stays until the client ends it);
the rest is specific to our extensions. Until Hypercorn has them, :func:`install`
puts :class:`AsbpWSStream` where Hypercorn looks ``WSStream`` up. It is called by
the broker's server start-up (gateway/ops/server.py) and the test servers, never
on import, and it refuses a Hypercorn it was not written against: the subclass relies on
``WSStream``'s internals (``connection``, ``state``, ``app_put``, ``send``),
which a new version may change.
"""

from __future__ import annotations

import asyncio
import contextvars
import importlib.metadata
import re
from collections.abc import Awaitable, Callable
from typing import Any, Final, cast

import hypercorn.asyncio.run
import hypercorn.protocol.h2
import hypercorn.protocol.h11
from hypercorn.config import Config as HypercornConfig
from hypercorn.protocol.events import (
    Body,
    Data,
    EndBody,
    EndData,
    Event,
    Request,
    Response,
    StreamClosed,
)
from hypercorn.protocol.ws_stream import (
    ASGIWebsocketState,
    FrameTooLargeError,
    WSStream,
)
from hypercorn.typing import WebsocketAcceptEvent
from wsproto.connection import ConnectionState
from wsproto.events import CloseConnection, Message, Ping
from wsproto.frame_protocol import CloseReason

from gateway.errors import LocalError
from gateway.transports.handshakes import RETRY_AFTER, HandshakeBound, peer_gone
from gateway.transports.handshakes import STATE_KEY as HANDSHAKES
from gateway.transports.hypercorn_tcp import AsbpTCPServer
from gateway.transports.plain_frames import OTHER, TEXT, PlainFrameReader, too_big_reason
from gateway.transports.websocket import RECEIVE_FRAMES, SEND_FRAME

__all__ = [
    "CLOSE_TIMEOUT",
    "COMPRESSION_ATTRIBUTE",
    "SUPPORTED_HYPERCORN",
    "AsbpWSStream",
    "UnsupportedHypercorn",
    "configure_compression",
    "install",
    "websockets_reason",
]

#: The Hypercorn releases whose ``WSStream`` this module was written and tested against
#: (version prefixes).
SUPPORTED_HYPERCORN: Final = ("0.18.",)


#: Seconds a connection whose message was refused (1009) waits for the client's
#: close frame before the server closes it (websockets' own default is 10).
CLOSE_TIMEOUT: Final = 5.0

#: The close frame's opcode (RFC 6455 §5.5.1).
_CLOSE: Final = 0x8


class UnsupportedHypercorn(LocalError, RuntimeError):
    """The installed Hypercorn is not one :class:`AsbpWSStream` was written against."""


#: The attribute of a Hypercorn ``Config`` that says whether a WebSocket client's offer
#: of permessage-deflate is accepted: Hypercorn has no such setting, and accepts it
#: whenever offered, which is what a ``Config`` without the attribute still gets.
COMPRESSION_ATTRIBUTE: Final = "asbp_websocket_compression"


def configure_compression(config: HypercornConfig, enabled: bool) -> None:
    """Whether streams served with ``config`` accept permessage-deflate (the broker's
    ``websocket_compression``, as Uvicorn's ``ws_per_message_deflate``)."""
    setattr(config, COMPRESSION_ATTRIBUTE, enabled)


def install(version: str | None = None) -> None:
    """Make Hypercorn build :class:`AsbpWSStream` for every WebSocket (HTTP/1.1 and HTTP/2).

    Args:
        version: the Hypercorn version to check (default: the installed one).

    Raises:
        UnsupportedHypercorn: the version is not in :data:`SUPPORTED_HYPERCORN`; the
            broker would otherwise patch internals it does not know.
    """
    version = importlib.metadata.version("hypercorn") if version is None else version
    if not version.startswith(SUPPORTED_HYPERCORN):
        raise UnsupportedHypercorn(
            f"Hypercorn {version} is not one gateway.transports.hypercorn_ws supports "
            f"({', '.join(v + 'x' for v in SUPPORTED_HYPERCORN)}): check its WSStream "
            "against AsbpWSStream and add the version"
        )
    # Both protocol modules imported the class by name; their module attribute is
    # what they call for each new stream.
    for module in (hypercorn.protocol.h11, hypercorn.protocol.h2):
        setattr(module, "WSStream", AsbpWSStream)  # noqa: B010  # not a name it exports
    # Likewise the worker's connection (gateway/transports/hypercorn_tcp.py): so that a
    # closed connection leaves no reference cycle.
    setattr(hypercorn.asyncio.run, "TCPServer", AsbpTCPServer)  # noqa: B010  # as above


#: wsproto's reasons for failing a connection, in websockets' words (what Uvicorn's
#: path says), so that a client's log reads the same whichever server answered.
_WEBSOCKETS_WORDS: Final = {
    "server received unexpected unmasked frame": "incorrect masking",
    "Control frame with payload len > 125": "control frame too long",
    "Reserved bit set unexpectedly": "reserved bits must be 0",
    "Invalid attempt to fragment control frame": "fragmented control frame",
    "unexpected CONTINUATION": "unexpected continuation frame",
    "CLOSE with 1 byte payload": "close frame too short",
    "CLOSE with invalid code": "invalid status code",
    "CLOSE with unknown reserved code": "invalid status code",
    "remote CLOSE with local-only reason": "invalid status code",
}
_WEBSOCKETS_PREFIXES: Final = {
    "Invalid opcode": "invalid opcode",
    "expected CONTINUATION": "expected a continuation frame",
}
#: A ``UnicodeDecodeError`` as wsproto words it: "'utf-8' codec can't decode byte
#: 0xed in position 11: invalid continuation byte".
_UTF8_ERROR: Final = re.compile(r"'utf-8' codec can't decode .* in position (\d+): (.*)$")


def websockets_reason(reason: str) -> str:
    """wsproto's reason for failing a connection as websockets words it (unknown: as is).

    Invalid UTF-8 in a close reason says where, as websockets does; in a text message
    it does not, because wsproto counts from the start of the frame it was decoding
    and Uvicorn's path from the start of the message.
    """
    words = _WEBSOCKETS_WORDS.get(reason)
    if words is not None:
        return words
    for prefix, words in _WEBSOCKETS_PREFIXES.items():
        if reason.startswith(prefix):
            return words
    utf8 = _UTF8_ERROR.search(reason)
    if utf8 is not None:
        position, what = utf8.groups()
        if reason.startswith("Error decoding CLOSE reason"):
            return f"{what} at position {position}"
        return what
    return reason


class AsbpWSStream(WSStream):
    """Hypercorn's ``WSStream``, failing connections with a close frame, and faster."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        #: Hypercorn's own ``send`` for this stream (what ``WSStream.__init__`` assigns
        #: to ``self.send``: see :attr:`send`).
        self._stream_send: Callable[[Event], Awaitable[None]]
        super().__init__(*args, **kwargs)
        #: Our reader, once open without extensions; None: wsproto reads everything.
        self._reader: PlainFrameReader | None = None
        #: Bytes of the fragmented message handed on so far (websockets' ``current_size``).
        self._current_size: int | None = None
        self._on_frame: Callable[[bytes, bool], None] | None = None
        self._on_frame_context: contextvars.Context | None = None
        #: The connection's transport on HTTP/1.1 (SEND_FRAME writes to it), else None.
        self._transport: asyncio.WriteTransport | None = None
        self._send_lock: asyncio.Lock | None = None
        self._gathered: list[bytes] = []
        self._gathered_size = 0
        #: HTTP/2: the stream is one of many on the connection (RFC 8441).
        self._h2 = isinstance(
            getattr(self._stream_send, "__self__", None), hypercorn.protocol.h2.H2Protocol
        )
        #: HTTP/2, failed: what the client still sends on the stream is dropped.
        self._discarding = False
        #: The bound this stream's handshake counts against, until it is done.
        self._handshake: HandshakeBound | None = None

    # -- reading

    async def handle(self, event: Event) -> None:
        if self._discarding and not self.closed:
            if isinstance(event, EndBody):
                # The client ended its side too: the stream can go.
                await self.send(StreamClosed(stream_id=self.stream_id))
                return
            if isinstance(event, (Body, Data)):
                if self._reader is not None and self._close_frame_read(event.data):
                    await self.send(StreamClosed(stream_id=self.stream_id))
                return
        reader = self._reader
        if reader is not None and isinstance(event, (Body, Data)) and not self.closed:
            reader.feed(event.data)
            await self._read_frames(reader)
        elif isinstance(event, Request) and not self.closed:
            bound: HandshakeBound | None = event.state.get(HANDSHAKES)
            if bound is not None:
                server = None if self._h2 else _tcp_server_of(self._stream_send)
                if server is not None and peer_gone(server.writer.transport):
                    # Waited for longer than its client did: served, it would be
                    # work for nobody (gateway/transports/handshakes.py).
                    bound.abandoned += 1
                    self.closed = True
                    await self.send(StreamClosed(stream_id=self.stream_id))
                    return
                if not bound.enter():
                    await self._refuse_busy(bound)
                    return
                self._handshake = bound
            await super().handle(event)
            if self.app_put is None:  # refused by Hypercorn (404, 400): no app runs
                self._handshake_done()
        else:
            await super().handle(event)
            if self.closed:
                self._handshake_done()
                self._release_extensions()

    async def _refuse_busy(self, bound: HandshakeBound) -> None:
        """Answer 503 with ``Retry-After`` and fault 2115, and end the stream: the
        broker is serving ``bound.limit`` handshakes already. As Hypercorn answers an
        invalid handshake: no scope is served, no application task spawned."""
        body = bound.body
        headers = [
            (b"retry-after", str(RETRY_AFTER).encode()),
            (b"content-type", b"application/asbp"),
            (b"content-length", str(len(body)).encode()),
        ]
        if not self._h2:  # HTTP/2 forbids connection-specific headers (RFC 9113 §8.2.2)
            headers.append((b"connection", b"close"))
        self.closed = True
        await self.send(Response(stream_id=self.stream_id, status_code=503, headers=headers))
        await self.send(Body(stream_id=self.stream_id, data=body))
        await self.send(EndBody(stream_id=self.stream_id))

    def _handshake_done(self) -> None:
        """This stream's handshake no longer counts against the bound."""
        bound = self._handshake
        if bound is not None:
            self._handshake = None
            bound.leave()

    def _release_extensions(self) -> None:
        """Take this stream's bound methods out of the scope, once the stream is closed.

        The scope's extensions hold them and this stream holds the scope: a reference
        cycle that only a garbage collection would free (gateway/transports/
        connection_cycles.py). The application may still look them up or call them:
        gone, it sends through ASGI, which Hypercorn ignores after the close, and a
        kept ``send_frame`` declines, as it would now anyway.
        """
        scope = getattr(self, "scope", None)
        extensions = None if scope is None else scope.get("extensions")
        if extensions:
            extensions.pop(SEND_FRAME, None)
            extensions.pop(RECEIVE_FRAMES, None)
        self._on_frame = None
        self._on_frame_context = None

    async def _read_frames(self, reader: PlainFrameReader) -> None:
        """Hand the plain messages read to the application and the rest to wsproto."""
        max_size = self.config.websocket_max_message_size
        while (event := reader.next_event()) is not None:
            kind, payload = event
            if kind == OTHER:
                header = reader.handed_on_header
                if header is not None and await self._refuse_too_big(header, max_size):
                    return
                self.connection.receive_data(payload)
                await self._handle_events()
                if self.closed or self.connection.state is not ConnectionState.OPEN:
                    # Failed or closing: wsproto reads the rest, as Hypercorn would.
                    self._reader = None
                    rest = reader.rest()
                    if rest and not self.closed and not self._discarding:
                        await super().handle(Data(stream_id=self.stream_id, data=rest))
                    return
                continue
            text = kind == TEXT
            handler = self._on_frame
            app_put = self.app_put
            assert app_put is not None  # set before the handshake was accepted
            # Only while nothing waits in Hypercorn's queue, so that the order holds.
            if handler is not None and _queue_of(app_put).empty():
                assert self._on_frame_context is not None
                try:
                    self._on_frame_context.run(handler, payload, text)
                except Exception:
                    # What Hypercorn does when the application fails: log it, and
                    # close with 1011.
                    await self.config.log.exception("Error in ASGI Framework")
                    self._on_frame = None
                    await self._fail(CloseReason.INTERNAL_ERROR, "")
                    return
            elif text:
                await app_put(
                    {"type": "websocket.receive", "bytes": None, "text": payload.decode()}
                )
            else:
                await app_put({"type": "websocket.receive", "bytes": payload, "text": None})

    async def _refuse_too_big(self, header: tuple[int, bool, int], max_size: int) -> bool:
        """Fail with 1009 if a handed-on frame is longer than what the message may still
        hold, as websockets does from the header; True if it did."""
        opcode, fin, length = header
        current = self._current_size
        if length > max_size - (current or 0):
            reason = too_big_reason(length, max_size, current)
            await self._fail(CloseReason.MESSAGE_TOO_BIG, reason, linger=True)
            return True
        if opcode < 3:  # a data frame starts, continues or ends the message (§5.4)
            self._current_size = None if fin else (current or 0) + length
        return False

    async def _handle_events(self) -> None:
        for event in self.connection.events():
            if isinstance(event, Message):
                try:
                    self.buffer.extend(event)
                except FrameTooLargeError:
                    # Reached only with an extension (the reader refuses the rest from
                    # the header): the size of the frame is not known here.
                    limit = self.config.websocket_max_message_size
                    await self._fail(
                        CloseReason.MESSAGE_TOO_BIG, f"frame exceeds limit of {limit} bytes"
                    )
                    break
                if event.message_finished:
                    assert self.app_put is not None
                    await self.app_put(self.buffer.to_message())
                    self.buffer.clear()
            elif isinstance(event, Ping):
                await self._send_wsproto_event(event.response())
            elif isinstance(event, CloseConnection):
                if self.connection.state is ConnectionState.OPEN:
                    # Not a close frame from the peer (that would have moved the
                    # state on) but wsproto failing the connection: a protocol error
                    # or invalid UTF-8, with its code and reason.
                    await self._fail(event.code, websockets_reason(event.reason or ""))
                    break
                if self.connection.state is ConnectionState.REMOTE_CLOSING:
                    await self._send_wsproto_event(event.response())
                await self.send(StreamClosed(stream_id=self.stream_id))

    async def _fail(self, code: int, reason: str, *, linger: bool = False) -> None:
        """Fail the connection: a close frame with ``code`` and ``reason``, then the end.

        With ``linger`` (a message refused from its frame header: the frames around
        it are intact), over HTTP/1.1 the connection waits, up to
        :data:`CLOSE_TIMEOUT`, for the client's close frame, dropping the rest of
        the refused message. Closing the socket while it still holds unread bytes
        makes the kernel answer with a reset, and a browser that gets it discards the
        close frame it had not yet read: it reported 1006 and no reason about one
        time in two.
        """
        if not (linger and not self._h2):
            self._reader = None
        await self._send_wsproto_event(CloseConnection(code=code, reason=reason))
        # As websockets does: a server ends the connection after failing it rather
        # than reading on until the client answers the close (RFC 6455 §7.1.7).
        await self.send(EndData(stream_id=self.stream_id))
        if not self._h2 and not linger:
            await self.send(StreamClosed(stream_id=self.stream_id))
            return
        # On HTTP/2 the stream ends with END_STREAM (EndData), but Hypercorn must keep
        # it until the client ends its side: its H2Protocol looks up the stream of every
        # DATA frame and fails the whole connection, every stream on it, on one it no
        # longer has. So the stream stays, dropping what arrives, and the application
        # learns now.
        self._discarding = True
        app_put, self.app_put = self.app_put, None  # one disconnect, this one
        if app_put is not None:
            await app_put({"type": "websocket.disconnect", "code": code})
        if not self._h2:
            if self._close_frame_read(b""):  # it may have come with the refused bytes
                await self.send(StreamClosed(stream_id=self.stream_id))
            else:
                # A timer, not a sleeping task: Hypercorn's connection waits for its
                # tasks before it is done, and this one would outlive the connection.
                loop = asyncio.get_running_loop()
                loop.call_later(CLOSE_TIMEOUT, self._close_timed_out)

    def _close_frame_read(self, data: bytes) -> bool:
        """Drop ``data`` (lingering after a failure), unless it completes the client's
        close frame's header: True then."""
        reader = self._reader
        assert reader is not None
        reader.feed(data)
        while (event := reader.next_event()) is not None:
            header = reader.handed_on_header
            if event[0] == OTHER and header is not None and header[0] == _CLOSE:
                return True
        return False

    def _close_timed_out(self) -> None:
        if not self.closed:
            self.task_group.spawn(self.send, StreamClosed(stream_id=self.stream_id))

    async def app_send(self, message: Any) -> None:
        if self._handshake is not None:
            # The application's first message (accept, close or an HTTP response)
            # ends the handshake, as far as the bound is concerned.
            self._handshake_done()
        if message is None and self._discarding and not self.closed:
            return  # the stream ends when the client's side does (see _fail)
        await super().app_send(message)
        if self.closed:
            self._release_extensions()

    def on_frame(self, handler: Callable[[bytes, bool], None] | None) -> bool:
        """The RECEIVE_FRAMES extension: hand plain messages to ``handler(payload, text)``
        as they are read, in the application's context (captured here); None stops it.

        A message read while events wait in Hypercorn's queue is queued behind them,
        so the order holds. Returns True.
        """
        self._on_frame = handler
        self._on_frame_context = None if handler is None else contextvars.copy_context()
        return True

    # -- writing

    async def _accept(self, message: WebsocketAcceptEvent) -> None:
        if not getattr(self.config, COMPRESSION_ATTRIBUTE, True):
            # Declined: with no offer to answer, the response names no extension.
            self.handshake.extensions = None
        await super()._accept(message)
        if self.handshake.extensions:
            # An extension (permessage-deflate, offered by every browser) may be
            # negotiated, and changes what frames mean: wsproto does everything.
            return
        self._reader = PlainFrameReader(max_size=self.config.websocket_max_message_size)
        # Hypercorn types the extensions as dicts of settings; ASGI leaves them open.
        extensions = cast(dict[str, Any], self.scope.setdefault("extensions", {}))
        extensions[RECEIVE_FRAMES] = self.on_frame
        server = _tcp_server_of(self._stream_send)
        if server is not None:
            self._transport = server.writer.transport
            self._send_lock = server.send_lock
            extensions[SEND_FRAME] = self.send_frame

    def send_frame(self, payload: bytes, text: bool) -> bool:
        """The SEND_FRAME extension: gather ``payload`` as one message, written with
        whatever else this loop turn sends; False (nothing done) where Hypercorn's
        ``send`` would wait or do more than write one plain frame."""
        transport = self._transport
        lock = self._send_lock
        if (
            transport is None
            or lock is None
            or self.closed
            or self.state is not ASGIWebsocketState.CONNECTED
            or self.connection.state is not ConnectionState.OPEN
            # Another write waits for the socket: ours would pass it.
            or lock.locked()
            or transport.is_closing()
            # What is gathered counts: the socket's buffer, not this list, is where a
            # reader that stops reading pushes back, up to the high-water mark.
            or transport.get_write_buffer_size() + self._gathered_size
            > transport.get_write_buffer_limits()[1]
        ):
            return False
        length = len(payload)
        first = 0x81 if text else 0x82  # FIN, and the opcode
        if length < 126:
            head = bytes((first, length))
        elif length < 65536:
            head = bytes((first, 126)) + length.to_bytes(2, "big")
        else:
            head = bytes((first, 127)) + length.to_bytes(8, "big")
        gathered = self._gathered
        if not gathered:
            asyncio.get_running_loop().call_soon(self._flush)
        gathered += (head, payload)
        self._gathered_size += length
        return True

    def _flush(self) -> None:
        gathered = self._gathered
        if gathered:
            self._gathered = []
            self._gathered_size = 0
            transport = self._transport
            if transport is not None and not transport.is_closing():
                transport.write(b"".join(gathered))

    async def _send_in_order(self, event: Event) -> None:
        self._flush()
        await self._stream_send(event)

    # A property, not an instance attribute holding ``self._send_in_order``: a bound
    # method of itself kept by the stream is a reference cycle, and every closed
    # stream would wait for a garbage collection to be freed
    # (gateway/transports/connection_cycles.py).
    @property
    def send(self) -> Callable[[Event], Awaitable[None]]:
        """Hypercorn's ``send`` for this stream, writing what was gathered first, so
        every frame leaves in order."""
        return self._send_in_order

    @send.setter
    def send(self, send: Callable[[Event], Awaitable[None]]) -> None:
        self._stream_send = send


def _queue_of(app_put: Callable[..., Awaitable[None]]) -> asyncio.Queue[Any]:
    """The application's queue behind Hypercorn's ``app_put`` (its bound ``put``)."""
    queue = getattr(app_put, "__self__", None)
    assert isinstance(queue, asyncio.Queue)
    return queue


def _tcp_server_of(stream_send: Callable[[Event], Awaitable[None]]) -> Any:
    """The asyncio ``TCPServer`` behind an HTTP/1.1 stream's ``send``; None for HTTP/2.

    The stream's ``send`` is ``H11Protocol.stream_send``, whose protocol's ``send`` is
    ``TCPServer.protocol_send``; HTTP/2 frames each message into DATA frames under
    its own flow control, so there is no transport to write a frame to.
    """
    protocol = getattr(stream_send, "__self__", None)
    if not isinstance(protocol, hypercorn.protocol.h11.H11Protocol):
        return None
    server = getattr(protocol.send, "__self__", None)
    if server is None or not hasattr(server, "writer") or not hasattr(server, "send_lock"):
        return None
    return server
