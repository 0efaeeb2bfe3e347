"""gateway.transports.coalescing: one write per loop turn, in order, nothing lost or late.

The transport is tested on a real socket pair: before its flush runs, the peer
has nothing; after it, the peer has every byte in order. The protocol is tested
behind a real Uvicorn, with a real WebSocket client, and so is its SEND_FRAME
shortcut: the frames it writes are read by that client as any others, and it
declines wherever Uvicorn's own send would wait or do more.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, ConnectionClosedOK

from gateway.transports.asgi import Receive, Scope, Send
from gateway.transports.coalescing import CoalescingTransport, CoalescingWebSocketProtocol
from gateway.transports.websocket import RECEIVE_FRAMES, SEND_FRAME
from tests.support import T

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the transport is asyncio's


async def next_turn() -> None:
    """Return after every callback scheduled so far (call_soon runs them in order)."""
    turned: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(turned.set_result, None)
    await turned


@contextlib.asynccontextmanager
async def socket_pair() -> AsyncIterator[tuple[CoalescingTransport, socket.socket]]:
    """A coalescing transport on one end of a socket pair, and the other end (non-blocking)."""
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_connection(asyncio.Protocol, sock=ours)
    assert isinstance(transport, asyncio.Transport)
    try:
        yield CoalescingTransport(transport, loop), theirs
    finally:
        transport.abort()
        theirs.close()


def received(peer: socket.socket) -> bytes:
    """What ``peer`` has been sent so far, without waiting."""
    try:
        return peer.recv(65536)
    except BlockingIOError:
        return b""


async def test_writes_of_one_turn_leave_together_in_order() -> None:
    async with socket_pair() as (transport, peer):
        for chunk in (b"one,", b"two,", b"three"):
            transport.write(chunk)
        assert transport.get_write_buffer_size() == len(b"one,two,three")
        assert received(peer) == b""  # gathered, not written yet

        await next_turn()

        assert received(peer) == b"one,two,three"
        transport.writelines([b"four,", b"five"])
        await next_turn()
        assert received(peer) == b"four,five"


async def test_a_deferred_flush_takes_what_the_next_turn_writes_too() -> None:
    """The handshake's 101 waits one turn, so that the greeting, written by a task
    the application starts in the same turn, leaves with it in one write."""
    async with socket_pair() as (transport, peer):
        sent_before_greeting = []

        def greet() -> None:  # the writer task's first step, queued after the flush
            sent_before_greeting.append(received(peer))
            transport.write(b"greeting")

        transport.defer_flush()
        transport.write(b"101,")
        asyncio.get_running_loop().call_soon(greet)
        await next_turn()
        await next_turn()
        assert sent_before_greeting == [b""]  # the 101 waited for the greeting
        assert received(peer) == b"101,greeting"
        transport.write(b"then as before")  # deferred once only
        await next_turn()
        assert received(peer) == b"then as before"


async def test_close_writes_what_was_gathered_first() -> None:
    async with socket_pair() as (transport, peer):
        transport.write(b"last words")
        transport.close()
        await next_turn()
        assert received(peer) == b"last words"
        assert transport.is_closing()


async def test_abort_drops_what_was_gathered() -> None:
    async with socket_pair() as (transport, peer):
        transport.write(b"never sent")
        transport.abort()
        await next_turn()
        assert received(peer) == b""  # end of stream, nothing before it
        assert transport.get_write_buffer_size() == 0


async def burst(scope: Scope, receive: Receive, send: Send) -> None:
    """Accept, send 100 messages in one loop turn, close."""
    assert scope["type"] == "websocket"
    assert (await receive())["type"] == "websocket.connect"
    await send({"type": "websocket.accept"})
    for n in range(100):
        await send({"type": "websocket.send", "bytes": b"%d" % n})
    await send({"type": "websocket.close", "code": 1000})


async def test_behind_uvicorn_every_message_arrives_in_order_then_the_close() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()  # a client that connects first waits in the backlog: no race
    port = listener.getsockname()[1]
    config = uvicorn.Config(
        burst, ws=CoalescingWebSocketProtocol, lifespan="off", log_config=None, access_log=False
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        async with asyncio.timeout(5 * T):
            async with connect(f"ws://127.0.0.1:{port}/") as client:
                messages = [await client.recv() for _ in range(100)]
                with pytest.raises(ConnectionClosedOK):
                    await client.recv()
        assert messages == [b"%d" % n for n in range(100)]
    finally:
        server.should_exit = True
        await serving
        listener.close()


async def serve(
    app: Any, protocol: type[CoalescingWebSocketProtocol] = CoalescingWebSocketProtocol
) -> tuple[uvicorn.Server, asyncio.Task[None], socket.socket]:
    """``app`` behind Uvicorn with the coalescing protocol, on a listening socket."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()  # a client that connects first waits in the backlog: no race
    config = uvicorn.Config(app, ws=protocol, lifespan="off", log_config=None, access_log=False)
    server = uvicorn.Server(config)
    return server, asyncio.create_task(server.serve(sockets=[listener])), listener


