"""gateway.transports.hypercorn_ws: Hypercorn's WebSocket stream, failing as Uvicorn does.

Behind a real Hypercorn (tests.support installs the stream, as the broker's
server does) with real clients: the websockets client for what a client sees,
and a raw socket where a client must send what no library would. The frame
conformance table (test_frame_conformance.py) holds every close code and reason
on every server path; this file holds the stream's own parts: the version
guard, the shortcuts (RECEIVE_FRAMES, SEND_FRAME) and the path with an
extension, where wsproto reads every frame.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

import h2.config
import h2.connection
import h2.events
import hypercorn.protocol.h2
import hypercorn.protocol.h11
import pytest
from hypercorn.asyncio.run import worker_serve
from hypercorn.config import Config as HypercornConfig
from hypercorn.config import Sockets
from hypercorn.utils import wrap_app
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, ConnectionClosedOK

from gateway.transports import coalescing, hypercorn_ws
from gateway.transports.asgi import Receive, Scope, Send
from gateway.transports.hypercorn_ws import (
    AsbpWSStream,
    UnsupportedHypercorn,
    configure_compression,
    install,
    websockets_reason,
)
from gateway.transports.plain_frames import too_big_reason
from gateway.transports.websocket import RECEIVE_FRAMES, SEND_FRAME
from tests.support import T, serve_app_async

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@contextlib.asynccontextmanager
async def hypercorn_with_compression(app: Any, *, max_message_bytes: int) -> AsyncIterator[int]:
    """``app`` behind Hypercorn in this loop, accepting permessage-deflate (which the
    test servers, as the broker by default, decline); yields the port."""
    install()
    config = HypercornConfig()
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = 1.0
    config.websocket_max_message_size = max_message_bytes
    configure_compression(config, True)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    ready, stop = asyncio.Event(), asyncio.Event()

    async def shutdown_trigger() -> None:
        ready.set()  # called once the socket accepts connections
        await stop.wait()

    serving = asyncio.create_task(
        worker_serve(
            wrap_app(app, config.wsgi_max_body_size, "asgi"),
            config,
            sockets=Sockets(secure_sockets=[], insecure_sockets=[sock], quic_sockets=[]),
            shutdown_trigger=shutdown_trigger,
        )
    )
    try:
        await asyncio.wait_for(ready.wait(), 5 * T)
        yield sock.getsockname()[1]
    finally:
        stop.set()
        await serving
        sock.close()


def test_install_refuses_a_hypercorn_it_does_not_know() -> None:
    with pytest.raises(UnsupportedHypercorn, match=r"Hypercorn 0\.19\.0 is not one"):
        install("0.19.0")
    with pytest.raises(UnsupportedHypercorn):
        install("0.17.2")


def test_install_puts_the_stream_where_hypercorn_looks_for_it() -> None:
    install()
    assert hypercorn.protocol.h11.WSStream is AsbpWSStream  # type: ignore[attr-defined]
    assert hypercorn.protocol.h2.WSStream is AsbpWSStream  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("wsproto", "websockets"),
    [
        ("Invalid opcode 0x3", "invalid opcode"),
        ("expected CONTINUATION, got <Opcode.TEXT: 1>", "expected a continuation frame"),
        ("CLOSE with unknown reserved code", "invalid status code"),
        (
            "'utf-8' codec can't decode byte 0x80 in position 3: invalid start byte",
            "invalid start byte",
        ),
        (
            "Error decoding CLOSE reason: 'utf-8' codec can't decode byte 0xed in position 11:"
            " invalid continuation byte",
            "invalid continuation byte at position 11",
        ),
        ("something wsproto may say one day", "something wsproto may say one day"),
    ],
)
def test_wsproto_reasons_in_websockets_words(wsproto: str, websockets: str) -> None:
    assert websockets_reason(wsproto) == websockets


def test_too_big_reason_is_websockets_own() -> None:
    from websockets.exceptions import PayloadTooBig

    assert too_big_reason(11, 10, None) == str(PayloadTooBig(11, 10))
    fragment = PayloadTooBig(6, 10 - 5)
    fragment.set_current_size(5)
    assert too_big_reason(6, 10, 5) == str(fragment)


async def test_send_frame_writes_binary_and_text_messages_in_order_with_asgi_sends() -> None:
    offered: list[bool] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        send_frame = scope["extensions"][SEND_FRAME]
        for n in range(100):
            offered.append(send_frame(b"%d" % n, n % 2 == 1))
        await send({"type": "websocket.send", "bytes": b"through ASGI"})
        offered.append(send_frame(b"x" * 70_000, False))  # a 64-bit length
        # Declined: what is gathered is over the socket's high-water mark, so the
        # message goes through ASGI, which waits for room, as the broker does.
        offered.append(send_frame(b"y" * 300, False))
        await send({"type": "websocket.send", "bytes": b"y" * 300})
        offered.append(send_frame(b"z" * 300, False))  # a 16-bit length, room again
        await send({"type": "websocket.close", "code": 1000})
        offered.append(send_frame(b"too late", False))

    async with serve_app_async(app) as running:
        async with asyncio.timeout(5 * T):
            async with connect(running.ws_url, compression=None, max_size=None) as client:
                messages = [await client.recv() for _ in range(104)]
                with pytest.raises(ConnectionClosedOK):
                    await client.recv()
    expected: list[str | bytes] = [str(n) if n % 2 else b"%d" % n for n in range(100)]
    assert messages == [*expected, b"through ASGI", b"x" * 70_000, b"y" * 300, b"z" * 300]
    assert offered == [*[True] * 101, False, True, False]


async def test_send_frame_declines_while_the_socket_is_backed_up() -> None:
    """A reader that does not read fills the transport's buffer: send_frame declines,
    as Hypercorn's send would wait; once the reader reads, everything arrives in order."""
    sent: list[bytes] = []
    declined = threading.Event()
    chunk = 256 * 1024

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        send_frame = scope["extensions"][SEND_FRAME]
        for n in range(1000):  # bounded: a buffer that never fills fails the test
            frame = bytes([n % 256]) * chunk
            if not send_frame(frame, False):
                declined.set()
                await send({"type": "websocket.send", "bytes": frame})  # waits for room
                sent.append(frame)
                break
            sent.append(frame)
            await asyncio.sleep(0)  # a loop turn: the gathered frame reaches the transport
        await send({"type": "websocket.close", "code": 1000})

    async with serve_app_async(app) as running:
        async with asyncio.timeout(5 * T):
            async with connect(
                running.ws_url, compression=None, max_size=None, max_queue=1
            ) as client:
                await asyncio.to_thread(declined.wait, 5 * T)
                # Read to the close, not len(sent) frames: the frame that waited for
                # room joins ``sent`` only once these reads made room for it.
                received: list[bytes] = []
                with pytest.raises(ConnectionClosedOK):
                    while True:
                        message = await client.recv()
                        assert isinstance(message, bytes)
                        received.append(message)
    assert declined.is_set()
    assert len(sent) > 1
    assert received == sent


