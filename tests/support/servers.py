"""Serve an ASGI app on a real Hypercorn or Uvicorn, in a background thread.

Theory of operation
-------------------
Each server runs in its own thread with its own asyncio loop. A sync test (curl in a
subprocess, a blocking client) and an async test alike talk to it over real sockets, and a
test that blocks its own loop cannot stall the server.

The listening socket is bound here, to ``127.0.0.1`` port 0, *before* the thread starts:
the port is known without parsing logs and nobody can take it in between. The socket
object itself (not its file descriptor, which would leave two objects owning one fd) is
handed to the server, which listens on it and closes it on shutdown. For Hypercorn this
means calling ``hypercorn.asyncio.run.worker_serve`` with a ``Sockets`` value, because the
public ``serve()`` only takes ``config.bind`` strings.

Readiness is an event, never a sleep:

* Hypercorn's ``worker_serve`` first awaits the lifespan startup, then ``start_server`` for
  every socket, and only then calls ``shutdown_trigger()``. The first call of our trigger
  is therefore the "accepting connections" signal, and the trigger then waits for stop.
* Uvicorn's ``Server.startup()`` returns after the lifespan startup and ``create_server``;
  a subclass signals there.

If the thread ends first (say, a failing lifespan startup), its ``finally`` wakes the
caller, who re-raises the thread's exception as :class:`ServerFailed`. Stopping sets
Hypercorn's trigger event or Uvicorn's ``should_exit`` from inside the server's loop,
then joins the thread with a deadline.

Close clients before leaving the block. Uvicorn closes open WebSockets on shutdown (code
1012), but Hypercorn leaves them open for its whole graceful timeout (``3 * T`` here), then
cancels them (the client sees 1011), so a forgotten client costs three seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import sys
import threading
import traceback
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

import anyio
import uvicorn
from hypercorn.asyncio.run import worker_serve
from hypercorn.config import Config as HypercornConfig
from hypercorn.config import Sockets
from hypercorn.typing import ASGIFramework
from hypercorn.utils import wrap_app
from starlette.types import ASGIApp

from asbp import DEFAULT_LIMITS
from gateway.transports.coalescing import CoalescingWebSocketProtocol
from gateway.transports.h11_eof import EofAnsweringH11Protocol
from gateway.transports.hypercorn_ws import configure_compression
from gateway.transports.hypercorn_ws import install as install_ws_stream
from gateway.transports.websocket import max_message_bytes

from .loops import suite_loop_factory
from .timing import T
from .tls import TlsFiles

__all__ = [
    "HOST",
    "RunningServer",
    "ServerFailed",
    "ServerName",
    "UvicornWebSocket",
    "serve_app",
    "serve_app_async",
]

ServerName = Literal["hypercorn", "uvicorn"]
#: Uvicorn's WebSocket protocol: ours, as the broker runs it, or Uvicorn's own.
UvicornWebSocket = Literal["coalescing", "websockets-sansio"]

# As gateway/ops/server.py configures both servers for the default limits.
_MAX_MESSAGE_BYTES: Final = max_message_bytes(DEFAULT_LIMITS)

#: Servers listen on IPv4 loopback only.
HOST: Final = "127.0.0.1"

# How long the server waits for open connections to finish once told to stop. Both servers
# then cancel what is left, so the thread join below can afford a fixed deadline.
_GRACEFUL_TIMEOUT: Final = 3 * T
_START_TIMEOUT: Final = 10 * T
#: A broker of a bus closes its engine, routing plane and census, each bounded by
#: a Redis command timeout (10 s) when Redis is slow: under coverage on two cores
#: a stop took longer than 13 s in CI (issue 11's note: to be bounded in the
#: broker itself), and a server left running misleads every test after it.
_STOP_TIMEOUT: Final = _GRACEFUL_TIMEOUT + 25 * T

_Ready = Callable[[], None]
_Serve = Callable[[_Ready, asyncio.Event], Coroutine[Any, Any, None]]


class ServerFailed(RuntimeError):
    """The server failed to start, crashed while serving, or did not stop in time.

    The server's own exception, if any, is the ``__cause__``.
    """


@dataclass(frozen=True, slots=True)
class RunningServer:
    """Where a server started by :func:`serve_app` listens."""

    server: ServerName
    host: str
    port: int
    tls: bool

    @property
    def http_url(self) -> str:
        """``http://127.0.0.1:PORT``, or ``https://`` when serving TLS; no trailing slash."""
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    @property
    def ws_url(self) -> str:
        """``ws://127.0.0.1:PORT``, or ``wss://`` when serving TLS; no trailing slash."""
        return f"{'wss' if self.tls else 'ws'}://{self.host}:{self.port}"