async def test_send_frame_writes_binary_and_text_messages_in_order_with_asgi_sends() -> None:
    offered: list[bool] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert (await receive())["type"] == "websocket.connect"
        send_frame = scope["extensions"][SEND_FRAME]
        offered.append(send_frame(b"too early", False))  # before the handshake: declined
        await send({"type": "websocket.accept"})
        for n in range(100):
            offered.append(send_frame(b"%d" % n, n % 2 == 1))
        await send({"type": "websocket.send", "bytes": b"through ASGI"})
        offered.append(send_frame(b"x" * 70_000, False))  # a 64-bit length
        offered.append(send_frame(b"y" * 300, False))  # a 16-bit length
        await send({"type": "websocket.close", "code": 1000})
        offered.append(send_frame(b"too late", False))

    server, serving, listener = await serve(app)
    try:
        async with asyncio.timeout(5 * T):
            url = f"ws://127.0.0.1:{listener.getsockname()[1]}/"
            async with connect(url, compression=None, max_size=None) as client:
                messages = [await client.recv() for _ in range(103)]
                with pytest.raises(ConnectionClosedOK):
                    await client.recv()
        expected: list[str | bytes] = [str(n) if n % 2 else b"%d" % n for n in range(100)]
        assert messages == [*expected, b"through ASGI", b"x" * 70_000, b"y" * 300]
        assert offered == [False, *[True] * 102, False]
    finally:
        server.should_exit = True
        await serving
        listener.close()


async def test_send_frame_declines_with_compression_negotiated() -> None:
    offered: list[bool] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        offered.append(scope["extensions"][SEND_FRAME](b"plain", False))
        await send({"type": "websocket.send", "bytes": b"compressed"})
        await send({"type": "websocket.close", "code": 1000})

    server, serving, listener = await serve(app)
    try:
        async with asyncio.timeout(5 * T):
            url = f"ws://127.0.0.1:{listener.getsockname()[1]}/"
            async with connect(url, compression="deflate") as client:
                assert await client.recv() == b"compressed"
        assert offered == [False]  # a plain frame would have broken the deflate stream
    finally:
        server.should_exit = True
        await serving
        listener.close()