async def test_received_frames_reach_the_handler_or_the_queue_in_order() -> None:
    """Plain messages go to the RECEIVE_FRAMES handler; a ping and a fragmented message
    go through wsproto and Hypercorn's queue; the application sees every message once,
    in the order sent, and the ping is answered."""
    seen: list[tuple[str, bytes]] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        done = asyncio.Event()

        def got(path: str, payload: bytes) -> None:
            if payload == b"done":
                done.set()
            else:
                seen.append((path, payload))

        async def echo() -> None:
            await done.wait()
            await send({"type": "websocket.send", "bytes": b"|".join(p for _, p in seen)})

        echoing = asyncio.create_task(echo())
        handle = scope["extensions"][RECEIVE_FRAMES]
        assert handle(lambda payload, text: got("handler", payload + b" (text)" * text))
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                break
            data = message.get("bytes")
            got("receive", data if data is not None else message["text"].encode() + b" (text)")
        handle(None)
        await echoing

    async with serve_app_async(app) as running:
        async with asyncio.timeout(5 * T):
            async with connect(running.ws_url, compression=None) as client:
                await client.send(b"one")
                await (await client.ping(b"are you there"))  # answered through wsproto
                await client.send("two")
                await client.send([b"three-", b"fragmented"])  # continuation frames
                await client.send(b"four")
                await client.send(b"done")
                echoed = await client.recv()
    expected = [b"one", b"two (text)", b"three-fragmented", b"four"]
    assert echoed == b"|".join(expected)
    assert [payload for _, payload in seen] == expected
    assert ("handler", b"one") in seen  # the plain path was taken
    assert ("receive", b"three-fragmented") in seen  # and wsproto's


