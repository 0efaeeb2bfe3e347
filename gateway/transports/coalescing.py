"""Uvicorn's WebSocket protocol, writing what one loop turn sends in one system call.

ASGI sends one WebSocket message per ``send`` call, and Uvicorn writes each to
its socket at once: a queue delivery of a hundred notifications costs a hundred
``send(2)`` calls, and on loopback or a busy host each of them may also wake the
reader and give it the CPU. That was the largest single cost of the queue path
(bench/queues.py): more than the broker's own Python per message.

:class:`CoalescingWebSocketProtocol` keeps Uvicorn's ``websockets-sansio``
protocol as it is and hands it a transport that gathers writes: the first
write of a loop turn schedules a flush (``call_soon``), and every write until
then joins it, so the frames leave together, in order, in one system call,
before the loop next waits for I/O. Nothing else changes: ASGI still gets one
``send`` per message, every message is framed by Uvicorn, and closing or
aborting the transport writes what was gathered first (close) or drops it with
the connection (abort), as the real transport would.

Backpressure is unchanged: the real transport still calls the protocol's
``pause_writing`` when its buffer fills, and what is gathered is bounded by what
the application sends in one loop turn (each Channel's outbox bounds that).

It also offers the application a shortcut for its WebSocket messages: the
ASGI extension ``asbp.send_frame`` (gateway.transports.websocket.SEND_FRAME) in
the connection's scope is :meth:`CoalescingWebSocketProtocol.send_frame`, a
plain function that frames one message and gathers it, or declines (returns
False) whenever Uvicorn's own ``send`` would do anything but that: before the
handshake or after a close, while the transport is paused (the ASGI ``send``
waits then), with an extension (compression) negotiated, or while the
connection has output of its own pending. Per message it spares a coroutine
(two, behind Starlette's middleware), the ASGI message dict and websockets'
frame objects, which on the queue path (bench/queues.py: two frames per
message) cost more than the rest of sending. The frames are the same bytes
websockets would write: one unmasked, unfragmented frame per message.

Reading, likewise, it parses the plain messages itself once the connection is
open, with :class:`~gateway.transports.plain_frames.PlainFrameReader` (our own
RFC 6455 frame reader, which delimits every frame by its header): a whole,
unfragmented, masked binary or (valid UTF-8) text frame within ``ws_max_size``
becomes the same ``websocket.receive`` event Uvicorn would have queued (or goes
to the RECEIVE_FRAMES handler), and reading pauses after a read that queued
events, as Uvicorn does. Every other frame (control frames, fragmented
messages with whatever comes between their fragments, anything invalid or
oversized) is given, whole and in order, to websockets through its public
``receive_data``, which handles it as always: pings, closes, protocol errors
and their close codes do not change. Since websockets only ever gets whole
frames, it is between frames whenever the reader goes on; nothing here reads
websockets' parser state. Once websockets has failed or closed the connection
(its public ``state``), or the application has closed it, websockets reads
everything. The reader starts at the first read after the handshake, and only
if websockets was given nothing but the request before it (a client that sends
frames before the 101 is read by websockets throughout). Parsing frames through
websockets' generator-based reader cost about 3 µs a message, as much as the
broker's own work on a publication (bench/README.md, and bench/frames.py for
the two readers side by side).

It also keeps the broker's bound on handshakes in flight
(gateway/transports/handshakes.py): an upgrade request parsed past it is
answered at once with 503, before the application runs.

Enabled with ``uvicorn.Config(ws=CoalescingWebSocketProtocol)``.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from typing import Any, Final, cast

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.datastructures import Headers
from websockets.http11 import Request, Response
from websockets.protocol import State

from gateway.transports.connection_cycles import release_read_callback
from gateway.transports.handshakes import RETRY_AFTER, HandshakeBound, peer_gone
from gateway.transports.handshakes import STATE_KEY as HANDSHAKES
from gateway.transports.plain_frames import OTHER, TEXT, PlainFrameReader, too_big_reason
from gateway.transports.websocket import RECEIVE_FRAMES, SEND_FRAME

__all__ = ["CLOSE_TIMEOUT", "CoalescingTransport", "CoalescingWebSocketProtocol"]

#: Seconds a connection whose message was refused (1009) waits for the client's
#: close frame before the server closes it (websockets' own default is 10).
CLOSE_TIMEOUT: Final = 5.0

#: The close frame's opcode (RFC 6455 §5.5.1).
_CLOSE: Final = 0x8


class CoalescingTransport(asyncio.Transport):
    """A transport that writes what it was given in one loop turn as one write.

    Args:
        transport: the real transport; everything but writing goes to it.
        loop: the loop the flush is scheduled on.
    """

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._gathered: list[bytes] = []
        #: The next scheduled flush waits one more loop turn (:meth:`defer_flush`).
        self._deferred = False

    @property
    def real_transport(self) -> asyncio.Transport:
        """The transport this one writes to."""
        return self._transport

    def write(self, data: bytes | bytearray | memoryview) -> None:
        gathered = self._gathered
        if not gathered:
            self._loop.call_soon(self._scheduled_flush)
        gathered.append(bytes(data))

    def write_frame(self, head: bytes, payload: bytes) -> None:
        """Gather a frame's header and its payload (bytes: kept as they are, not copied)."""
        gathered = self._gathered
        if not gathered:
            self._loop.call_soon(self._scheduled_flush)
        gathered += (head, payload)

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def defer_flush(self) -> None:
        """Let the next scheduled flush wait one more loop turn, once.

        For the handshake's response: the application's writer task, created in
        the same turn, then sends its first frame (the broker's greeting) before
        the flush, and both leave in one system call instead of two.
        """
        self._deferred = True

    def _scheduled_flush(self) -> None:
        if self._deferred:
            self._deferred = False
            self._loop.call_soon(self._scheduled_flush)
            return
        self.flush()

    def flush(self) -> None:
        """Write what was gathered now (the scheduled flush, or before a close)."""
        gathered = self._gathered
        if gathered:
            self._gathered = []
            if not self._transport.is_closing():
                self._transport.write(gathered[0] if len(gathered) == 1 else b"".join(gathered))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._gathered = []
        self._transport.abort()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._gathered))

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)


