"""The servers under test for bench/roundtrip.py, one per process.

    python bench/_servers.py TARGET [--server hypercorn|uvicorn] [options]

TARGET is one of:

``broker``
    The real broker: ``gateway.app.create_app`` with ``insecure_dev_tubes``
    and one Application-Agent identity (``--agent-id``, ``--agent-key``: a
    public PEM). User-Agents use ``/asbp``, the agent ``/tube``.
``bare``
    A bare two-hop relay on the same stack: a Starlette WebSocket endpoint
    that forwards every message from ``/a`` to the socket on ``/b`` and back,
    with no parsing and no broker logic.
``raw``
    The same relay on plain ``websockets`` (``websockets.asyncio.server``);
    ``--server`` does not apply.

The listening socket is bound here to 127.0.0.1 port 0 before the server
starts. Once the server accepts connections this prints one line,
``READY <port>``, on stdout; the benchmark waits for that line, never for a
timer. The server stops when its standard input closes (the benchmark
closes it, or dies) or on SIGTERM/SIGINT.

``--cprofile PATH`` runs the server under cProfile and dumps pstats to PATH
on a clean stop.

``--loop auto|asyncio|uvloop`` picks the event loop the process runs on. A
broker runs where ``asbp broker`` would: on ``ASBP_LOOP`` if set, else
``auto`` (uvloop where installed; gateway/ops/loops.py), so
``ASBP_LOOP=asyncio python bench/roundtrip.py`` measures every broker on
asyncio's loop. The baselines (``bare``, ``raw``) run on asyncio's loop, as
they always did, unless ``--loop`` says otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import dataclasses
import importlib.util
import logging
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the bench's processes import the gateway only when they serve it
    from gateway.config.model import BusBalance, EventLogMode, ResumeMode

# The checkout this script is in, before whatever checkout is installed: a broker
# process must run the code beside the bench that started it (an editable install
# of another checkout would otherwise serve its gateway instead).
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

HOST = "127.0.0.1"
#: Uvicorn's own default listen backlog, for a server not told another.
_UVICORN_BACKLOG = 2048

Ready = Callable[[int], None]

#: The event loops a server process can run on (``--loop``).
LOOPS = ("auto", "asyncio", "uvloop")


def chosen_loop(loop: str | None, *, broker: bool) -> str:
    """``asyncio`` or ``uvloop``: ``loop`` itself, or what ``auto`` (or no ``--loop``)
    resolves to. A broker's default is ``ASBP_LOOP`` or ``auto``, as for ``asbp
    broker``; a baseline's is asyncio's loop, as it ran before the broker moved.
    """
    if loop is None:
        loop = os.environ.get("ASBP_LOOP", "auto") if broker else "asyncio"
    if loop == "auto":
        return "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"
    return loop


def loop_factory(loop: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """A factory of ``loop`` (``asyncio`` or ``uvloop``) for ``asyncio.Runner``."""
    if loop == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop


# -- applications ------------------------------------------------------------


def broker_app(
    agent_id: str,
    agent_key: Path,
    broker_id: str,
    *,
    data_dir: Path,
    event_log: EventLogMode = "on",
    metrics: str = "on",
    redis_url: str | None = None,
    bus_balance: BusBalance = "in_flight",
    resume: ResumeMode = "auto",
) -> Any:
    from gateway.app import create_app
    from gateway.config.model import ChannelLimits, EventLogConfig, GatewayConfig, MetricsConfig

    config = GatewayConfig(
        host=HOST,
        port=0,
        broker_id=broker_id,
        data_dir=data_dir,
        insecure_dev_tubes=True,
        agents={agent_id: {"public_key": str(agent_key)}},
        agents_base_dir=agent_key.parent,
        # On by default, as a broker runs; off to measure what the log costs.
        event_log=EventLogConfig(mode=event_log),
        # On by default, as a broker runs; off to measure what the counting costs.
        metrics=MetricsConfig(enabled=metrics == "on"),
        bus_balance=bus_balance,
        # Resumable WebSocket Channels (bench/resume.py measures what they cost).
        channels=ChannelLimits(resume=resume),  # auto, on or off: checked by argparse
    )
    if redis_url is not None:
        # A Redis URL: the redis engine and, with it, the bus-wide routing plane.
        config = dataclasses.replace(config, engine="redis", redis_url=redis_url)
    return create_app(config)


def bare_relay_app() -> Any:
    """A Starlette app relaying /a <-> /b through Starlette's WebSocket class."""
    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute
    from starlette.websockets import WebSocket

    peers: dict[str, WebSocket] = {}

    def relay(me: str, other: str) -> Callable[[WebSocket], Awaitable[None]]:
        async def endpoint(websocket: WebSocket) -> None:
            await websocket.accept()
            peers[me] = websocket
            try:
                while True:
                    message = await websocket.receive()
                    if message["type"] == "websocket.disconnect":
                        break
                    peer = peers.get(other)
                    if peer is None:
                        continue  # nobody to relay to: dropped, as a relay would
                    data = message.get("bytes")
                    if data is not None:
                        await peer.send_bytes(data)
                    else:
                        await peer.send_text(message.get("text") or "")
            finally:
                if peers.get(me) is websocket:
                    del peers[me]

        return endpoint

    return Starlette(
        routes=[WebSocketRoute("/a", relay("a", "b")), WebSocketRoute("/b", relay("b", "a"))]
    )