async def test_without_a_handler_plain_messages_are_queued_in_order() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        got = [await receive() for _ in range(3)]
        reply = b"|".join(m["bytes"] if m["bytes"] is not None else m["text"].encode() for m in got)
        await send({"type": "websocket.send", "bytes": reply})
        await send({"type": "websocket.close", "code": 1000})

    async with serve_app_async(app) as running:
        async with asyncio.timeout(5 * T):
            async with connect(running.ws_url, compression=None) as client:
                for message in (b"a", "b", b"c"):
                    await client.send(message)
                assert await client.recv() == b"a|b|c"


async def test_a_handler_that_fails_ends_the_connection(caplog: pytest.LogCaptureFixture) -> None:
    """As an application that fails: logged, and the connection ended."""
    ended = threading.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})

        def handler(payload: bytes, text: bool) -> None:
            raise RuntimeError(f"cannot take {payload!r}")

        scope["extensions"][RECEIVE_FRAMES](handler)
        assert (await receive())["type"] == "websocket.disconnect"
        ended.set()

    async with serve_app_async(app) as running:
        async with asyncio.timeout(5 * T):
            async with connect(running.ws_url, compression=None) as client:
                await client.send(b"boom")
                with pytest.raises(ConnectionClosed):
                    await client.recv()
            await asyncio.to_thread(ended.wait, 5 * T)
    assert ended.is_set()
    assert "cannot take b'boom'" in caplog.text


async def test_with_compression_there_are_no_shortcuts_and_wsproto_reads() -> None:
    offered: list[object] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        offered.extend(key for key in (SEND_FRAME, RECEIVE_FRAMES) if key in scope["extensions"])
        message = await receive()
        await send({"type": "websocket.send", "bytes": message["bytes"]})
        await send({"type": "websocket.close", "code": 1000})

    async with hypercorn_with_compression(app, max_message_bytes=2**20) as port:
        async with asyncio.timeout(5 * T):
            async with connect(f"ws://127.0.0.1:{port}/", compression="deflate") as client:
                assert client.response is not None
                assert "permessage-deflate" in client.response.headers["Sec-WebSocket-Extensions"]
                await client.send(b"squeezed " * 100)
                assert await client.recv() == b"squeezed " * 100
    assert offered == []  # a plain frame would break the deflate stream


async def test_compression_off_declines_the_offer_and_keeps_the_shortcuts() -> None:
    """The broker's default (websocket_compression = false), as the test servers have
    it: a client that offers permessage-deflate, as every browser does, gets none."""
    offered: list[object] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        offered.extend(key for key in (SEND_FRAME, RECEIVE_FRAMES) if key in scope["extensions"])
        message = await receive()
        await send({"type": "websocket.send", "bytes": message["bytes"]})
        await send({"type": "websocket.close", "code": 1000})

    async with serve_app_async(app) as running:
        async with asyncio.timeout(5 * T):
            async with connect(running.ws_url, compression="deflate") as client:
                assert client.response is not None
                assert "Sec-WebSocket-Extensions" not in client.response.headers
                await client.send(b"plain")
                assert await client.recv() == b"plain"
    assert offered == [SEND_FRAME, RECEIVE_FRAMES]


# -- failing, on the path where wsproto reads everything (an extension offered)


def client_frame(opcode: int, payload: bytes, *, rsv: int = 0) -> bytes:
    """One masked, final client frame."""
    size = len(payload)
    head = bytearray([0x80 | rsv << 4 | opcode])
    if size < 126:
        head.append(0x80 | size)
    elif size < 65536:
        head += bytes([0x80 | 126]) + struct.pack("!H", size)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", size)
    key = os.urandom(4)
    return bytes(head) + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def deflate_client(port: int) -> tuple[socket.socket, bytes]:
    """A raw client that offers permessage-deflate; the socket and what followed the 101."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5 * T)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Extensions: permessage-deflate\r\n\r\n"
        ).encode()
    )
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    response, _, rest = data.partition(b"\r\n\r\n")
    assert response.startswith(b"HTTP/1.1 101"), response
    assert b"permessage-deflate" in response.lower()
    return sock, rest


def close_frame_then_end(sock: socket.socket, data: bytes) -> tuple[int, str]:
    """Read the server's close frame and then the end of the connection."""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    assert data[0] == 0x88, data[:16]  # FIN and CLOSE, unmasked, short
    size = data[1]
    payload = data[2 : 2 + size]
    assert len(data) == 2 + size, "the connection ends after the close frame"
    return struct.unpack("!H", payload[:2])[0], payload[2:].decode()