@contextlib.contextmanager
def serve_app(
    app: ASGIApp,
    *,
    server: ServerName = "hypercorn",
    tls: TlsFiles | None = None,
    h2: bool | None = None,
    uvicorn_ws: UvicornWebSocket = "coalescing",
    max_message_bytes: int = _MAX_MESSAGE_BYTES,
) -> Iterator[RunningServer]:
    """Serve ``app`` on a fresh port until the block exits.

    With Hypercorn the one port serves HTTP/1.0, HTTP/1.1, h2c with prior knowledge and
    WebSocket, and with ``tls`` offers HTTP/2 by ALPN. Uvicorn serves HTTP/1.x and
    WebSocket only (its HTTP/2 needs the optional ``zttp`` package).

    Args:
        app: the ASGI application; its lifespan runs if it supports one.
        server: which server to run.
        tls: certificate and key to serve HTTPS/WSS with; ``None`` for plain TCP.
        h2: offer HTTP/2 by ALPN. ``None`` means what the server supports (Hypercorn: yes,
            Uvicorn: no). Hypercorn always answers h2c prior knowledge, even with
            ``h2=False``: it detects the connection preface and has no switch for it.
        uvicorn_ws: Uvicorn's WebSocket protocol: ``coalescing`` (ours, as the broker
            runs it) or ``websockets-sansio`` (Uvicorn's own).
        max_message_bytes: the largest WebSocket message the server reads (both
            servers; by default what gateway/ops/server.py sets for the default limits).

    Raises:
        ServerFailed: the server did not become ready, failed, or did not stop in time.
        ValueError: ``h2=True`` with Uvicorn.
    """
    serving = _Serving(
        app,
        server=server,
        tls=tls,
        h2=h2,
        uvicorn_ws=uvicorn_ws,
        max_message_bytes=max_message_bytes,
    )
    try:
        yield serving.start()
    finally:
        serving.stop()


@contextlib.asynccontextmanager
async def serve_app_async(
    app: ASGIApp,
    *,
    server: ServerName = "hypercorn",
    tls: TlsFiles | None = None,
    h2: bool | None = None,
    uvicorn_ws: UvicornWebSocket = "coalescing",
    max_message_bytes: int = _MAX_MESSAGE_BYTES,
) -> AsyncIterator[RunningServer]:
    """Like :func:`serve_app`, but waits for start and stop without blocking the caller's loop."""
    serving = _Serving(
        app,
        server=server,
        tls=tls,
        h2=h2,
        uvicorn_ws=uvicorn_ws,
        max_message_bytes=max_message_bytes,
    )
    try:
        yield await anyio.to_thread.run_sync(serving.start)
    finally:
        # Shielded: a cancelled test must still stop its server.
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(serving.stop)


