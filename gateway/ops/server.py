"""Run the broker's ASGI application under Hypercorn or Uvicorn.

Theory of operation
-------------------
:func:`serve` resolves the Broker-Identifier (so the application always sees a
``broker_id``), builds the application with :func:`gateway.app.create_app`, and binds
the listening socket itself: port 0 works, and the real address is known without
parsing any server's log. It hands the socket object to the chosen server, which runs
the application's lifespan startup, starts accepting, and then reports readiness:

* Hypercorn's ``worker_serve`` (the public ``serve()`` only takes ``bind`` strings)
  awaits the lifespan startup, then ``start_server`` for every socket, and only then
  calls its ``shutdown_trigger``. The first call of our trigger is the "accepting
  connections" signal; the trigger then waits for the stop event.
* Uvicorn's ``Server.startup()`` returns after the lifespan startup and
  ``create_server``; a subclass reports there.

Once ready, :func:`serve` logs ``listening`` with the URLs clients use and calls
``ready(base_url)``.

Stopping is an :class:`asyncio.Event`. ``shutdown_trigger`` sets it when given;
otherwise SIGINT and SIGTERM do (in the main thread). The first signal starts a
graceful shutdown: stop accepting, give open requests up to :data:`GRACEFUL_TIMEOUT`
seconds, run the lifespan shutdown. A second signal cancels what is left at once.
Uvicorn's own signal capture is switched off: it re-raises the captured signal after
stopping, which would turn a clean SIGTERM into death by signal rather than exit 0.

Hypercorn serves HTTP/1.0, HTTP/1.1, HTTP/2 (by ALPN over TLS, and h2c with prior
knowledge or by upgrade in the clear) and WebSocket on the one port. Uvicorn serves
HTTP/1.1 and WebSocket (``websockets-sansio``). Neither writes an access log: the
broker logs what matters as structured events, and per-request lines would drown them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import logging
import math
import signal
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from typing import Any, Final, cast

from hypercorn.asyncio.run import worker_serve
from hypercorn.config import Config as HypercornConfig
from hypercorn.config import Sockets
from hypercorn.typing import ASGIFramework
from hypercorn.utils import LifespanFailureError, LifespanTimeoutError, wrap_app
from starlette.applications import Starlette

from gateway.app import create_app
from gateway.broker_id import broker_identity
from gateway.config.model import GatewayConfig, chosen_server
from gateway.errors import LocalError
from gateway.ops.collector import tune_collector
from gateway.ops.loops import running_loop
from gateway.transports.hypercorn_ws import configure_compression
from gateway.transports.hypercorn_ws import install as install_ws_stream
from gateway.transports.websocket import max_message_bytes

__all__ = [
    "CHANNEL_PATH",
    "GRACEFUL_TIMEOUT",
    "HEALTH_PATH",
    "TUBE_PATH",
    "Endpoints",
    "ServerError",
    "bind_socket",
    "listen_backlog",
    "serve",
]

#: Seconds open connections get to finish once the broker is told to stop.
GRACEFUL_TIMEOUT: Final = 5.0

#: The paths clients connect to.
CHANNEL_PATH: Final = "/asbp"
TUBE_PATH: Final = "/tube"
HEALTH_PATH: Final = "/healthz"

_STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)

#: The listen backlog with ``channels.max_handshakes`` off (Uvicorn's default).
_DEFAULT_BACKLOG: Final = 2048

logger = logging.getLogger(__name__)

_Ready = Callable[[], None]


# Also a RuntimeError: it was one before the error tree had it, and callers of
# serve() may catch it that way.
class ServerError(LocalError, RuntimeError):
    """The broker could not listen, or the application failed to start.

    Raised to the caller of :func:`serve` and never sent to a peer, so it has no fault
    code of its own.
    """


@dataclasses.dataclass(frozen=True, slots=True)
class Endpoints:
    """The URLs where clients reach a listening broker."""

    #: ``http(s)://host:port``, no trailing slash.
    base_url: str
    #: User-Agent Channels over HTTP (stateless and long-poll).
    channels_http: str
    #: User-Agent Channels over WebSocket.
    channels_ws: str
    #: Application-Agent Tubes (WebSocket).
    tubes: str
    #: The liveness probe.
    healthz: str

    @classmethod
    def for_address(cls, host: str, port: int, *, tls: bool) -> Endpoints:
        """The URLs for a broker listening on ``host``:``port``.

        A wildcard address (``0.0.0.0``, ``::``) is not one a client can dial, so the
        URLs name the loopback address of the same family instead.
        """
        try:
            address = ipaddress.ip_address(host.partition("%")[0])
        except ValueError:
            url_host = host
        else:
            if address.is_unspecified:
                address = ipaddress.ip_address("::1" if address.version == 6 else "127.0.0.1")
                host = str(address)
            # RFC 6874: an IPv6 zone ("fe80::1%eth0") is written with "%25" in a URL.
            url_host = f"[{host.replace('%', '%25')}]" if address.version == 6 else host
        http = f"{'https' if tls else 'http'}://{url_host}:{port}"
        ws = f"{'wss' if tls else 'ws'}://{url_host}:{port}"
        return cls(
            base_url=http,
            channels_http=http + CHANNEL_PATH,
            channels_ws=ws + CHANNEL_PATH,
            tubes=ws + TUBE_PATH,
            healthz=http + HEALTH_PATH,
        )


async def serve(
    config: GatewayConfig,
    *,
    ready: Callable[[str], None] | None = None,
    shutdown_trigger: Callable[[], Awaitable[object]] | None = None,
) -> None:
    """Serve the broker until told to stop, then shut down gracefully.

    Args:
        config: what to serve and how; ``config.server`` picks Hypercorn or Uvicorn
            (``auto``: :func:`~gateway.config.model.chosen_server`).
        ready: called with the base URL (``http://127.0.0.1:8080``) once the lifespan
            startup has run and the socket accepts connections.
        shutdown_trigger: awaited; its return starts the shutdown. Without one, SIGINT
            and SIGTERM do (only in the main thread: elsewhere, pass a trigger).

    Raises:
        ConfigError: the broker identity cannot be kept in ``config.data_dir``.
        ServerError: the address cannot be resolved or bound, or the application's
            lifespan startup failed.
    """
    # ``auto`` resolved once, here: the app, the log and the management API then name
    # the server that runs.
    config = dataclasses.replace(
        config, broker_id=broker_identity(config), server=chosen_server(config)
    )
    app = create_app(config)
    sock = await bind_socket(config.host, config.port)
    with contextlib.closing(sock):  # the server closes it too; this covers failures
        host, port = sock.getsockname()[:2]
        endpoints = Endpoints.for_address(host, port, tls=config.tls is not None)
        stop = asyncio.Event()

        def on_ready() -> None:
            # What start-up allocated (modules, the app, the engine's scripts) lives as
            # long as the process: out of the collector's sight, a full collection no
            # longer walks it. With many connections open, those walks were the
            # broker's longest pauses (bench/fanout.py p99, bench/queues.py CPU), and
            # churn made them frequent: gateway/ops/collector.py.
            tune_collector()
            logger.info(
                "listening",
                extra={
                    "url": endpoints.base_url,
                    "channels": [endpoints.channels_http, endpoints.channels_ws],
                    "tubes": endpoints.tubes,
                    "healthz": endpoints.healthz,
                    "address": f"{host}:{port}",
                    "server": config.server,
                    # The loop serve() runs on, whoever made it (gateway/ops/loops.py).
                    "loop": running_loop(),
                    "broker_id": config.broker_id,
                },
            )
            if ready is not None:
                ready(endpoints.base_url)

        run = _run_hypercorn if config.server == "hypercorn" else _run_uvicorn
        server = asyncio.create_task(run(app, sock, config, on_ready, stop), name="asbp-server")
        async with _stopping(server, stop, shutdown_trigger):
            await server
    logger.info("stopped", extra={"server": config.server})


def listen_backlog(config: GatewayConfig) -> int:
    """The listening socket's backlog: ``channels.max_handshakes`` (or 2,048, Uvicorn's
    default, with the bound off).

    Connections the kernel has accepted wait there until the broker takes them, and
    past its capacity the broker would take each after its client had given up; a
    queue as long as the bound on handshakes in flight keeps that wait short. Past
    it the kernel holds a client's SYN for the client's own retry, which costs the
    broker nothing (gateway/transports/handshakes.py).
    """
    return config.channels.max_handshakes or _DEFAULT_BACKLOG


async def bind_socket(host: str, port: int) -> socket.socket:
    """Bind a TCP socket to ``host``:``port`` (0: any free port); not yet listening.

    The first address ``host`` resolves to is used. The server starts listening once
    the application is ready, so a client that connects early is refused rather than
    left waiting on a broker that may never start.

    Raises:
        ServerError: ``host`` does not resolve, or the address cannot be bound.
    """
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ServerError(f"cannot resolve host {host!r}: {exc.strerror}") from exc
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ServerError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    return sock


@contextlib.asynccontextmanager
async def _stopping(
    server: asyncio.Task[None],
    stop: asyncio.Event,
    shutdown_trigger: Callable[[], Awaitable[object]] | None,
) -> AsyncIterator[None]:
    """Set ``stop`` when the trigger returns or on the first signal; cancel on a second."""
    loop = asyncio.get_running_loop()
    forced = False

    def on_signal(signum: signal.Signals) -> None:
        nonlocal forced
        if not stop.is_set():
            logger.info("stopping", extra={"signal": signum.name, "grace": GRACEFUL_TIMEOUT})
            stop.set()
        else:
            logger.warning("stopping now", extra={"signal": signum.name})
            forced = True
            server.cancel()

    previous: dict[signal.Signals, Any] = {}
    trigger: asyncio.Task[None] | None = None
    if shutdown_trigger is not None:
        trigger = asyncio.create_task(_set_when_done(shutdown_trigger, stop))
    elif threading.current_thread() is threading.main_thread():
        for signum in _STOP_SIGNALS:
            previous[signum] = signal.getsignal(signum)
            loop.add_signal_handler(signum, on_signal, signum)
    try:
        try:
            yield
        except asyncio.CancelledError:
            # A second signal cancelled the server: that is a (hurried) clean stop. A
            # cancellation of serve() itself is the caller's and goes on.
            current = asyncio.current_task()
            if not forced or (current is not None and current.cancelling()):
                raise
        if trigger is not None and trigger.done() and not trigger.cancelled():
            trigger.result()  # re-raises an exception from the caller's trigger
    finally:
        for signum, handler in previous.items():
            # remove_signal_handler() installs the default; put back whatever was there.
            loop.remove_signal_handler(signum)
            if handler is not None:  # None: set outside Python, cannot be restored
                signal.signal(signum, handler)
        if trigger is not None:
            trigger.cancel()
            await asyncio.wait([trigger])


async def _set_when_done(
    shutdown_trigger: Callable[[], Awaitable[object]], stop: asyncio.Event
) -> None:
    try:
        await shutdown_trigger()
    finally:
        stop.set()


async def _run_hypercorn(
    app: Starlette,
    sock: socket.socket,
    config: GatewayConfig,
    on_ready: _Ready,
    stop: asyncio.Event,
) -> None:
    # Our WebSocket stream: close frames on failure as Uvicorn sends them, and the
    # fast path for plain frames (gateway/transports/hypercorn_ws.py says why).
    install_ws_stream()
    hypercorn_config = HypercornConfig()
    hypercorn_config.accesslog = None
    # A Logger object is used as is: Hypercorn adds no handler of its own, and its
    # records reach the root handler that gateway.ops.logs configured.
    hypercorn_config.errorlog = logging.getLogger("hypercorn.error")
    hypercorn_config.graceful_timeout = GRACEFUL_TIMEOUT
    # Assigned, never mutated: Hypercorn's defaults are class-level lists.
    hypercorn_config.alpn_protocols = ["h2", "http/1.1"]
    hypercorn_config.websocket_max_message_size = max_message_bytes(config.limits)
    hypercorn_config.backlog = listen_backlog(config)
    # As Uvicorn's ws_per_message_deflate below (our stream reads it; Hypercorn has none).
    configure_compression(hypercorn_config, config.websocket_compression)
    if config.tls is None:
        sockets = Sockets(secure_sockets=[], insecure_sockets=[sock], quic_sockets=[])
    else:
        hypercorn_config.certfile = str(config.tls.certfile)
        hypercorn_config.keyfile = str(config.tls.keyfile)
        sockets = Sockets(secure_sockets=[sock], insecure_sockets=[], quic_sockets=[])

    async def shutdown_trigger() -> None:
        on_ready()  # first called once every socket accepts; see the module docstring
        await stop.wait()
        # Hypercorn drains connections before the lifespan shutdown; closing the
        # Channels and Tubes first lets them end with 1001 at once instead of
        # waiting out the graceful timeout.
        await _stop_broker(app)

    # Starlette's and Hypercorn's ASGI types differ only in how they spell the scope.
    framework = cast(ASGIFramework, app)
    try:
        await worker_serve(
            wrap_app(framework, hypercorn_config.wsgi_max_body_size, "asgi"),
            hypercorn_config,
            sockets=sockets,
            shutdown_trigger=shutdown_trigger,
        )
    except (LifespanFailureError, LifespanTimeoutError) as exc:
        # The reason is in the log already (broker.start_failed, or the traceback).
        raise ServerError("the application failed to start (see the log)") from exc


async def _stop_broker(app: Starlette) -> None:
    # Courses first, while their connections are still up: each link ends with a
    # closing handshake, and what is queued for a peer stays queued.
    courses = getattr(app.state, "courses", None)
    if courses is not None:
        await courses.stop()
    broker = getattr(app.state, "broker", None)
    if broker is not None:
        await broker.stop()


async def _run_uvicorn(
    app: Starlette,
    sock: socket.socket,
    config: GatewayConfig,
    on_ready: _Ready,
    stop: asyncio.Event,
) -> None:
    # Imported here: Uvicorn is optional, and a Hypercorn broker should not need it.
    import uvicorn

    from gateway.transports.coalescing import CoalescingWebSocketProtocol
    from gateway.transports.h11_eof import EofAnsweringH11Protocol

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            # Returns once listening; a failed lifespan startup calls sys.exit() instead.
            await super().startup(sockets=sockets)
            on_ready()

        @contextlib.contextmanager
        def capture_signals(self) -> Generator[None, None, None]:
            yield  # serve() owns the signals; see the module docstring

    server = Server(
        uvicorn.Config(
            app,
            # h11, answering a body cut short by end-of-file with 400 as Hypercorn does.
            http=EofAnsweringH11Protocol,
            # Uvicorn's websockets-sansio protocol (the legacy "websockets" one warns on
            # import), writing what one loop turn sends in one system call.
            ws=CoalescingWebSocketProtocol,
            lifespan="on",
            log_config=None,  # gateway.ops.logs configured logging; leave it alone
            access_log=False,
            # Like Hypercorn, which never reads X-Forwarded-For: the peer address is the
            # one on the socket, whichever server runs.
            proxy_headers=False,
            # The same limit as Hypercorn's: websockets refuses a longer message (1009).
            ws_max_size=max_message_bytes(config.limits),
            ws_per_message_deflate=config.websocket_compression,
            backlog=listen_backlog(config),
            timeout_graceful_shutdown=math.ceil(GRACEFUL_TIMEOUT),
            ssl_certfile=None if config.tls is None else config.tls.certfile,
            ssl_keyfile=None if config.tls is None else config.tls.keyfile,
        )
    )

    async def exit_on_stop() -> None:
        await stop.wait()
        await _stop_broker(app)  # Channels and Tubes end with 1001, not Uvicorn's 1012
        server.should_exit = True  # polled by Uvicorn's main loop

    watcher = asyncio.create_task(exit_on_stop())
    try:
        await server.serve(sockets=[sock])
    except SystemExit as exc:  # Uvicorn's answer to a failed lifespan startup
        raise ServerError("the application failed to start (see the log)") from exc
    finally:
        watcher.cancel()
        await asyncio.wait([watcher])