async def test_send_frame_declines_while_the_transport_is_paused() -> None:
    """A reader that does not read pauses the transport: send_frame declines, as the
    ASGI send would wait; once the reader reads, everything arrives in order."""
    sent: list[bytes] = []
    paused = asyncio.Event()
    chunk = 256 * 1024

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        send_frame = scope["extensions"][SEND_FRAME]
        for n in range(1000):  # bounded: a transport that never pauses fails the test
            frame = bytes([n % 256]) * chunk
            if not send_frame(frame, False):
                paused.set()
                await send({"type": "websocket.send", "bytes": frame})  # waits for room
                sent.append(frame)
                break
            sent.append(frame)
            await next_turn()  # let the gathered frame reach the real transport
        await send({"type": "websocket.close", "code": 1000})

    server, serving, listener = await serve(app)
    try:
        async with asyncio.timeout(5 * T):
            url = f"ws://127.0.0.1:{listener.getsockname()[1]}/"
            async with connect(url, compression=None, max_size=None, max_queue=1) as client:
                await paused.wait()
                received = [await client.recv() for _ in sent]
                with pytest.raises(ConnectionClosedOK):
                    await client.recv()
        assert len(sent) > 1
        assert received == sent
    finally:
        server.should_exit = True
        await serving
        listener.close()


async def test_received_frames_reach_the_handler_or_the_queue_in_order() -> None:
    """Plain messages go to the RECEIVE_FRAMES handler; a ping, a fragmented message
    and what follows them go through websockets and the ASGI queue; the application
    sees every message once, in the order sent, and a ping is still answered."""
    seen: list[tuple[str, bytes]] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        done = asyncio.Event()

        def got(path: str, payload: bytes) -> None:
            if payload == b"done":  # by either path: the last message
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

    server, serving, listener = await serve(app)
    try:
        async with asyncio.timeout(5 * T):
            url = f"ws://127.0.0.1:{listener.getsockname()[1]}/"
            async with connect(url, compression=None) as client:
                await client.send(b"one")
                await (await client.ping(b"are you there"))  # answered by websockets
                await client.send("two")
                await client.send([b"three-", b"fragmented"])  # continuation frames
                await client.send(b"four")
                await client.send(b"done")
                echoed = await client.recv()
        expected = [b"one", b"two (text)", b"three-fragmented", b"four"]
        assert echoed == b"|".join(expected)
        assert [payload for _, payload in seen] == expected
        assert ("handler", b"one") in seen  # the plain path was taken
        assert ("receive", b"three-fragmented") in seen  # and websockets' path
    finally:
        server.should_exit = True
        await serving
        listener.close()


async def test_a_handler_that_fails_ends_the_connection(caplog: pytest.LogCaptureFixture) -> None:
    """As an application that fails in its receive loop: logged, and the socket closed."""
    ended = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})

        def handler(payload: bytes, text: bool) -> None:
            raise RuntimeError(f"cannot take {payload!r}")

        scope["extensions"][RECEIVE_FRAMES](handler)
        assert (await receive())["type"] == "websocket.disconnect"
        ended.set()

    server, serving, listener = await serve(app)
    try:
        async with asyncio.timeout(5 * T):
            url = f"ws://127.0.0.1:{listener.getsockname()[1]}/"
            async with connect(url, compression=None) as client:
                await client.send(b"boom")
                with pytest.raises(ConnectionClosed):
                    await client.recv()
            await ended.wait()
        assert "cannot take b'boom'" in caplog.text
    finally:
        server.should_exit = True
        await serving
        listener.close()


async def test_the_transport_passes_everything_but_writing_through() -> None:
    async with socket_pair() as (transport, peer):
        assert transport.can_write_eof()
        assert transport.is_reading()
        transport.pause_reading()
        assert not transport.is_reading()
        transport.resume_reading()
        assert transport.is_reading()
        transport.set_write_buffer_limits(high=4096, low=1024)
        assert transport.get_write_buffer_limits() == (1024, 4096)
        protocol = transport.get_protocol()
        transport.set_protocol(protocol)
        assert transport.get_protocol() is protocol
        assert transport.get_extra_info("sockname") is not None
        transport.write(b"before the end")
        transport.write_eof()  # writes what was gathered first
        loop = asyncio.get_running_loop()
        assert await loop.sock_recv(peer, 100) == b"before the end"
        assert await loop.sock_recv(peer, 100) == b""


