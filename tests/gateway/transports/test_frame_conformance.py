"""RFC 6455 at the frame level, the same on every server path the broker ships.

One table of cases, modelled on the Autobahn TestSuite's sections 1-7 and 9
(framing, pings and pongs, reserved bits, opcodes, fragmentation, UTF-8,
closing, limits), each written here as the exact bytes a client sends after the
opening handshake and what the server must answer: the frames it sends back,
and then either nothing more (the connection stays open, which the case checks
with a closing handshake of its own) or a close frame with a given code.

Every case runs against each server path:

* ``hypercorn``: Hypercorn over HTTP/1.1, with gateway.transports.hypercorn_ws
  (plain messages parsed by us, everything else by wsproto);
* ``hypercorn-h2``: the same over HTTP/2 (RFC 8441: an extended CONNECT in the
  clear, with prior knowledge), the WebSocket frames in the stream's DATA;
* ``uvicorn``: Uvicorn's own ``websockets-sansio`` protocol (websockets);
* ``uvicorn-fast``: Uvicorn with gateway.transports.coalescing, whose reader
  parses plain messages itself and hands everything else to websockets
  (the broker's default on Uvicorn).

Behind each is the real broker on its Channel endpoint ``/asbp``: a message is
an ASBP ``asbp.ping``, answered with ``asbp.pong`` and the same body, as text
if it came as text. The client is a raw socket writing exact bytes
(``TCP_NODELAY``, one ``send`` per listed segment: the server may still read
segments together, never apart), so nothing in between rewrites a frame.

Every path answers every case alike: the same close code and, where the
connection is failed (not a close the client started), a close frame that gives
a reason; for a message over the limit (1009) the very same reason, websockets'
words, which gateway.transports.hypercorn_ws gives on Hypercorn too. (For 1002
and 1007 the reason is the wording of the library that found the error,
wsproto's or websockets'.)

Each server starts once for the module; every case opens its own connection.
"""

from __future__ import annotations

import base64
import contextlib
import os
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import pytest

import asbp
from gateway.app import create_app
from gateway.config.model import GatewayConfig
from gateway.transports.websocket import max_message_bytes
from tests.support import T, serve_app
from tests.support.servers import RunningServer

#: A small ASBP limit keeps the oversized cases cheap: servers read 4x this.
LIMITS = asbp.Limits(max_frame_bytes=80 * 1024)
MAX_MESSAGE = max_message_bytes(LIMITS)

PATHS = ("hypercorn", "hypercorn-h2", "uvicorn", "uvicorn-fast")

# Opcodes (RFC 6455 §5.2).
CONT, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


# --------------------------------------------------------------------------
# Frames, as bytes