class CoalescingWebSocketProtocol(WebSocketsSansIOProtocol):
    """Uvicorn's ``websockets-sansio`` protocol on a :class:`CoalescingTransport`,
    reading plain messages itself and offering :meth:`send_frame`."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, though not always an asyncio.Transport by class: uvloop's
        # TCPTransport and SSLProtocol's are Cython classes that only quack like one.
        self._coalescing = CoalescingTransport(cast(asyncio.Transport, transport), self.loop)
        #: Our reader, once the connection is open; None: websockets reads everything.
        self._reader: PlainFrameReader | None = None
        #: Whether websockets keeps reading for good (see _start_reading).
        self._websockets_reads = False
        #: What websockets was given before the handshake completed.
        self._request = bytearray()
        self._extensions_negotiated = False
        self._on_frame: Callable[[bytes, bool], None] | None = None
        self._on_frame_context: contextvars.Context | None = None
        #: Bytes of the fragmented message handed on so far (websockets' current_size).
        self._current_size: int | None = None
        #: Refused a message (1009): dropping what comes until the client's close frame.
        self._lingering = False
        #: The bound this connection's handshake counts against, until it is done.
        self._handshake: HandshakeBound | None = None
        super().connection_made(self._coalescing)

    def connection_lost(self, exc: Exception | None) -> None:
        """Uvicorn's, then what would keep this connection in reference cycles.

        The scope's extensions hold bound methods of this protocol, which holds the
        scope: a cycle (websockets' parser is another, below) that only a garbage
        collection would free (with many Channels open, a full one costs more than
        the connect: gateway/transports/connection_cycles.py). The application may
        still look them up or call them: gone, it sends through ASGI (which reports
        the disconnect), and a kept ``send_frame`` declines, as it would now anyway.
        """
        try:
            super().connection_lost(exc)
        finally:
            self._handshake_done()
            extensions = self.scope.get("extensions") if hasattr(self, "scope") else None
            if extensions:
                extensions.pop(SEND_FRAME, None)
                extensions.pop(RECEIVE_FRAMES, None)
            self._on_frame = None
            self._on_frame_context = None
            # websockets' parser is a generator of its ServerProtocol, and a suspended
            # one holds the protocol in its frame: one more cycle, left whenever the
            # socket closes before websockets has read the client's end of stream
            # (Uvicorn never passes it on). Nothing is parsed after the connection
            # is lost; closing the generator ends it where it waits.
            self.conn.parser.close()
            release_read_callback(self._coalescing.real_transport)

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        if self._lingering:
            assert reader is not None
            if self._close_frame_read(reader, data):
                self.transport.close()
            return
        if reader is None:
            reader = self._start_reading(data)
            if reader is None:
                super().data_received(data)
                return
        elif self.close_sent or self.conn.state is not State.OPEN:
            # The application closed (websockets now waits for the client's echo).
            self._hand_over(reader)
            super().data_received(data)
            return
        reader.feed(data)
        handler = self._on_frame
        if handler is not None and self.queue.empty():
            # In the application's context, as its own receive loop would run it.
            assert self._on_frame_context is not None
            self._on_frame_context.run(self._read_frames, reader, handler)
        else:
            self._read_frames(reader, None)

    def _start_reading(self, data: bytes) -> PlainFrameReader | None:
        """Our reader, if it can take over at ``data``; otherwise None: websockets reads it.

        Before the handshake completes, websockets reads: the request, and any
        frame a client sends too early (RFC 6455 §4.1 has it wait for the
        response). The reader takes over only where websockets must be between
        frames without our looking at its parser: at the first read after the
        handshake, if every byte websockets was given belonged to the request.
        The request (a GET, no body) ends at its first empty line.
        """
        if self._websockets_reads:
            return None
        if not self.handshake_complete:
            self._request += data
            return None
        # Every byte before the response belonged to the request: its first empty
        # line, its end, is the last thing websockets was given.
        request_whole = self._request.find(b"\r\n\r\n") == len(self._request) - 4
        self._request = bytearray()
        self._websockets_reads = True  # unless the reader takes over, for good
        if (
            not request_whole
            or self.close_sent
            or self.conn.state is not State.OPEN
            or self._extensions_negotiated
        ):
            return None
        self._websockets_reads = False
        self._reader = PlainFrameReader(max_size=self.config.ws_max_size)
        return self._reader

    def _hand_over(self, reader: PlainFrameReader) -> None:
        """From now on, websockets reads everything, starting with what ``reader`` holds."""
        self._reader = None
        self._websockets_reads = True
        rest = reader.rest()
        if rest:
            super().data_received(rest)

    def _read_frames(
        self, reader: PlainFrameReader, handler: Callable[[bytes, bool], None] | None
    ) -> None:
        """Hand the plain messages read to ``handler`` (or queue them) and the other
        frames to websockets, in order, until the reader needs more data."""
        queue = self.queue
        queued = False
        while (event := reader.next_event()) is not None:
            kind, payload = event
            if kind == OTHER:
                header = reader.handed_on_header
                if header is not None and self._refuse_too_big(reader, header):
                    return
                super().data_received(payload)
                if self.conn.state is not State.OPEN or self.close_sent:
                    # Failed, or closing: websockets discards or answers the rest.
                    self._hand_over(reader)
                    break
                if handler is not None and not queue.empty():
                    handler = None  # websockets queued a message: the next ones follow it
            elif handler is not None:
                if not self._handle(handler, payload, kind == TEXT):
                    return
                # The handler may have stopped the shortcut (flow control holds the
                # connection back): the rest of this read waits in the queue.
                handler = self._on_frame
            else:
                if kind == TEXT:
                    queue.put_nowait({"type": "websocket.receive", "text": payload.decode()})
                else:
                    queue.put_nowait({"type": "websocket.receive", "bytes": payload})
                queued = True
        # As Uvicorn does once it queued a message: the app's receive() resumes reading.
        if queued and not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def _refuse_too_big(self, reader: PlainFrameReader, header: tuple[int, bool, int]) -> bool:
        """Refuse a frame longer than what the message may still hold, from its header,
        as websockets would (the same 1009 and reason), but wait for the client's close
        frame before closing; True if it did.

        websockets closes the socket at once, with the rest of the message unread, and
        the kernel answers the client's next bytes with a reset: a browser that gets it
        discards the close frame it had not yet read and reports 1006, no reason
        (gateway/transports/hypercorn_ws.py lingers the same way on Hypercorn).
        """
        opcode, fin, length = header
        max_size = self.config.ws_max_size
        current = self._current_size
        if length <= max_size - (current or 0):
            if opcode < 3:  # a data frame starts, continues or ends the message (§5.4)
                self._current_size = None if fin else (current or 0) + length
            return False
        self.conn.send_close(1009, too_big_reason(length, max_size, current))
        # The application learns when the connection is lost (Uvicorn queues the
        # disconnect then): told now, it would return, and Uvicorn closes the socket
        # when it does.
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        self._lingering = True
        # The rest must be read to find the close frame (a no-op unless paused).
        self.read_paused = False
        self.transport.resume_reading()
        if self._close_frame_read(reader, b""):
            self.transport.close()
        else:
            self.loop.call_later(CLOSE_TIMEOUT, self.transport.close)
        return True

    @staticmethod
    def _close_frame_read(reader: PlainFrameReader, data: bytes) -> bool:
        """Drop ``data``, unless it completes the header of the client's close frame."""
        reader.feed(data)
        while (event := reader.next_event()) is not None:
            header = reader.handed_on_header
            if event[0] == OTHER and header is not None and header[0] == _CLOSE:
                return True
        return False

    def _handle(self, handler: Callable[[bytes, bool], None], payload: bytes, text: bool) -> bool:
        """Call the application's frame handler; False if it failed (the connection ends)."""
        try:
            handler(payload, text)
        except Exception:
            # What Uvicorn does when the application fails in its receive loop.
            self.logger.exception("Exception in ASGI application\n")
            self._on_frame = None
            self._reader = None
            self._websockets_reads = True
            self.transport.close()
            return False
        return True

    def on_frame(self, handler: Callable[[bytes, bool], None] | None) -> bool:
        """Hand plain messages to ``handler(payload, text)`` as they are read (None: stop).

        The RECEIVE_FRAMES extension. Called by the application inside its
        receive loop: from then on, a message read while nothing waits in the
        ASGI queue goes to ``handler`` at once, in the application's context
        (captured here), instead of becoming a ``websocket.receive`` event; a
        message read while events wait is queued behind them, so the order
        holds. Everything else (disconnects, messages websockets parsed) still
        comes through ``receive``. Returns True.
        """
        self._on_frame = handler
        self._on_frame_context = None if handler is None else contextvars.copy_context()
        return True

    def shutdown(self) -> None:
        """What Uvicorn does to each connection when the server stops, minus its race.

        Uvicorn sends every open connection a 1012 close. When the peer's close frame came
        first, websockets has answered it already (the state is CLOSING or CLOSED) and
        refuses a second close frame with ``InvalidState``, which aborts the server's
        whole shutdown; the closing handshake is done, so only the socket is left to close.
        """
        if self.handshake_complete and not self.close_sent and self.conn.state is not State.OPEN:
            self.stop_keepalive()
            self.transport.close()
            return
        super().shutdown()

    def handle_connect(self, event: Request) -> None:
        bound: HandshakeBound | None = self.app_state.get(HANDSHAKES)
        if bound is not None:
            if peer_gone(self._coalescing.real_transport):
                # Waited for longer than its client did: served, it would be work
                # for nobody (gateway/transports/handshakes.py).
                bound.abandoned += 1
                self.request = event
                self.handshake_initiated = self.handshake_complete = self.close_sent = True
                self.transport.close()
                return
            if not bound.enter():
                self._refuse_busy(event, bound)
                return
            self._handshake = bound
        super().handle_connect(event)
        if self.response.status_code != 101:
            self._handshake_done()  # refused by websockets (a bad request): no app runs
        else:  # the scope exists; its task has not run yet
            # Negotiated extensions (permessage-deflate) change what frames mean.
            self._extensions_negotiated = "Sec-WebSocket-Extensions" in self.response.headers
            # Uvicorn types the extensions as dicts of settings; ASGI leaves them open.
            extensions = cast(dict[str, Any], self.scope.setdefault("extensions", {}))
            extensions[SEND_FRAME] = self.send_frame
            extensions[RECEIVE_FRAMES] = self.on_frame

    def _refuse_busy(self, event: Request, bound: HandshakeBound) -> None:
        """Answer 503 with ``Retry-After`` and fault 2115, and close: the broker is
        serving ``bound.limit`` handshakes already. As Uvicorn answers a request
        websockets refused: no scope, no application task, websockets discards the rest."""
        self.request = event
        self.handshake_initiated = True
        self.handshake_complete = True
        self.close_sent = True
        body = bound.body
        headers = Headers(
            [
                ("Retry-After", str(RETRY_AFTER)),
                ("Content-Type", "application/asbp"),
                ("Content-Length", str(len(body))),
                ("Connection", "close"),
            ]
        )
        self.conn.send_response(Response(503, "Service Unavailable", headers, body))
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.transport.close()

    def _handshake_done(self) -> None:
        """This connection's handshake no longer counts against the bound."""
        bound = self._handshake
        if bound is not None:
            self._handshake = None
            bound.leave()

    async def send(self, message: Any) -> None:
        """Uvicorn's; the application's first message (accept, close or an HTTP
        response) ends the handshake, as far as the bound is concerned."""
        if self._handshake is not None:
            self._handshake_done()
            if message["type"] == "websocket.accept":
                # The 101 and the greeting the application sends next, in one write.
                self._coalescing.defer_flush()
        await super().send(message)

    def send_receive_event_to_app(self) -> None:
        """Uvicorn's, but a text message that is not UTF-8 fails with 1007 and a reason.

        Uvicorn closes with 1007 and no reason, and logs the client's bad bytes as an
        error with a traceback (any client could fill the log). Here the close frame
        says what was wrong (the decoder's words, as Hypercorn's path says them:
        gateway/transports/hypercorn_ws.py), and nothing is logged.
        """
        if self.curr_msg_data_type == "text" and not self.close_sent:
            try:
                b"".join(self.frames).decode()
            except UnicodeDecodeError as exc:
                self.frames = []
                self.conn.send_close(1007, exc.reason)
                self.handle_parser_exception()
                return
        super().send_receive_event_to_app()

    def send_frame(self, payload: bytes, text: bool) -> bool:
        """Frame ``payload`` as one binary (or, if ``text``, UTF-8 text) message and gather it.

        Returns False, having done nothing, where Uvicorn's ``send`` would wait,
        refuse, or do more than write one plain frame; the caller sends the
        message through ASGI then.
        """
        # Nothing of websockets' own output can be waiting here: Uvicorn writes what
        # it queues (pongs, closes) right after each call into it, and never sends
        # a fragmented message, so one whole frame now keeps every frame in order.
        if (
            self.disconnected
            or self.close_sent
            or not self.handshake_complete
            or self.initial_response is not None
            or not self.writable.is_set()
            or self._extensions_negotiated
            or self.conn.state is not State.OPEN
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
        self._coalescing.write_frame(head, payload)
        return True
