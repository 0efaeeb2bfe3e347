"""gateway.transports.coalescing: one write per loop turn, in order, nothing lost or late.

The transport is tested on a real socket pair: before its flush runs, the peer
has nothing; after it, the peer has every byte in order. The protocol is tested
behind a real Uvicorn, with a real WebSocket client.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import pytest
import uvicorn
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosedOK

from gateway.transports.asgi import Receive, Scope, Send
from gateway.transports.coalescing import CoalescingTransport, CoalescingWebSocketProtocol
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
