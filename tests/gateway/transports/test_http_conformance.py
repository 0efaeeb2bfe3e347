"""Bad HTTP request bodies get the same answer on every server path the broker ships.

The sibling of test_frame_conformance.py for ``POST /asbp``: one table of
cases, each the exact bytes a client sends on a raw socket (and whether it
then shuts down its sending side), and the status and fault code the broker
must answer with, after which the connection must close. Every case runs on
Hypercorn, Uvicorn with its stock WebSocket protocol and Uvicorn on the fast
path (the HTTP side is the same ``EofAnsweringH11Protocol`` on both Uvicorn
paths, as gateway/ops/server.py runs it); the answer must be the same.

The broker under test reads a body for ``READ_TIMEOUT`` seconds at most
(``channels.http_read_timeout``), so a stalled body is answered in about that.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import asbp
from gateway.app import create_app
from gateway.config.model import ChannelLimits, GatewayConfig
from tests.support import T, serve_app
from tests.support.servers import RunningServer

LIMITS = asbp.Limits(max_frame_bytes=80 * 1024)
READ_TIMEOUT = 1.0 * T
PATHS = ("hypercorn", "uvicorn", "uvicorn-fast")

HEAD = b"POST /asbp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/asbp\r\n"
PING = b"c=asbp.ping;"


def sized(body: bytes, declared: int | None = None) -> bytes:
    length = len(body) if declared is None else declared
    return HEAD + b"Content-Length: %d\r\n\r\n" % length + body


def chunked(*chunks: bytes, end: bool = True) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for chunk in chunks)
    return HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + body + (b"0\r\n\r\n" if end else b"")


@dataclass(frozen=True)
class Case:
    name: str
    #: Segments written one ``send`` each.
    send: tuple[bytes, ...]
    status: int
    #: The fault's code, or None for a Command that is not a fault.
    fault: int | None
    #: Shut down the sending side after the segments (end-of-file).
    eof: bool = False
    #: The answer comes only after the read timeout.
    stalls: bool = False


CASES: tuple[Case, ...] = (
    Case("1.1 a whole body", (sized(PING),), 200, None),
    Case("1.2 a whole chunked body", (chunked(PING[:5], PING[5:]),), 200, None),
    Case(
        "2.1 Content-Length larger than what is sent, then nothing",
        (sized(PING, 262_145),),
        408,
        1201,
        stalls=True,
    ),
    Case(
        "2.2 chunks that never end",
        (chunked(PING[:5], end=False),),
        408,
        1201,
        stalls=True,
    ),
    Case(
        "2.3 a chunk cut off in the middle",
        (HEAD + b"Transfer-Encoding: chunked\r\n\r\n10\r\nc=asb",),
        408,
        1201,
        stalls=True,
    ),
    Case("3.1 a short body, then end-of-file", (sized(PING, 100),), 400, 1201, eof=True),
    Case(
        "3.2 unfinished chunks, then end-of-file", (chunked(PING, end=False),), 400, 1201, eof=True
    ),
    Case("3.3 no body at all, then end-of-file", (sized(b"", 100),), 400, 1201, eof=True),
    Case(
        "4.1 a declared body far over the limit, answered before it arrives",
        (sized(b"c=x;", 10**9),),
        413,
        1101,
    ),
    Case(
        "4.2 a chunked body over the limit",
        (chunked(PING, bytes(LIMITS.max_frame_bytes)),),
        413,
        1101,
    ),
    Case(
        "4.3 a body one byte over the limit", (sized(bytes(LIMITS.max_frame_bytes + 1)),), 413, 1101
    ),
)


#: Where Hypercorn departs from the table, asserted as it is, so that a fix shows.
#: When the end-of-file reaches Hypercorn's h11 protocol before the application
#: has answered (usually), Hypercorn itself answers ``400`` with an empty body
#: (``hypercorn.protocol.h11.H11Protocol._send_error_response``) and the
#: application's answer, with its fault, is dropped; there is no hook to change
#: that short of replacing Hypercorn's protocol. The status is the same.
HYPERCORN_EOF_400_MAY_HAVE_NO_FAULT = True


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RunningServer]]:
    data_dir: Path = tmp_path_factory.mktemp("bodies")
    with contextlib.ExitStack() as stack:
        running = {}
        for path in PATHS:
            config = GatewayConfig(
                broker_id="bodies",
                data_dir=data_dir / path,
                limits=LIMITS,
                channels=ChannelLimits(http_read_timeout=READ_TIMEOUT),
            )
            running[path] = stack.enter_context(
                serve_app(
                    create_app(config),
                    server="hypercorn" if path == "hypercorn" else "uvicorn",
                    uvicorn_ws="coalescing" if path == "uvicorn-fast" else "websockets-sansio",
                )
            )
        yield running


def read_response(sock: socket.socket) -> tuple[int, dict[bytes, bytes], bytes]:
    """Status, headers and body of one response with a Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed with no answer; read {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.split(b"\r\n")
    headers = dict(line.lower().split(b": ", 1) for line in lines)
    size = int(headers[b"content-length"])
    while len(body) < size:
        chunk = sock.recv(65536)
        assert chunk, "closed in the middle of the body"
        body += chunk
    return int(status_line.split()[1]), headers, body[:size]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_bodies(servers: dict[str, RunningServer], path: str, case: Case) -> None:
    sock = socket.create_connection(("127.0.0.1", servers[path].port), timeout=10 * T)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        began = time.monotonic()
        for segment in case.send:
            sock.sendall(segment)
        if case.eof:
            sock.shutdown(socket.SHUT_WR)
        status, headers, body = read_response(sock)
        took = time.monotonic() - began
        assert status == case.status, body
        if case.eof and path == "hypercorn" and not body:
            assert HYPERCORN_EOF_400_MAY_HAVE_NO_FAULT
            assert headers.get(b"connection") == b"close"
            return
        command = asbp.decode(body)
        if case.fault is None:
            assert command.name == "asbp.accepted"
            return
        assert command.name == "asbp.fault"
        assert asbp.read_fault(command).code == case.fault
        if case.stalls:
            assert READ_TIMEOUT <= took < READ_TIMEOUT + 5 * T
        else:
            assert took < 5 * T
        if status != 413:
            # What is left of the body must never be read as a request: the
            # connection ends after the answer.
            assert headers.get(b"connection") == b"close"
            with contextlib.suppress(ConnectionResetError):
                assert sock.recv(1) == b""
    finally:
        sock.close()
