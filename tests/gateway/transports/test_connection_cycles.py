"""Closed WebSocket connections are freed by reference counting alone, on both servers.

With the collector off, a churn of Channels (open, greeted, closed by the client)
must leave no connection object alive once the server is done with them, and a
collection afterwards must find next to nothing: anything a connection left in a
reference cycle would wait for a full collection, which walks every object the
process holds (gateway/transports/connection_cycles.py; issue 16's soak found
them costing about 43% of the CPU per connect). Before the cycles were broken,
each closed connection left about 75 objects on either server for the
collector, and this test found every connection object still alive.

The client is a plain blocking socket in a worker thread, so that the process's
garbage is the server's: an asyncio client would leave its own transports'
cycle (CPython 3.11) to be counted.
"""

from __future__ import annotations

import gc
import importlib
import socket
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

import anyio
import pytest

from tests.support import ServerName, T
from tests.support.gateway import SERVERS, Gateway

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("server_name", SERVERS)]

#: Channels opened and closed per run.
CHURN: Final = 200

#: The classes whose instances make up one connection on each server path, on either
#: loop (tests/support/loops.py): none may outlive its connection with the collector
#: off. Named with their modules: uvloop's listening server is a ``TCPServer`` too.
CONNECTION_TYPES: Final = frozenset(
    {
        "gateway.transports.coalescing.CoalescingWebSocketProtocol",
        "gateway.transports.coalescing.CoalescingTransport",
        "websockets.server.ServerProtocol",
        "gateway.transports.hypercorn_tcp.AsbpTCPServer",
        "hypercorn.asyncio.tcp_server.TCPServer",
        "gateway.transports.hypercorn_ws.AsbpWSStream",
        "uvicorn.protocols.http.h11_impl.H11Protocol",
        "gateway.transports.h11_eof.EofAnsweringH11Protocol",
        "asyncio.selector_events._SelectorSocketTransport",
        "uvloop.loop.TCPTransport",
    }
)

#: Objects a collection may find after the churn that no connection left: the test's
#: own waiting (futures and frames of the calls into the server's loop), a constant,
#: not a number per connection.
SLACK: Final = 100

_UPGRADE: Final = (
    b"GET /asbp HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
    b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    b"Sec-WebSocket-Version: 13\r\n\r\n"
)
#: A masked close frame (RFC 6455 §5.5.1), code 1000, with a zero mask.
_CLOSE: Final = bytes((0x88, 0x82, 0, 0, 0, 0, 0x03, 0xE8))


def churn(port: int, count: int) -> None:
    """Open ``count`` Channels one after another: each is greeted, then closed by us,
    and we read until the server closes the TCP connection."""
    for _ in range(count):
        with socket.create_connection(("127.0.0.1", port), timeout=5 * T) as sock:
            sock.sendall(_UPGRADE)
            received = b""
            while b"\r\n\r\n" not in received:
                chunk = sock.recv(65536)
                assert chunk, "the server closed before its 101"
                received += chunk
            assert received.startswith(b"HTTP/1.1 101"), received[:80]
            rest = received.partition(b"\r\n\r\n")[2]
            # The broker's greeting (one frame) comes first; our close follows it.
            while len(rest) < 2:
                chunk = sock.recv(65536)
                assert chunk, "the server closed before its greeting"
                rest += chunk
            sock.sendall(_CLOSE)
            while sock.recv(65536):
                pass


def churn_http(port: int, count: int) -> None:
    """Make ``count`` HTTP requests, one connection each, read to the server's close."""
    for _ in range(count):
        with socket.create_connection(("127.0.0.1", port), timeout=5 * T) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            received = b""
            while chunk := sock.recv(65536):
                received += chunk
            assert received.startswith(b"HTTP/1.1 200"), received[:80]


def live_connection_objects() -> Counter[str]:
    names = (f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects())
    return Counter(name for name in names if name in CONNECTION_TYPES)


@contextmanager
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.parametrize("kind", ["websocket", "http"])
async def test_closed_connections_are_freed_without_the_collector(
    gateway: Gateway, server_name: ServerName, kind: str
) -> None:
    # A misspelt name would never be counted, and the test would pass blind.
    for name in CONNECTION_TYPES:
        module, _, qualname = name.rpartition(".")
        assert hasattr(importlib.import_module(module), qualname), name
    port = gateway.server.port
    client = churn if kind == "websocket" else churn_http
    await anyio.to_thread.run_sync(client, port, 5)  # the first connection's imports
    with collector_off():
        await anyio.to_thread.run_sync(client, port, CHURN)
        # Each client saw the TCP connection end; the server may still be tearing its
        # side down: each call into its loop lets it go on, until nothing is left.
        live = live_connection_objects()
        with anyio.move_on_after(10 * T):
            while live:
                await gateway.call(lambda broker: None)
                live = live_connection_objects()
        unreachable = gc.collect()
    assert not live, f"connection objects alive with the collector off: {dict(live)}"
    assert unreachable < SLACK, (
        f"{unreachable} objects left for the collector by {CHURN} closed Channels on {server_name}"
    )