async def echo(scope: Scope, receive: Receive, send: Send) -> None:
    """Echo every message through ASGI (no RECEIVE_FRAMES handler), until a disconnect."""
    assert (await receive())["type"] == "websocket.connect"
    await send({"type": "websocket.accept"})
    while (message := await receive())["type"] == "websocket.receive":
        await send({**message, "type": "websocket.send"})


def masked(opcode: int, payload: bytes) -> bytes:
    """A whole client frame (masking key zero: the payload as it is)."""
    assert len(payload) < 126
    return bytes([0x80 | opcode, 0x80 | len(payload)]) + b"\0\0\0\0" + payload


async def raw_connect(
    port: int, *, request: bytes = b""
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        + request
    )
    return reader, writer


async def server_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    first, size = await reader.readexactly(2)
    assert size < 126
    return first & 0x0F, await reader.readexactly(size)


async def test_without_a_handler_plain_messages_are_queued_in_order() -> None:
    server, serving, listener = await serve(echo)
    try:
        async with asyncio.timeout(5 * T):
            url = f"ws://127.0.0.1:{listener.getsockname()[1]}/"
            async with connect(url, compression=None) as client:
                for n in range(20):  # sent at once: several per read
                    await client.send(b"%d" % n if n % 2 else str(n))
                echoed = [await client.recv() for _ in range(20)]
        assert echoed == [b"%d" % n if n % 2 else str(n) for n in range(20)]
    finally:
        server.should_exit = True
        await serving
        listener.close()


async def test_with_compression_websockets_reads_every_frame() -> None:
    server, serving, listener = await serve(echo)
    try:
        async with asyncio.timeout(5 * T):
            url = f"ws://127.0.0.1:{listener.getsockname()[1]}/"
            async with connect(url, compression="deflate") as client:
                for text in ("one", "two", "three"):
                    await client.send(text)
                    assert await client.recv() == text
    finally:
        server.should_exit = True
        await serving
        listener.close()


async def test_frames_sent_before_the_response_are_read_by_websockets() -> None:
    """A client that does not wait for the 101 (RFC 6455 §4.1 says it must): its
    early frame, and every one after it, are websockets' to read. What becomes of
    the early frame is Uvicorn's (its own protocol echoes ``later`` first here
    too); ours is that the reader stays out and the connection keeps working."""
    server, serving, listener = await serve(echo)
    try:
        async with asyncio.timeout(5 * T):
            reader, writer = await raw_connect(
                listener.getsockname()[1], request=masked(0x2, b"early")
            )
            await reader.readuntil(b"\r\n\r\n")
            writer.write(masked(0x2, b"later"))
            assert await server_frame(reader) == (0x2, b"later")
            writer.write(masked(0x8, b"\x03\xe8"))
            while (frame := await server_frame(reader))[0] != 0x8:
                assert frame == (0x2, b"early")
            assert frame == (0x8, b"\x03\xe8")
            writer.close()
    finally:
        server.should_exit = True
        await serving
        listener.close()


async def test_after_the_application_closes_websockets_reads_the_rest() -> None:
    """Messages that cross the application's close are dropped, as Uvicorn does,
    and the client's echo of the close ends the connection."""
    closing = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        assert (await receive())["type"] == "websocket.receive"
        await send({"type": "websocket.close", "code": 1000})
        closing.set()
        assert (await receive())["type"] == "websocket.disconnect"

    server, serving, listener = await serve(app)
    try:
        async with asyncio.timeout(5 * T):
            reader, writer = await raw_connect(listener.getsockname()[1])
            await reader.readuntil(b"\r\n\r\n")
            writer.write(masked(0x2, b"first"))
            assert await server_frame(reader) == (0x8, b"\x03\xe8")
            writer.write(masked(0x2, b"crossed the close") + masked(0x8, b"\x03\xe8"))
            assert await reader.read() == b""  # closed, nothing more sent
            writer.close()
        assert closing.is_set()
    finally:
        server.should_exit = True
        await serving
        listener.close()


