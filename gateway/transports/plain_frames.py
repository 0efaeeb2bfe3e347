"""A sans-I/O reader of the plain client messages of RFC 6455, handing the rest on.

Theory of operation
-------------------
A server reads a client's byte stream as a sequence of frames (RFC 6455 §5.2)::

     0                   1                   2                   3
    +-+-+-+-+-------+-+-------------+-------------------------------+
    |F|R|R|R| opcode|M| Payload len |    Extended payload length    |
    |I|S|S|S|  (4)  |A|     (7)     |             (16/64)           |
    |N|V|V|V|       |S|             |   (if payload len==126/127)   |
    +-+-+-+-+-------+-+-------------+ - - - - - - - - - - - - - - - +
    |     Extended payload length continued, if payload len == 127  |
    + - - - - - - - - - - - - - - - +-------------------------------+
    |                               |Masking-key, if MASK set to 1  |
    +-------------------------------+-------------------------------+
    | Masking-key (continued)       |          Payload Data         |
    +-------------------------------- - - - - - - - - - - - - - - - +

Almost every frame an ASBP client sends is a *plain message*: FIN set, no RSV
bit, opcode 0x1 (text, valid UTF-8) or 0x2 (binary), masked (§5.1: "a client
MUST mask all frames that it sends to the server"), not inside a fragmented
message, and no longer than the connection's message limit. :class:`PlainFrameReader`
parses exactly those and returns their payloads.

Every other frame is *handed on*, byte for byte, to a full implementation
(websockets' :class:`~websockets.server.ServerProtocol`, through its public
``receive_data``): control frames, fragments and everything between them,
reserved bits, unknown opcodes, unmasked frames, oversized frames and text
that is not UTF-8. That implementation decides what they mean and how the
connection fails (1002, 1007, 1009, ...), so the reader never needs to.

The handoff is clean because the reader delimits *every* frame, handed on or
not, by its header alone: the length field says where a frame ends whatever
else is wrong with it. So the full implementation is only ever given whole
frames, in order, and is therefore always at a frame boundary when the reader
takes the next one: nobody needs to look at its parser's state. A handed-on
frame is passed on as its bytes arrive (:data:`OTHER` events, possibly several
per frame), so an oversized frame is never buffered here: the full
implementation refuses it from its header. Fragmented messages are handed on
whole: from a data frame without FIN up to the continuation frame with FIN
(and the control frames between them), every frame goes on.

The reader cannot see whether the full implementation failed the connection
(a protocol error, a close frame): its caller must check after each
:data:`OTHER` event and, if the connection is no longer open, give it
:meth:`PlainFrameReader.rest` and stop using the reader.

What it does not do: extensions (a caller must not use it once one, such as
permessage-deflate, was negotiated: RSV1 then means "compressed"), client-side
reading (unmasked frames), or checking the minimal length encoding of §5.2
(nor does websockets).
"""

from __future__ import annotations

from typing import Final

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - websockets built without its C extension
    from websockets.utils import apply_mask

__all__ = ["BINARY", "OTHER", "TEXT", "PlainFrameReader", "too_big_reason"]

#: A whole text message: its payload is valid UTF-8.
TEXT: Final = 0x1
#: A whole binary message.
BINARY: Final = 0x2
#: Bytes of frames the reader does not handle, to hand on as they are.
OTHER: Final = -1

# §5.2: FIN is the high bit of the first byte, then RSV1-3, then the opcode.
_FIN_NO_RSV: Final = 0x80


class PlainFrameReader:
    """Split a client's frames (after the opening handshake) into plain messages and the rest.

    Args:
        max_size: the largest payload of a message read here (None: no limit);
            a longer frame is handed on, for the full implementation to refuse.
    """

    __slots__ = ("_at", "_buffer", "_fragmented", "_other", "handed_on_header", "max_size")

    def __init__(self, *, max_size: int | None) -> None:
        self.max_size = max_size
        self._buffer = bytearray()
        #: Where the next unread byte of ``_buffer`` is.
        self._at = 0
        #: Bytes of a handed-on frame still to be handed on.
        self._other = 0
        #: Inside a fragmented message (handed on, with everything up to its end).
        self._fragmented = False
        #: After an :data:`OTHER` event that starts a frame: its ``(opcode, fin,
        #: payload length)`` from the header; None after every other event. A caller
        #: that enforces limits from the header (gateway.transports.hypercorn_ws)
        #: reads it; the bytes are handed on all the same.
        self.handed_on_header: tuple[int, bool, int] | None = None

    def feed(self, data: bytes | bytearray) -> None:
        """Append ``data``, as received, to what is still to be read."""
        buffer = self._buffer
        if self._at:
            del buffer[: self._at]
            self._at = 0
        buffer += data

    def next_event(self) -> tuple[int, bytes] | None:
        """The next event: ``(TEXT | BINARY, payload)``, ``(OTHER, frame bytes)``, or None.

        None means that more data is needed: the rest of a plain frame, or of a
        frame's header.
        """
        self.handed_on_header = None
        buffer = self._buffer
        at = self._at
        available = len(buffer) - at
        other = self._other
        if other:
            if not available:
                return None
            end = at + min(other, available)
            self._other = other - (end - at)
            self._at = end
            return OTHER, bytes(buffer[at:end])
        if available < 2:
            return None
        first = buffer[at]
        second = buffer[at + 1]
        length = second & 0x7F
        head = at + 2
        if length == 126:
            if available < 4:
                return None
            length = int.from_bytes(buffer[head : head + 2], "big")
            head += 2
        elif length == 127:
            if available < 10:
                return None
            length = int.from_bytes(buffer[head : head + 8], "big")
            head += 8
        masked = second & 0x80
        if masked:
            head += 4  # the masking key
        end = head + length
        opcode = first & 0x0F
        max_size = self.max_size
        if (
            first & 0xF0 == _FIN_NO_RSV
            and 0 < opcode < 3  # TEXT or BINARY
            and masked
            and (max_size is None or length <= max_size)
            and not self._fragmented
        ):
            if len(buffer) < end:
                return None  # the rest of this frame is still to come
            payload = apply_mask(buffer[head:end], buffer[head - 4 : head])
            if opcode == BINARY or payload.isascii():
                self._at = end
                return opcode, payload
            try:
                payload.decode()
            except UnicodeDecodeError:
                pass  # not a plain message: the full implementation fails it (1007)
            else:
                self._at = end
                return TEXT, payload
        # Handed on, from its header to its last byte. Only data frames start or
        # end a fragmented message (§5.4); control frames may come between.
        if opcode < 3:  # continuation, text or binary
            self._fragmented = not first & 0x80
        self._other = end - at
        event = self.next_event()  # its first bytes: at least the two read above
        self.handed_on_header = (opcode, bool(first & 0x80), length)
        return event

    def rest(self) -> bytes:
        """Everything received and not yet returned; the reader is empty afterwards."""
        rest = bytes(self._buffer[self._at :])
        self._buffer = bytearray()
        self._at = 0
        self._other = 0
        return rest


def too_big_reason(length: int, max_size: int, current_size: int | None) -> str:
    """The reason websockets gives for 1009 (its ``PayloadTooBig``), word for word.

    Args:
        length: the payload length the refused frame's header announces.
        max_size: the connection's message limit.
        current_size: bytes of the fragmented message read before this frame, if any.
    """
    if current_size is None:
        return f"frame with {length} bytes exceeds limit of {max_size} bytes"
    return (
        f"frame with {length} bytes after reading {current_size} bytes "
        f"exceeds limit of {max_size} bytes"
    )
