"""RFC 6455 at the frame level, the same on every server path the broker ships.

One table of cases, modelled on the Autobahn TestSuite's sections 1-7 and 9
(framing, pings and pongs, reserved bits, opcodes, fragmentation, UTF-8,
closing, limits), each written here as the exact bytes a client sends after the
opening handshake and what the server must answer: the frames it sends back,
and then either nothing more (the connection stays open, which the case checks
with a closing handshake of its own) or a close frame with a given code.

Every case runs against each server path:

* ``hypercorn``: Hypercorn and wsproto;
* ``uvicorn``: Uvicorn's own ``websockets-sansio`` protocol (websockets);
* ``uvicorn-fast``: Uvicorn with gateway.transports.coalescing, whose reader
  parses plain messages itself and hands everything else to websockets
  (the broker's default on Uvicorn).

Behind each is the real broker on its Channel endpoint ``/asbp``: a message is
an ASBP ``asbp.ping``, answered with ``asbp.pong`` and the same body, as text
if it came as text. The client is a raw socket writing exact bytes
(``TCP_NODELAY``, one ``send`` per listed segment: the server may still read
segments together, never apart), so nothing in between rewrites a frame.

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

PATHS = ("hypercorn", "uvicorn", "uvicorn-fast")

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
    #: The close frame must give a reason (RFC 6455 §7.1.6: for the peer's log).
    reason: bool = False
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
        closed=Closed(1002),
    ),
    # 2. Pings and pongs.
    Case("2.1 ping, no payload", (frame(PING),), ((PONG, b""),)),
    Case("2.2 ping, 125 bytes", (frame(PING, b"p" * 125),), ((PONG, b"p" * 125),)),
    Case("2.3 ping, binary payload", (frame(PING, bytes(range(32))),), ((PONG, bytes(range(32))),)),
    Case(
        "2.4 ping, 126 bytes: too long for a control frame",
        (frame(PING, b"p" * 126),),
        closed=Closed(1002),
    ),
    Case(
        "2.5 unsolicited pong",
        (frame(PONG, b"unasked"), frame(BINARY, ping_command(1))),
        ((BINARY, pong_command(1)),),
    ),
    Case("2.6 pong, 126 bytes", (frame(PONG, b"p" * 126),), closed=Closed(1002)),
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
            closed=Closed(1002),
        )
        for rsv in range(1, 8)
    ),
    Case(
        "3.8 RSV set after a valid message",
        (frame(BINARY, ping_command(1)),),
        ((BINARY, pong_command(1)),),
        Closed(1002),
        then=(frame(BINARY, ping_command(2), rsv=2),),
    ),
    Case("3.9 RSV set on a ping", (frame(PING, b"x", rsv=4),), closed=Closed(1002)),
    # 4. Opcodes.
    *(
        Case(
            f"4.1.{opcode} reserved data opcode {opcode}",
            (frame(opcode, b"x"),),
            closed=Closed(1002),
        )
        for opcode in range(3, 8)
    ),
    *(
        Case(
            f"4.2.{opcode} reserved control opcode {opcode}",
            (frame(opcode, b"x"),),
            closed=Closed(1002),
        )
        for opcode in range(0xB, 0x10)
    ),
    Case(
        "4.3 reserved opcode after a valid message",
        (frame(BINARY, ping_command(1)),),
        ((BINARY, pong_command(1)),),
        Closed(1002),
        then=(frame(5, b"x"),),
    ),
    # 5. Fragmentation.
    Case(
        "5.1 ping fragmented",
        (frame(PING, b"a", fin=False), frame(CONT, b"b")),
        closed=Closed(1002),
    ),
    Case(
        "5.2 pong fragmented",
        (frame(PONG, b"a", fin=False), frame(CONT, b"b")),
        closed=Closed(1002),
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
    Case("5.8 a continuation with nothing to continue", (frame(CONT, b"x"),), closed=Closed(1002)),
    Case(
        "5.9 a final continuation with nothing to continue",
        (frame(CONT, b"x", fin=False),),
        closed=Closed(1002),
    ),
    Case(
        "5.10 a new message inside a fragmented one",
        (frame(TEXT, b"c=asbp.pi", fin=False), frame(TEXT, ping_command(1))),
        closed=Closed(1002),
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
        closed=Closed(1007),
    ),
    Case(
        "6.4 invalid UTF-8 (a lone continuation byte)", (frame(TEXT, b"\x80"),), closed=Closed(1007)
    ),
    Case(
        "6.5 invalid UTF-8 across fragments",
        (frame(TEXT, ping_command(4, b"\xce"), fin=False), frame(CONT, b"\xff")),
        closed=Closed(1007),
    ),
    Case(
        "6.6 invalid UTF-8 in a middle fragment",
        (
            frame(TEXT, ping_command(5), fin=False),
            frame(CONT, b"\xed\xa0\x80", fin=False),
            frame(CONT, b"ok"),
        ),
        closed=Closed(1007),
    ),
    Case(
        "6.7 a truncated code point at the end",
        (frame(TEXT, ping_command(6, UTF8[:3]), fin=False), frame(CONT, b"")),
        closed=Closed(1007),
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
    Case("7.4 close, 1-byte payload", (frame(CLOSE, b"\x03"),), closed=Closed(1002)),
    Case(
        "7.5 close, reason of 123 bytes",
        (frame(CLOSE, close_payload(1000, b"r" * 123)),),
        closed=Closed(1000, echo=True),
    ),
    Case(
        "7.6 close, payload of 126 bytes",
        (frame(CLOSE, close_payload(1000, b"r" * 124)),),
        closed=Closed(1002),
    ),
    Case(
        "7.7 close, reason not UTF-8",
        (frame(CLOSE, close_payload(1000, INVALID_UTF8)),),
        closed=Closed(1007),
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
        "7.9 close fragmented", (frame(CLOSE, close_payload(1000), fin=False),), closed=Closed(1002)
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
            closed=Closed(1002),
        )
        for code in (0, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000, 65535)
    ),
    # 9. Limits: the servers read messages of MAX_MESSAGE bytes at most.
    Case(
        "9.1 a frame one byte over the limit",
        (frame(BINARY, bytes(HUGE)),),
        closed=Closed(1009, reason=True),
    ),
    Case(
        "9.2 a text frame one byte over the limit",
        (frame(TEXT, b"a" * HUGE),),
        closed=Closed(1009, reason=True),
    ),
    Case(
        "9.3 fragments adding up to one byte over the limit",
        (
            frame(BINARY, bytes(MAX_MESSAGE // 2), fin=False),
            frame(CONT, bytes(MAX_MESSAGE // 2 + 1)),
        ),
        closed=Closed(1009, reason=True),
    ),
    Case(
        "9.4 a frame announcing 2**62 bytes",
        (frame(BINARY, b"", length=2**62), bytes(HUGE)),
        closed=Closed(1009, reason=True),
    ),
    Case(
        "9.5 a message at the limit reaches the broker (ASBP fault 1101, still open)",
        (frame(BINARY, ping_command(9, bytes(MAX_MESSAGE - 17))),),
        ((BINARY, b"FAULT"),),
    ),
)


#: Where Hypercorn departs from the table, asserted as it is, so that a fix shows.
#: The broker cannot change either: Hypercorn builds its WebSocket stream
#: (hypercorn.protocol.ws_stream.WSStream) itself, with no hook to replace it.
#:
#: On a protocol error (1002) or invalid UTF-8 (1007), wsproto yields a
#: CloseConnection event with the code, but WSStream answers only a close the
#: client started: it ends the connection with no close frame. RFC 6455
#: §7.1.7 says an endpoint SHOULD send one first; the client sees 1006.
HYPERCORN_FAILS_WITHOUT_CLOSE_FRAME = frozenset({1002, 1007})
#: Hypercorn's own size check closes with 1009 and no reason (the uvicorn
#: paths say "frame with N bytes exceeds limit of M bytes").
HYPERCORN_1009_HAS_NO_REASON = True


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


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RunningServer]]:
    data_dir: Path = tmp_path_factory.mktemp("frames")
    with contextlib.ExitStack() as stack:
        running = {}
        for path in PATHS:
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
        yield running


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_frames(servers: dict[str, RunningServer], path: str, case: Case) -> None:
    client = RawClient(servers[path].port)
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
        if (
            path == "hypercorn"
            and not case.closed.echo
            and case.closed.code in HYPERCORN_FAILS_WITHOUT_CLOSE_FRAME
        ):
            with pytest.raises((EOFError, ConnectionResetError)):
                client.recv_frame()  # the connection ends, with no close frame
            return
        opcode, payload = client.recv_frame()
        assert opcode == CLOSE, (opcode, payload[:80])
        code = struct.unpack("!H", payload[:2])[0] if payload else 1005
        reason = payload[2:]
        assert code == case.closed.code, reason
        if case.closed.reason and path != "hypercorn":  # see HYPERCORN_1009_HAS_NO_REASON
            assert reason, "a close without a reason"
        elif case.closed.reason:
            assert reason == b""
    finally:
        client.sock.close()