# -- servers -----------------------------------------------------------------


async def run_hypercorn(
    app: Any, sock: socket.socket, ready: Ready, stop: asyncio.Event, *, backlog: int | None = None
) -> None:
    from hypercorn.asyncio.run import worker_serve
    from hypercorn.config import Config, Sockets
    from hypercorn.utils import wrap_app

    config = Config()
    if backlog is not None:
        config.backlog = backlog
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = 1.0
    config.alpn_protocols = ["http/1.1"]
    port = sock.getsockname()[1]

    async def shutdown_trigger() -> None:
        # worker_serve calls this once every socket accepts connections.
        ready(port)
        await stop.wait()

    sockets = Sockets(secure_sockets=[], insecure_sockets=[sock], quic_sockets=[])
    await worker_serve(
        wrap_app(app, config.wsgi_max_body_size, "asgi"),
        config,
        sockets=sockets,
        shutdown_trigger=shutdown_trigger,
    )


async def run_uvicorn(
    app: Any,
    sock: socket.socket,
    ready: Ready,
    stop: asyncio.Event,
    *,
    ws: Any = None,
    backlog: int | None = None,
) -> None:
    """Serve ``app`` on Uvicorn, with ``ws`` as its WebSocket protocol.

    ``None`` is stock ``websockets-sansio`` (the baselines); the broker passes the
    protocol gateway/ops/server.py runs it with.
    """
    import uvicorn

    port = sock.getsockname()[1]

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield  # signals are ours: see main()

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            ready(port)

    config = uvicorn.Config(
        app,
        http="h11",
        ws="websockets-sansio" if ws is None else ws,
        lifespan="on",
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=1,
        backlog=_UVICORN_BACKLOG if backlog is None else backlog,
    )
    server = Server(config)

    async def exit_on_stop() -> None:
        await stop.wait()
        server.should_exit = True

    watcher = asyncio.create_task(exit_on_stop())
    try:
        await server.serve(sockets=[sock])
    finally:
        watcher.cancel()


async def run_raw(sock: socket.socket, ready: Ready, stop: asyncio.Event) -> None:
    from websockets.asyncio.server import ServerConnection, serve

    peers: dict[str, ServerConnection] = {}

    async def handler(websocket: ServerConnection) -> None:
        path = websocket.request.path if websocket.request is not None else ""
        me, other = ("a", "b") if path == "/a" else ("b", "a")
        peers[me] = websocket
        try:
            async for message in websocket:
                peer = peers.get(other)
                if peer is not None:
                    await peer.send(message)
        finally:
            if peers.get(me) is websocket:
                del peers[me]

    sock.listen(128)
    async with serve(handler, sock=sock, compression=None):
        ready(sock.getsockname()[1])
        await stop.wait()