class _Serving:
    """One server thread, from socket binding to join."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        server: ServerName,
        tls: TlsFiles | None,
        h2: bool | None,
        uvicorn_ws: UvicornWebSocket,
        max_message_bytes: int,
    ) -> None:
        if server == "uvicorn" and h2:
            raise ValueError("uvicorn serves HTTP/2 only with zttp, which is not installed")
        if server not in ("hypercorn", "uvicorn"):
            raise ValueError(f"unknown server {server!r}")

        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._sock.bind((HOST, 0))
            port: int = self._sock.getsockname()[1]
        except BaseException:
            self._sock.close()
            raise
        self._running = RunningServer(server=server, host=HOST, port=port, tls=tls is not None)
        if server == "hypercorn":
            serve = _hypercorn(
                app, self._sock, tls=tls, h2=h2 is not False, max_message_bytes=max_message_bytes
            )
        else:
            serve = _uvicorn(
                app, self._sock, tls=tls, ws=uvicorn_ws, max_message_bytes=max_message_bytes
            )
        self._thread = _ServerThread(serve, name=f"{server}:{port}")

    def start(self) -> RunningServer:
        self._thread.start(_START_TIMEOUT)
        return self._running

    def stop(self) -> None:
        try:
            self._thread.stop(_STOP_TIMEOUT)
        finally:
            # Normally already closed by the server; this covers a failed startup.
            self._sock.close()


class _ServerThread:
    """Run a ``_Serve`` coroutine in a thread with its own loop; report readiness and errors."""

    def __init__(self, serve: _Serve, *, name: str) -> None:
        self._serve = serve
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        # Set when the server is ready *or* the thread has ended, whichever comes first.
        self._settled = threading.Event()
        self._ready = False
        self._error: BaseException | None = None
        self._error_reported = False
        # Guards _loop/_stop so stop() never schedules onto a loop that is closing.
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stop_requested = False
        # The loop, kept past the serve coroutine's end (the runner still closes it).
        self._seen_loop: asyncio.AbstractEventLoop | None = None

    def start(self, timeout: float) -> None:
        self._thread.start()
        if not self._settled.wait(timeout):
            raise ServerFailed(f"{self._thread.name} was not ready within {timeout:g}s")
        if not self._ready:
            self._error_reported = True
            raise ServerFailed(f"{self._thread.name} stopped before it was ready") from self._error

    def stop(self, timeout: float) -> None:
        with self._lock:
            self._stop_requested = True
            if self._loop is not None and self._stop is not None:
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread.ident is None:
            return  # never started
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise ServerFailed(
                f"{self._thread.name} did not stop within {timeout:g}s; where it is:\n"
                + self._whereabouts()
            )
        if self._error is not None and not self._error_reported:
            self._error_reported = True
            raise ServerFailed(f"{self._thread.name} failed") from self._error

    def _whereabouts(self) -> str:
        """The stuck thread's stack and every task of its loop, for the failure message.

        A server that will not stop is found in CI, once in hundreds of runs: without
        this the message says only that it happened, never where.
        """
        lines: list[str] = []
        frame = sys._current_frames().get(self._thread.ident or -1)
        if frame is not None:
            lines.append("thread:")
            lines.extend(traceback.format_stack(frame))
        loop = self._seen_loop
        if loop is not None:
            # Read from another thread: good enough for a post-mortem, never for control.
            for task in list(asyncio.all_tasks(loop)):
                lines.append(f"task {task.get_name()}:\n")
                lines.extend(_awaiting(task.get_coro()))
        return "".join(line if line.endswith("\n") else line + "\n" for line in lines)

    def _run(self) -> None:
        try:
            # On the loop ASBP_TEST_LOOP names (tests/support/loops.py): asyncio's own
            # by default, uvloop (the broker's default) when asked.
            with asyncio.Runner(loop_factory=suite_loop_factory()) as runner:
                runner.run(self._main())
        except BaseException as exc:  # re-raised in the caller's thread by start() or stop()
            self._error = exc
        finally:
            self._settled.set()

    async def _main(self) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(_exception_handler)
        self._seen_loop = loop
        with self._lock:
            self._loop = loop
            self._stop = stop
            if self._stop_requested:
                stop.set()
        try:
            await self._serve(self._mark_ready, stop)
        finally:
            with self._lock:
                self._loop = None

    def _mark_ready(self) -> None:
        self._ready = True
        self._settled.set()


def _awaiting(coro: object) -> list[str]:
    """Where a suspended coroutine is, down its chain of awaits (a task's own stack
    shows only the outermost frame)."""
    lines: list[str] = []
    while coro is not None and len(lines) < 40:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            code = frame.f_code
            lines.append(f"  {code.co_filename}:{frame.f_lineno} {code.co_name}\n")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return lines


def _exception_handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    # On Python < 3.12.2 the asyncio streams callback calls task.exception() on a cancelled
    # connection task and logs the resulting CancelledError (CPython gh-113538). Hypercorn
    # cancels connections still open when its graceful timeout ends, so this is noise.
    # Everything else goes to the default handler, which logs it.
    if isinstance(context.get("exception"), asyncio.CancelledError):
        return
    loop.default_exception_handler(context)


def _hypercorn(
    app: ASGIApp, sock: socket.socket, *, tls: TlsFiles | None, h2: bool, max_message_bytes: int
) -> _Serve:
    async def serve(ready: _Ready, stop: asyncio.Event) -> None:
        install_ws_stream()  # as gateway/ops/server.py serves the broker
        config = _hypercorn_config(tls=tls, h2=h2)
        config.websocket_max_message_size = max_message_bytes
        if tls is None:
            sockets = Sockets(secure_sockets=[], insecure_sockets=[sock], quic_sockets=[])
        else:
            sockets = Sockets(secure_sockets=[sock], insecure_sockets=[], quic_sockets=[])

        async def shutdown_trigger() -> None:
            ready()  # first called once every socket is accepting; see the module docstring
            await stop.wait()

        # Starlette's and Hypercorn's ASGI aliases differ only in their scope typing.
        framework = cast(ASGIFramework, app)
        await worker_serve(
            wrap_app(framework, config.wsgi_max_body_size, "asgi"),
            config,
            sockets=sockets,
            shutdown_trigger=shutdown_trigger,
        )

    return serve


def _hypercorn_config(*, tls: TlsFiles | None, h2: bool) -> HypercornConfig:
    config = HypercornConfig()
    config.accesslog = None
    # A logger object is used as is: Hypercorn adds no handler and changes no level. Its
    # INFO chatter ("Running on ...") falls below the root's WARNING default, while errors
    # propagate to the root, where pytest captures and reports them.
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = _GRACEFUL_TIMEOUT
    configure_compression(config, False)  # as gateway/ops/server.py's default
    # Assigned, never mutated: Hypercorn's defaults are class-level lists.
    config.alpn_protocols = ["h2", "http/1.1"] if h2 else ["http/1.1"]
    if tls is not None:
        config.certfile = str(tls.cert)
        config.keyfile = str(tls.key)
    return config


class _UvicornServer(uvicorn.Server):
    """A Uvicorn server that reports when it is accepting connections."""

    def __init__(self, config: uvicorn.Config, ready: _Ready) -> None:
        super().__init__(config)
        self._on_ready = ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        # Returns only once listening; a failed lifespan startup calls sys.exit() instead.
        await super().startup(sockets=sockets)
        self._on_ready()


def _uvicorn(
    app: ASGIApp,
    sock: socket.socket,
    *,
    tls: TlsFiles | None,
    ws: UvicornWebSocket,
    max_message_bytes: int,
) -> _Serve:
    async def serve(ready: _Ready, stop: asyncio.Event) -> None:
        config = uvicorn.Config(
            app,
            http=EofAnsweringH11Protocol,  # as gateway/ops/server.py runs it
            # As gateway/ops/server.py runs Uvicorn: websockets-sansio, writes coalesced.
            ws=CoalescingWebSocketProtocol if ws == "coalescing" else ws,
            ws_max_size=max_message_bytes,
            ws_per_message_deflate=False,  # as gateway/ops/server.py's default
            lifespan="auto",
            log_config=None,  # leave the process's logging configuration alone
            access_log=False,
            timeout_graceful_shutdown=math.ceil(_GRACEFUL_TIMEOUT),
            ssl_certfile=None if tls is None else tls.cert,
            ssl_keyfile=None if tls is None else tls.key,
        )
        server = _UvicornServer(config, ready)

        async def exit_on_stop() -> None:
            await stop.wait()
            server.should_exit = True  # polled by Uvicorn's main loop

        watcher = asyncio.create_task(exit_on_stop())
        try:
            await server.serve(sockets=[sock])
        finally:
            watcher.cancel()
            await asyncio.wait([watcher])

    return serve