def frame(
    opcode: int,
    payload: bytes = b"",
    *,
    fin: bool = True,
    rsv: int = 0,
    masked: bool = True,
    length: int | None = None,
) -> bytes:
    """One client frame. ``rsv`` is the three RSV bits (0-7); ``length`` overrides
    the payload length field (to announce more than is sent)."""
    size = len(payload) if length is None else length
    head = bytearray([(0x80 if fin else 0) | rsv << 4 | opcode])
    mask_bit = 0x80 if masked else 0
    if size < 126:
        head.append(mask_bit | size)
    elif size < 65536:
        head += bytes([mask_bit | 126]) + struct.pack("!H", size)
    else:
        head += bytes([mask_bit | 127]) + struct.pack("!Q", size)
    if not masked:
        return bytes(head) + payload
    key = os.urandom(4)
    keys = (key * (len(payload) // 4 + 1))[: len(payload)]
    masked_payload = (int.from_bytes(payload) ^ int.from_bytes(keys)).to_bytes(len(payload))
    return bytes(head) + key + masked_payload


def close_payload(code: int, reason: bytes = b"") -> bytes:
    return struct.pack("!H", code) + reason


def ping_command(number: int, body: bytes = b"") -> bytes:
    return b"c=asbp.ping,u=%d;" % number + body


def pong_command(number: int, body: bytes = b"") -> bytes:
    return b"c=asbp.pong,u=%d;" % number + body


# --------------------------------------------------------------------------
# The table


@dataclass(frozen=True)
class Closed:
    """The server fails or closes the connection with ``code`` (a close frame)."""

    code: int
    #: The close frame must give this reason, word for word, on every path (None:
    #: any reason, if the connection was failed rather than closed by the client).
    reason: str | None = None
    #: The server echoes the client's close (rather than failing the connection).
    echo: bool = False


@dataclass(frozen=True)
class Case:
    #: What the case is about; its pytest id.
    name: str
    #: Segments written one ``send`` each, in order.
    send: tuple[bytes, ...]
    #: Frames the server answers with, as (opcode, payload), in order.
    replies: tuple[tuple[int, bytes], ...] = ()
    #: None: the connection stays open.
    closed: Closed | None = None
    #: Segments written once the replies arrived (the replies are the broker's,
    #: so a failure these cause could otherwise overtake them).
    then: tuple[bytes, ...] = ()


def one_byte_at_a_time(data: bytes) -> tuple[bytes, ...]:
    return tuple(data[i : i + 1] for i in range(len(data)))


BODY_7 = b"x" * 50
BODY_16 = b"y" * 1000
BODY_64 = b"z" * (LIMITS.max_frame_bytes - 20)  # under the ASBP limit
PING_7, PING_16, PING_64 = (
    ping_command(1, BODY_7),
    ping_command(2, BODY_16),
    ping_command(3, BODY_64),
)
FRAME_64 = frame(BINARY, PING_64)  # one masking key for both halves
FRAME_9 = frame(BINARY, ping_command(9))
UTF8 = "κόσμε".encode()  # Autobahn 6.2's "kosme"
INVALID_UTF8 = b"\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80edited"  # a surrogate
HUGE = MAX_MESSAGE + 1

CASES: tuple[Case, ...] = (
    # 1. Framing: the three length forms, text and binary, whole and split.
    Case("1.1 text, 7-bit length", (frame(TEXT, ping_command(1)),), ((TEXT, pong_command(1)),)),
    Case(
        "1.2 binary, 7-bit length", (frame(BINARY, PING_7),), ((BINARY, pong_command(1, BODY_7)),)
    ),
    Case(
        "1.3 binary, 16-bit length",
        (frame(BINARY, PING_16),),
        ((BINARY, pong_command(2, BODY_16)),),
    ),
    Case("1.4 text, 16-bit length", (frame(TEXT, PING_16),), ((TEXT, pong_command(2, BODY_16)),)),
    Case(
        "1.5 binary, 64-bit length",
        (frame(BINARY, PING_64),),
        ((BINARY, pong_command(3, BODY_64)),),
    ),
    Case(
        "1.6 a 7-bit frame one byte per send",
        one_byte_at_a_time(frame(BINARY, ping_command(4, b"split"))),
        ((BINARY, pong_command(4, b"split")),),
    ),
    Case(
        "1.7 a 16-bit frame one byte per send",
        one_byte_at_a_time(frame(TEXT, PING_16)),
        ((TEXT, pong_command(2, BODY_16)),),
    ),
    Case(
        "1.8 a 64-bit frame, its header one byte per send",
        (*one_byte_at_a_time(FRAME_64[:14]), FRAME_64[14:]),
        ((BINARY, pong_command(3, BODY_64)),),
    ),
    Case(
        "1.9 three messages in one send",
        (
            frame(BINARY, ping_command(5))
            + frame(BINARY, ping_command(6))
            + frame(BINARY, ping_command(7)),
        ),
        ((BINARY, pong_command(5)), (BINARY, pong_command(6)), (BINARY, pong_command(7))),
    ),
    Case(
        "1.10 a message and the next one's first bytes in one send",
        (
            frame(BINARY, ping_command(8)) + FRAME_9[:3],
            FRAME_9[3:],
        ),
        ((BINARY, pong_command(8)), (BINARY, pong_command(9))),
    ),
    Case(
        "1.11 an unmasked client frame",
        (frame(BINARY, ping_command(1), masked=False),),
        closed=Closed(1002, reason="incorrect masking"),
    ),
    # 2. Pings and pongs.
    Case("2.1 ping, no payload", (frame(PING),), ((PONG, b""),)),
    Case("2.2 ping, 125 bytes", (frame(PING, b"p" * 125),), ((PONG, b"p" * 125),)),
    Case("2.3 ping, binary payload", (frame(PING, bytes(range(32))),), ((PONG, bytes(range(32))),)),
    Case(
        "2.4 ping, 126 bytes: too long for a control frame",
        (frame(PING, b"p" * 126),),
        closed=Closed(1002, reason="control frame too long"),
    ),
    Case(
        "2.5 unsolicited pong",
        (frame(PONG, b"unasked"), frame(BINARY, ping_command(1))),
        ((BINARY, pong_command(1)),),
    ),
    Case(
        "2.6 pong, 126 bytes",
        (frame(PONG, b"p" * 126),),
        closed=Closed(1002, reason="control frame too long"),
    ),
    Case(
        "2.7 ping split one byte per send",
        one_byte_at_a_time(frame(PING, b"split ping")),
        ((PONG, b"split ping"),),
    ),
    Case(
        "2.8 ten pings in one send",
        (b"".join(frame(PING, b"%d" % n) for n in range(10)),),
        tuple((PONG, b"%d" % n) for n in range(10)),
    ),
    # 3. Reserved bits (no extension negotiated).
    *(
        Case(
            f"3.{rsv} RSV={rsv} on a text frame",
            (frame(TEXT, ping_command(1), rsv=rsv),),
            closed=Closed(1002, reason="reserved bits must be 0"),
        )
        for rsv in range(1, 8)
    ),
    Case(
        "3.8 RSV set after a valid message",
        (frame(BINARY, ping_command(1)),),
        ((BINARY, pong_command(1)),),
        Closed(1002, reason="reserved bits must be 0"),
        then=(frame(BINARY, ping_command(2), rsv=2),),
    ),
    Case(
        "3.9 RSV set on a ping",
        (frame(PING, b"x", rsv=4),),
        closed=Closed(1002, reason="reserved bits must be 0"),
    ),
    # 4. Opcodes.
    *(
        Case(
            f"4.1.{opcode} reserved data opcode {opcode}",
            (frame(opcode, b"x"),),
            closed=Closed(1002, reason="invalid opcode"),
        )
        for opcode in range(3, 8)
    ),
    *(
        Case(
            f"4.2.{opcode} reserved control opcode {opcode}",
            (frame(opcode, b"x"),),
            closed=Closed(1002, reason="invalid opcode"),
        )
        for opcode in range(0xB, 0x10)
    ),
    Case(
        "4.3 reserved opcode after a valid message",
        (frame(BINARY, ping_command(1)),),
        ((BINARY, pong_command(1)),),
        Closed(1002, reason="invalid opcode"),
        then=(frame(5, b"x"),),
    ),
    # 5. Fragmentation.
    Case(
        "5.1 ping fragmented",
        (frame(PING, b"a", fin=False), frame(CONT, b"b")),
        closed=Closed(1002, reason="fragmented control frame"),
    ),
    Case(
        "5.2 pong fragmented",
        (frame(PONG, b"a", fin=False), frame(CONT, b"b")),
        closed=Closed(1002, reason="fragmented control frame"),
    ),
    Case(
        "5.3 text in two fragments",
        (frame(TEXT, ping_command(1)[:8], fin=False), frame(CONT, ping_command(1)[8:])),
        ((TEXT, pong_command(1)),),
    ),
    Case(
        "5.4 binary in three fragments, in one send",
        (
            frame(BINARY, b"c=asbp", fin=False)
            + frame(CONT, b".ping,u=", fin=False)
            + frame(CONT, b"2;tail"),
        ),
        ((BINARY, pong_command(2, b"tail")),),
    ),
    Case(
        "5.5 a ping between fragments",
        (frame(TEXT, b"c=asbp.pi", fin=False), frame(PING, b"mid"), frame(CONT, b"ng,u=3;")),
        ((PONG, b"mid"), (TEXT, pong_command(3))),
    ),
    Case(
        "5.6 a pong between fragments",
        (frame(BINARY, b"c=asbp.pi", fin=False), frame(PONG, b"mid"), frame(CONT, b"ng,u=4;")),
        ((BINARY, pong_command(4)),),
    ),
    Case(
        "5.7 fragments one byte per send, a ping between them",
        one_byte_at_a_time(
            frame(BINARY, b"c=asbp.pi", fin=False) + frame(PING, b"!") + frame(CONT, b"ng,u=5;")
        ),
        ((PONG, b"!"), (BINARY, pong_command(5))),
    ),
    Case(
        "5.8 a continuation with nothing to continue",
        (frame(CONT, b"x"),),
        closed=Closed(1002, reason="unexpected continuation frame"),
    ),
    Case(
        "5.9 a final continuation with nothing to continue",
        (frame(CONT, b"x", fin=False),),
        closed=Closed(1002, reason="unexpected continuation frame"),
    ),
    Case(
        "5.10 a new message inside a fragmented one",
        (frame(TEXT, b"c=asbp.pi", fin=False), frame(TEXT, ping_command(1))),
        closed=Closed(1002, reason="expected a continuation frame"),
    ),
    Case(
        "5.11 a plain message after a fragmented one",
        (
            frame(TEXT, b"c=asbp.pi", fin=False),
            frame(CONT, b"ng,u=6;"),
            frame(TEXT, ping_command(7)),
        ),
        ((TEXT, pong_command(6)), (TEXT, pong_command(7))),
    ),
    Case(
        "5.12 empty fragments",
        (frame(BINARY, b"", fin=False), frame(CONT, ping_command(8), fin=False), frame(CONT, b"")),
        ((BINARY, pong_command(8)),),
    ),
    # 6. UTF-8 in text messages.
    Case(
        "6.1 valid UTF-8", (frame(TEXT, ping_command(1, UTF8)),), ((TEXT, pong_command(1, UTF8)),)
    ),
    Case(
        "6.2 valid UTF-8, a code point split between fragments",
        (frame(TEXT, ping_command(2, UTF8[:3]), fin=False), frame(CONT, UTF8[3:])),
        ((TEXT, pong_command(2, UTF8)),),
    ),
    Case(
        "6.3 invalid UTF-8 (a surrogate)",
        (frame(TEXT, ping_command(3, INVALID_UTF8)),),
        closed=Closed(1007, reason="invalid continuation byte"),
    ),
    Case(
        "6.4 invalid UTF-8 (a lone continuation byte)",
        (frame(TEXT, b"\x80"),),
        closed=Closed(1007, reason="invalid start byte"),
    ),
    Case(
        "6.5 invalid UTF-8 across fragments",
        (frame(TEXT, ping_command(4, b"\xce"), fin=False), frame(CONT, b"\xff")),
        closed=Closed(1007, reason="invalid continuation byte"),
    ),
    Case(
        "6.6 invalid UTF-8 in a middle fragment",
        (
            frame(TEXT, ping_command(5), fin=False),
            frame(CONT, b"\xed\xa0\x80", fin=False),
            frame(CONT, b"ok"),
        ),
        closed=Closed(1007, reason="invalid continuation byte"),
    ),
    Case(
        "6.7 a truncated code point at the end",
        (frame(TEXT, ping_command(6, UTF8[:3]), fin=False), frame(CONT, b"")),
        closed=Closed(1007, reason="unexpected end of data"),
    ),
    Case(
        "6.8 binary is not UTF-8 checked",
        (frame(BINARY, ping_command(7, b"\xff\xfe")),),
        ((BINARY, pong_command(7, b"\xff\xfe")),),
    ),
    # 7. Closing.
    Case(
        "7.1 close 1000, echoed",
        (frame(CLOSE, close_payload(1000)),),
        closed=Closed(1000, echo=True),
    ),
    Case(
        "7.2 close with a reason",
        (frame(CLOSE, close_payload(1001, b"bye")),),
        closed=Closed(1001, echo=True),
    ),
    Case("7.3 close, no payload", (frame(CLOSE),), closed=Closed(1005, echo=True)),
    Case(
        "7.4 close, 1-byte payload",
        (frame(CLOSE, b"\x03"),),
        closed=Closed(1002, reason="close frame too short"),
    ),
    Case(
        "7.5 close, reason of 123 bytes",
        (frame(CLOSE, close_payload(1000, b"r" * 123)),),
        closed=Closed(1000, echo=True),
    ),
    Case(
        "7.6 close, payload of 126 bytes",
        (frame(CLOSE, close_payload(1000, b"r" * 124)),),
        closed=Closed(1002, reason="control frame too long"),
    ),
    Case(
        "7.7 close, reason not UTF-8",
        (frame(CLOSE, close_payload(1000, INVALID_UTF8)),),
        closed=Closed(1007, reason="invalid continuation byte at position 11"),
    ),
    Case(
        "7.8 messages after a close are ignored",
        (
            frame(CLOSE, close_payload(1000))
            + frame(BINARY, ping_command(1))
            + frame(PING, b"late"),
        ),
        closed=Closed(1000, echo=True),
    ),
    Case(
        "7.9 close fragmented",
        (frame(CLOSE, close_payload(1000), fin=False),),
        closed=Closed(1002, reason="fragmented control frame"),
    ),
    *(
        Case(
            f"7.10.{code} valid close code {code}",
            (frame(CLOSE, close_payload(code)),),
            closed=Closed(code, echo=True),
        )
        for code in (1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 3000, 3999, 4000, 4999)
    ),
    *(
        Case(
            f"7.11.{code} invalid close code {code}",
            (frame(CLOSE, close_payload(code)),),
            closed=Closed(1002, reason="invalid status code"),
        )
        for code in (0, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000, 65535)
    ),
    # 9. Limits: the servers read messages of MAX_MESSAGE bytes at most.
    Case(
        "9.1 a frame one byte over the limit",
        (frame(BINARY, bytes(HUGE)),),
        closed=Closed(1009, reason=f"frame with {HUGE} bytes exceeds limit of {MAX_MESSAGE} bytes"),
    ),
    Case(
        "9.2 a text frame one byte over the limit",
        (frame(TEXT, b"a" * HUGE),),
        closed=Closed(1009, reason=f"frame with {HUGE} bytes exceeds limit of {MAX_MESSAGE} bytes"),
    ),
    Case(
        "9.3 fragments adding up to one byte over the limit",
        (
            frame(BINARY, bytes(MAX_MESSAGE // 2), fin=False),
            frame(CONT, bytes(MAX_MESSAGE // 2 + 1)),
        ),
        closed=Closed(
            1009,
            reason=f"frame with {MAX_MESSAGE // 2 + 1} bytes after reading {MAX_MESSAGE // 2}"
            f" bytes exceeds limit of {MAX_MESSAGE} bytes",
        ),
    ),
    Case(
        "9.4 a frame announcing 2**62 bytes",
        (frame(BINARY, b"", length=2**62), bytes(HUGE)),
        closed=Closed(
            1009, reason=f"frame with {2**62} bytes exceeds limit of {MAX_MESSAGE} bytes"
        ),
    ),
    Case(
        "9.5 a message at the limit reaches the broker (ASBP fault 1101, still open)",
        (frame(BINARY, ping_command(9, bytes(MAX_MESSAGE - 17))),),
        ((BINARY, b"FAULT"),),
    ),
)


#: Uvicorn's stock protocol (the ``uvicorn`` path: a reference, not what the broker
#: runs, which is ``uvicorn-fast``) fails a text message that is not UTF-8 with 1007
#: and no reason, and logs it as an error; gateway.transports.coalescing gives the
#: decoder's reason, as the Hypercorn paths do.
STOCK_UVICORN_SAYS_NOTHING = frozenset(
    case.name
    for case in CASES
    if case.closed is not None and case.closed.code == 1007 and case.name.startswith("6.")
)


def test_every_failure_names_its_reason() -> None:
    """A connection the server fails (not a close the client started) closes with a
    reason (RFC 6455 §7.1.6), and the table says which, so every path is held to it."""
    for case in CASES:
        if case.closed is not None and not case.closed.echo:
            assert case.closed.reason, case.name
    assert len(STOCK_UVICORN_SAYS_NOTHING) == 5


# --------------------------------------------------------------------------
# The client


class RawClient:
    """A WebSocket client on a blocking socket: exact bytes out, frames in."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5 * T)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                "GET /asbp HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        while b"\r\n\r\n" not in self.buffer:
            self._read()
        response, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        assert response.startswith(b"HTTP/1.1 101"), response

    def _read(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise EOFError(f"connection closed; unread: {self.buffer[:80]!r}")
        self.buffer += data

    def _take(self, size: int) -> bytes:
        while len(self.buffer) < size:
            self._read()
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def recv_frame(self) -> tuple[int, bytes]:
        """The next frame from the server: (opcode, payload); servers do not fragment here."""
        first, second = self._take(2)
        assert first & 0x70 == 0 and not second & 0x80, "reserved bits or a mask from a server"
        assert first & 0x80, "a fragment from the server"
        size = second & 0x7F
        if size == 126:
            (size,) = struct.unpack("!H", self._take(2))
        elif size == 127:
            (size,) = struct.unpack("!Q", self._take(8))
        return first & 0x0F, self._take(size)

    def send(self, data: bytes) -> None:
        with contextlib.suppress(OSError):  # a server that already failed may reset us
            self.sock.sendall(data)


class H2Client(RawClient):
    """The same client over HTTP/2 (RFC 8441): one extended CONNECT stream in the
    clear, with prior knowledge; the frames travel in the stream's DATA."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5 * T)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""
        self.ended = False
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.h2.initiate_connection()
        self.sock.sendall(self.h2.data_to_send())
        # RFC 8441 §3: the server must first allow the extended CONNECT.
        while not self.h2.remote_settings.enable_connect_protocol:
            self._read()
        self.stream_id = self.h2.get_next_available_stream_id()
        self.h2.send_headers(
            self.stream_id,
            [
                (b":method", b"CONNECT"),
                (b":protocol", b"websocket"),
                (b":scheme", b"http"),
                (b":path", b"/asbp"),
                (b":authority", b"127.0.0.1"),
                (b"sec-websocket-version", b"13"),
            ],
        )
        self.sock.sendall(self.h2.data_to_send())
        self.status: bytes | None = None
        while self.status is None:
            self._read()
        assert self.status == b"200", self.status

    def _read(self) -> None:
        if self.ended:
            raise EOFError(f"stream ended; unread: {self.buffer[:80]!r}")
        data = self.sock.recv(65536)
        if not data:
            raise EOFError(f"connection closed; unread: {self.buffer[:80]!r}")
        for event in self.h2.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                self.status = dict(event.headers)[b":status"]
            elif isinstance(event, h2.events.DataReceived):
                self.buffer += event.data
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(
                event,
                (h2.events.StreamEnded, h2.events.StreamReset, h2.events.ConnectionTerminated),
            ):
                self.ended = True
        self.sock.sendall(self.h2.data_to_send())

    def send(self, data: bytes) -> None:
        # In DATA frames as flow control allows; a server that failed the stream
        # may have ended or reset it, as one that failed a TCP connection resets it.
        with contextlib.suppress(OSError, EOFError, h2.exceptions.H2Error):
            while data:
                size = min(
                    len(data),
                    self.h2.local_flow_control_window(self.stream_id),
                    self.h2.max_outbound_frame_size,
                )
                if not size:
                    self._read()  # for a WINDOW_UPDATE
                    continue
                self.h2.send_data(self.stream_id, data[:size])
                data = data[size:]
                self.sock.sendall(self.h2.data_to_send())


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RunningServer]]:
    data_dir: Path = tmp_path_factory.mktemp("frames")
    with contextlib.ExitStack() as stack:
        running = {}
        for path in PATHS:
            if path == "hypercorn-h2":
                continue  # the same server: HTTP/1.1 and HTTP/2 on one port
            app = create_app(
                GatewayConfig(broker_id="frames", data_dir=data_dir / path, limits=LIMITS)
            )
            running[path] = stack.enter_context(
                serve_app(
                    app,
                    server="hypercorn" if path == "hypercorn" else "uvicorn",
                    uvicorn_ws="coalescing" if path == "uvicorn-fast" else "websockets-sansio",
                    max_message_bytes=MAX_MESSAGE,
                )
            )
        running["hypercorn-h2"] = running["hypercorn"]
        yield running


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_frames(servers: dict[str, RunningServer], path: str, case: Case) -> None:
    client = (H2Client if path == "hypercorn-h2" else RawClient)(servers[path].port)
    try:
        opcode, greeting = client.recv_frame()
        assert greeting.startswith(b"c=asbp.channel,"), greeting
        for segment in case.send:
            client.send(segment)
        for expected in case.replies:
            opcode, payload = client.recv_frame()
            if expected[1] == b"FAULT":
                assert (opcode, asbp.decode(payload).name) == (expected[0], "asbp.fault")
            else:
                assert (opcode, payload) == expected
        for segment in case.then:
            client.send(segment)
        if case.closed is None:
            # Still open: a closing handshake of our own, echoed.
            client.send(frame(CLOSE, close_payload(1000, b"done")))
            assert client.recv_frame() == (CLOSE, close_payload(1000, b"done"))
            return
        opcode, payload = client.recv_frame()
        assert opcode == CLOSE, (opcode, payload[:80])
        code = struct.unpack("!H", payload[:2])[0] if payload else 1005
        reason = payload[2:].decode()
        assert code == case.closed.code, reason
        if path == "uvicorn" and case.name in STOCK_UVICORN_SAYS_NOTHING:
            assert reason == ""
        elif case.closed.reason is not None:
            assert reason == case.closed.reason
    finally:
        client.sock.close()