# -- process -----------------------------------------------------------------


def _announce(port: int) -> None:
    sys.stdout.write(f"READY {port}\n")
    sys.stdout.flush()


async def _main(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    stdin = sys.stdin.fileno()

    def on_stdin() -> None:
        if not os.read(stdin, 4096):  # EOF: the benchmark is done (or gone)
            loop.remove_reader(stdin)
            stop.set()

    loop.add_reader(stdin, on_stdin)

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, 0))
    if args.target == "raw":
        await run_raw(sock, _announce, stop)
        return
    run = run_hypercorn if args.server == "hypercorn" else run_uvicorn
    if args.target != "broker":
        await run(bare_relay_app(), sock, _announce, stop)
        return
    # As gateway/ops/server.py listens: a backlog as long as the bound on handshakes.
    from gateway.config.model import GatewayConfig
    from gateway.ops.server import listen_backlog

    app_config = GatewayConfig()
    # The event log's files go to a private directory, gone with the server.
    with tempfile.TemporaryDirectory(prefix="asbp-bench-") as data_dir:
        app = broker_app(
            args.agent_id,
            Path(args.agent_key),
            args.broker_id,
            data_dir=Path(data_dir),
            event_log=args.event_log,
            metrics=args.metrics,
            redis_url=args.redis_url,
            bus_balance=args.bus_balance,
            resume=args.resume,
        )
        if args.server == "uvicorn":
            # As gateway/ops/server.py serves the broker: writes coalesced, start-up frozen, full
            # collections rare (gateway/ops/collector.py).
            from gateway.ops.collector import tune_collector
            from gateway.transports.coalescing import CoalescingWebSocketProtocol

            tune_collector()
            await run_uvicorn(
                app,
                sock,
                _announce,
                stop,
                ws=CoalescingWebSocketProtocol,
                backlog=listen_backlog(app_config),
            )
        else:
            # As gateway/ops/server.py serves the broker: our WebSocket stream (the bare
            # relay runs on Hypercorn's own, as any other application would).
            from gateway.ops.collector import tune_collector
            from gateway.transports.hypercorn_ws import install

            install()
            tune_collector()
            await run_hypercorn(app, sock, _announce, stop, backlog=listen_backlog(app_config))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", choices=["broker", "bare", "raw"])
    parser.add_argument("--server", choices=["hypercorn", "uvicorn"], default="hypercorn")
    parser.add_argument("--agent-id", default="bench-agent")
    parser.add_argument("--agent-key", help="the agent's public key (PEM file)")
    parser.add_argument("--broker-id", default="bench-broker")
    parser.add_argument("--event-log", choices=["on", "off"], default="on")
    parser.add_argument("--metrics", choices=["on", "off"], default="on")
    parser.add_argument("--redis-url", help="the redis engine (and bus) on this Redis")
    parser.add_argument("--bus-balance", choices=["in_flight", "turns"], default="in_flight")
    parser.add_argument("--resume", choices=["auto", "on", "off"], default="auto")
    parser.add_argument("--cprofile", metavar="PATH", help="dump pstats here on stop")
    parser.add_argument(
        "--loop",
        choices=LOOPS,
        help="the event loop (a broker: ASBP_LOOP or auto; a baseline: asyncio)",
    )
    args = parser.parse_args()
    if args.target == "broker" and not args.agent_key:
        parser.error("broker needs --agent-key")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    profiler = cProfile.Profile() if args.cprofile else None
    if profiler is not None:
        profiler.enable()
    factory = loop_factory(chosen_loop(args.loop, broker=args.target == "broker"))
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(_main(args))
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.cprofile)


if __name__ == "__main__":
    main()