async def echo_app(scope: Scope, receive: Receive, send: Send) -> None:
    assert (await receive())["type"] == "websocket.connect"
    await send({"type": "websocket.accept"})
    while (message := await receive())["type"] == "websocket.receive":
        await send({"type": "websocket.send", "bytes": message["bytes"]})


@pytest.mark.parametrize(
    ("frame", "code", "reason"),
    [
        (client_frame(0x3, b"x"), 1002, "invalid opcode"),
        (client_frame(0x1, b"\xff"), 1007, "invalid start byte"),
        (client_frame(0x2, bytes(1025)), 1009, "frame exceeds limit of 1024 bytes"),
    ],
    ids=["1002", "1007", "1009"],
)
async def test_with_an_extension_a_failed_connection_gets_its_close_frame(
    frame: bytes, code: int, reason: str
) -> None:
    async with hypercorn_with_compression(echo_app, max_message_bytes=1024) as port:
        sock, rest = await asyncio.to_thread(deflate_client, port)
        try:
            sock.sendall(frame)
            closed = await asyncio.to_thread(close_frame_then_end, sock, rest)
        finally:
            sock.close()
    assert closed == (code, reason)


# -- HTTP/2: a failed stream does not take the connection's other streams with it


def h2_streams_after_a_failure(port: int) -> tuple[tuple[int, str], bytes, bool]:
    """Two WebSockets on one HTTP/2 connection (RFC 8441); the first sends a message
    over the limit in several DATA frames at once, then the second sends one message.

    Returns the first stream's close (code, reason), the second's echo, and whether
    the first stream was ended by the server (END_STREAM).
    """
    sock = socket.create_connection(("127.0.0.1", port), timeout=5 * T)
    conn = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding=None)
    )
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    received: dict[int, bytes] = {}
    ended: set[int] = set()
    statuses: dict[int, bytes] = {}

    def read() -> None:
        data = sock.recv(65536)
        assert data, "the server closed the connection"
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                statuses[event.stream_id] = dict(event.headers)[b":status"]
            elif isinstance(event, h2.events.DataReceived):
                received[event.stream_id] = received.get(event.stream_id, b"") + event.data
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
                ended.add(event.stream_id)
            elif isinstance(event, h2.events.ConnectionTerminated):
                raise AssertionError("the server ended the whole connection")
        sock.sendall(conn.data_to_send())

    try:
        while not conn.remote_settings.enable_connect_protocol:
            read()
        streams = []
        for _ in range(2):
            stream_id = conn.get_next_available_stream_id()
            conn.send_headers(
                stream_id,
                [
                    (b":method", b"CONNECT"),
                    (b":protocol", b"websocket"),
                    (b":scheme", b"http"),
                    (b":path", b"/"),
                    (b":authority", b"127.0.0.1"),
                    (b"sec-websocket-version", b"13"),
                ],
            )
            streams.append(stream_id)
        sock.sendall(conn.data_to_send())
        while len(statuses) < 2:
            read()
        assert set(statuses.values()) == {b"200"}
        failing, other = streams
        oversized = client_frame(0x2, bytes(3000))
        for start in range(0, len(oversized), 500):  # DATA frames, all in one write
            conn.send_data(failing, oversized[start : start + 500])
        conn.send_data(other, client_frame(0x2, b"still here"))
        sock.sendall(conn.data_to_send())
        while not received.get(failing) or len(received.get(other, b"")) < 12:
            read()
        close = received[failing]
        assert close[0] == 0x88, close[:16]
        code, reason = struct.unpack("!H", close[2:4])[0], close[4 : 2 + close[1]].decode()
        was_ended = failing in ended
        # The client ends its side of the failed stream (the server lets it go then);
        # the connection and its other stream carry on.
        conn.end_stream(failing)
        conn.send_data(other, client_frame(0x2, b"and still"))
        sock.sendall(conn.data_to_send())
        while len(received[other]) < 12 + 11:
            read()
        return (code, reason), received[other][2:12] + received[other][14:], was_ended
    finally:
        sock.close()