async def test_a_refused_handshake_offers_no_extensions() -> None:
    server, serving, listener = await serve(echo)
    try:
        async with asyncio.timeout(5 * T):
            reader, writer = await asyncio.open_connection("127.0.0.1", listener.getsockname()[1])
            writer.write(
                b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
            )
            status = await reader.readline()
            assert status.startswith(b"HTTP/1.1 400"), status
            writer.close()
    finally:
        server.should_exit = True
        await serving
        listener.close()


async def test_both_fast_paths_engage_on_the_pinned_versions() -> None:
    """The writing shortcut leans on Uvicorn's protocol (pyproject.toml bounds its version),
    and the reading one hands over to websockets at documented points. Should an upgrade
    change either, each declines and everything still works, only slower: nothing else
    would notice, so this test asserts that both actually engage."""
    protocols: list[CoalescingWebSocketProtocol] = []

    class Recording(CoalescingWebSocketProtocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            protocols.append(self)
            super().connection_made(transport)

    read_by_us: list[bool] = []
    sent_by_us: list[bool] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        message = await receive()  # no RECEIVE_FRAMES handler: through the ASGI queue
        # Our reader stays in place for as long as it parses the frames itself; it is
        # dropped for good the moment websockets takes over.
        read_by_us.append(protocols[0]._reader is not None)
        sent_by_us.append(scope["extensions"][SEND_FRAME](message["bytes"], False))
        await send({"type": "websocket.close", "code": 1000})

    server, serving, listener = await serve(app, protocol=Recording)
    try:
        async with asyncio.timeout(5 * T):
            url = f"ws://127.0.0.1:{listener.getsockname()[1]}/"
            async with connect(url, compression=None) as client:
                await client.send(b"plain")
                assert await client.recv() == b"plain"
        assert read_by_us == [True], "the reading shortcut no longer engages"
        assert sent_by_us == [True], "the writing shortcut no longer engages"
    finally:
        server.should_exit = True
        await serving
        listener.close()


async def test_a_server_stopping_after_the_peers_close_frame_stops_cleanly() -> None:
    """Uvicorn's shutdown sends 1012 to every connection; one whose peer closed first (a
    close websockets has already answered) must not make it raise InvalidState."""
    protocols: list[CoalescingWebSocketProtocol] = []
    shut: list[bool] = []
    done = asyncio.Event()

    class Recording(CoalescingWebSocketProtocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            protocols.append(self)
            super().connection_made(transport)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        assert (await receive())["type"] == "websocket.disconnect"
        # The peer's close is answered and the socket is closing, but the connection is
        # still the server's until connection_lost runs: what a stopping server meets.
        protocol = protocols[0]
        assert not protocol.close_sent
        protocol.shutdown()  # raised InvalidState before
        shut.append(protocol.transport.is_closing())
        done.set()

    server, serving, listener = await serve(app, protocol=Recording)
    try:
        async with asyncio.timeout(5 * T):
            reader, writer = await raw_connect(listener.getsockname()[1])
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101")
            writer.write(masked(0x8, b"\x03\xe8"))  # close 1000
            assert await server_frame(reader) == (0x8, b"\x03\xe8")  # websockets' answer
            assert await reader.read() == b""
            writer.close()
            await done.wait()
        assert shut == [True]
    finally:
        server.should_exit = True
        await serving
        listener.close()


async def test_a_server_stopping_under_an_open_connection_closes_it_with_1012() -> None:
    accepted = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        accepted.set()
        assert (await receive())["type"] == "websocket.disconnect"

    server, serving, listener = await serve(app)
    try:
        async with asyncio.timeout(5 * T):
            reader, writer = await raw_connect(listener.getsockname()[1])
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101")
            await accepted.wait()
            server.should_exit = True  # Uvicorn's shutdown meets the connection still open
            assert await server_frame(reader) == (0x8, b"\x03\xf4")  # close 1012
            writer.close()
    finally:
        server.should_exit = True
        await serving
        listener.close()