async def test_over_http2_a_failed_stream_leaves_the_others_open() -> None:
    async with serve_app_async(echo_app, max_message_bytes=1024) as running:
        closed, echoed, ended = await asyncio.to_thread(h2_streams_after_a_failure, running.port)
    assert closed == (1009, "frame with 3000 bytes exceeds limit of 1024 bytes")
    assert echoed == b"still hereand still"
    assert ended


# -- a refused message: the server waits for the client's close frame


def refuse_one_message(port: int, *, echo: bool, close_behind: bool = False) -> tuple[bytes, float]:
    """Send a message over the limit (1024 bytes) whole, read the 1009 close frame,
    answer it (``echo``) or not, and wait for the server to end the connection.

    Returns the close frame's payload and the seconds from the close frame to the end.
    """
    sock = socket.create_connection(("127.0.0.1", port), timeout=30 * T)
    try:
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall(
            (
                "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade"
                f"\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        assert data.startswith(b"HTTP/1.1 101"), data
        data = data.partition(b"\r\n\r\n")[2]
        # With ``close_behind`` the client's close frame follows the message in the
        # same write: the server finds it in what it has already read.
        behind = client_frame(0x8, struct.pack("!H", 1000)) if close_behind else b""
        sock.sendall(client_frame(0x2, bytes(3000)) + behind)
        while len(data) < 2 or len(data) < 2 + data[1]:
            data += sock.recv(65536)
        assert data[0] == 0x88, data[:16]
        payload = data[2 : 2 + data[1]]
        closed_at = time.monotonic()
        if echo:
            sock.sendall(client_frame(0x8, payload[:2]))
        while sock.recv(65536):
            pass
        return payload, time.monotonic() - closed_at
    finally:
        sock.close()


@pytest.mark.parametrize("server", ["hypercorn", "uvicorn"])
async def test_a_refused_message_ends_once_the_client_answers_the_close(
    server: Literal["hypercorn", "uvicorn"], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server reads on after refusing a message, dropping it, and ends the
    connection as soon as the client's close frame arrives: closing it with the
    message unread made the kernel reset it, and a browser then lost the close
    frame (1006, no reason; tests/browser/test_close_codes.py)."""
    # Far longer than the test waits: the end must come from the client's answer.
    monkeypatch.setattr(hypercorn_ws, "CLOSE_TIMEOUT", 600.0)
    monkeypatch.setattr(coalescing, "CLOSE_TIMEOUT", 600.0)
    async with serve_app_async(echo_app, server=server, max_message_bytes=1024) as running:
        payload, _ = await asyncio.to_thread(refuse_one_message, running.port, echo=True)
    reason = "frame with 3000 bytes exceeds limit of 1024 bytes"
    assert payload == struct.pack("!H", 1009) + reason.encode()


@pytest.mark.parametrize("server", ["hypercorn", "uvicorn"])
async def test_a_refused_message_with_the_close_frame_behind_it_ends_at_once(
    server: Literal["hypercorn", "uvicorn"], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Far longer than the test waits: the end must come from the close frame read.
    monkeypatch.setattr(hypercorn_ws, "CLOSE_TIMEOUT", 600.0)
    monkeypatch.setattr(coalescing, "CLOSE_TIMEOUT", 600.0)
    async with serve_app_async(echo_app, server=server, max_message_bytes=1024) as running:
        payload, _ = await asyncio.to_thread(
            refuse_one_message, running.port, echo=False, close_behind=True
        )
    assert payload[:2] == struct.pack("!H", 1009)


@pytest.mark.parametrize("server", ["hypercorn", "uvicorn"])
async def test_a_refused_message_ends_after_the_close_timeout_without_an_answer(
    server: Literal["hypercorn", "uvicorn"], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hypercorn_ws, "CLOSE_TIMEOUT", 0.2)
    monkeypatch.setattr(coalescing, "CLOSE_TIMEOUT", 0.2)
    async with serve_app_async(echo_app, server=server, max_message_bytes=1024) as running:
        payload, waited = await asyncio.to_thread(refuse_one_message, running.port, echo=False)
    assert payload[:2] == struct.pack("!H", 1009)
    assert waited >= 0.2 * 0.9  # not before the timeout (monotonic clocks, rounding)
