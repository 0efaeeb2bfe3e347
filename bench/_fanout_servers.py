"""The servers under test for bench/fanout.py, one per process.

    python bench/_fanout_servers.py TARGET [--server hypercorn|uvicorn]

Each one fans a trigger out to every subscriber; TARGET is one of:

``broker``
    The real broker (``gateway.app.create_app``, memory engine). Subscribers
    open ``/asbp`` and send ``asbp.subscribe``; the publisher sends
    ``asbp.publish`` on the same topic.
``raw``
    Plain ``websockets`` (``websockets.asyncio.server``): a connection on
    ``/sub`` is added to the set of subscribers and gets ``ok``; each message
    on ``/pub`` goes to all of them with ``websockets.broadcast``, which writes
    to every transport synchronously. ``--server`` does not apply.
``loop``
    The naive fan-out on an ASGI server: Starlette WebSocket endpoints, each
    message on ``/pub`` sent with ``await websocket.send_bytes()`` to one
    subscriber after the other.
``socketio``
    ``socketio.AsyncServer(async_mode="asgi")``: a client connecting with the
    auth payload ``{"role": "sub"}`` enters the room ``subs``; each ``pub``
    event is emitted as ``m`` to that room.

The listening socket is bound here to 127.0.0.1 port 0. Once the server
accepts connections this prints ``READY <port>`` on stdout; the benchmark
waits for that line, never for a timer. The server stops when its standard
input closes (the benchmark closes it, or dies) or on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

# This directory is sys.path[0] when run as a script: the ASGI server runners
# are roundtrip's (bench/_servers.py), so both benchmarks serve alike.
from _servers import HOST, LOOPS, Ready, chosen_loop, loop_factory, run_hypercorn, run_uvicorn

#: The raw server's backlog (Uvicorn and Hypercorn use their own, 2048 and 100):
#: the benchmark opens its connections a few dozen at a time.
BACKLOG = 1024


# -- applications ------------------------------------------------------------


def broker_app(broker_id: str, data_dir: Path) -> Any:
    from gateway.app import create_app
    from gateway.config.model import ChannelLimits, GatewayConfig

    # Every subscriber connects from 127.0.0.1: no per-address limit on Channels.
    config = GatewayConfig(
        host=HOST,
        port=0,
        broker_id=broker_id,
        data_dir=data_dir,
        channels=ChannelLimits(max_per_address=0),
    )
    return create_app(config)


def loop_app() -> Any:
    """Starlette endpoints: ``/sub`` registers, ``/pub`` awaits a send to each in turn."""
    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute
    from starlette.websockets import WebSocket, WebSocketDisconnect

    subscribers: set[WebSocket] = set()

    async def sub(websocket: WebSocket) -> None:
        await websocket.accept()
        subscribers.add(websocket)
        await websocket.send_bytes(b"ok")
        try:
            while (await websocket.receive())["type"] != "websocket.disconnect":
                pass
        finally:
            subscribers.discard(websocket)

    async def pub(websocket: WebSocket) -> None:
        await websocket.accept()
        try:
            while True:
                message = await websocket.receive_bytes()
                for subscriber in list(subscribers):
                    await subscriber.send_bytes(message)
        except WebSocketDisconnect:
            pass

    return Starlette(routes=[WebSocketRoute("/sub", sub), WebSocketRoute("/pub", pub)])


def socketio_app() -> Any:
    import socketio

    sio = socketio.AsyncServer(async_mode="asgi", logger=False, engineio_logger=False)

    @sio.event  # type: ignore[untyped-decorator]  # python-socketio ships no types
    async def connect(sid: str, environ: dict[str, Any], auth: Any = None) -> None:
        if isinstance(auth, dict) and auth.get("role") == "sub":
            # Before the server's CONNECT reply: a subscriber that has it is in the room.
            await sio.enter_room(sid, "subs")

    @sio.on("pub")  # type: ignore[untyped-decorator]  # python-socketio ships no types
    async def pub(sid: str, data: Any) -> None:
        await sio.emit("m", data, room="subs")

    return socketio.ASGIApp(sio)


async def run_raw(sock: socket.socket, ready: Ready, stop: asyncio.Event) -> None:
    from websockets.asyncio.server import ServerConnection, broadcast, serve

    subscribers: set[ServerConnection] = set()

    async def handler(websocket: ServerConnection) -> None:
        path = websocket.request.path if websocket.request is not None else ""
        if path == "/sub":
            subscribers.add(websocket)
            try:
                await websocket.send(b"ok")
                async for _ in websocket:
                    pass
            finally:
                subscribers.discard(websocket)
        else:
            async for message in websocket:
                broadcast(subscribers, message)

    sock.listen(BACKLOG)
    async with serve(handler, sock=sock, compression=None, max_queue=None):
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
    if args.target == "broker":
        with tempfile.TemporaryDirectory(prefix="asbp-fanout-") as data_dir:
            app = broker_app("bench-fanout", Path(data_dir))
            # As gateway/ops/server.py serves the broker: start-up frozen, and on Uvicorn
            # its writes coalesced.
            gc.freeze()
            if args.server == "uvicorn":
                from gateway.transports.coalescing import CoalescingWebSocketProtocol

                await run_uvicorn(app, sock, _announce, stop, ws=CoalescingWebSocketProtocol)
            else:
                # Our WebSocket stream, as gateway/ops/server.py installs it.
                from gateway.transports.hypercorn_ws import install

                install()
                await run(app, sock, _announce, stop)
    elif args.target == "loop":
        await run(loop_app(), sock, _announce, stop)
    else:
        await run(socketio_app(), sock, _announce, stop)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", choices=["broker", "raw", "loop", "socketio"])
    parser.add_argument("--server", choices=["hypercorn", "uvicorn"], default="hypercorn")
    parser.add_argument(
        "--loop",
        choices=LOOPS,
        help="the event loop (the broker: ASBP_LOOP or auto; the baselines: asyncio)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    # As bench/_servers.py: the broker on the loop `asbp broker` would pick.
    factory = loop_factory(chosen_loop(args.loop, broker=args.target == "broker"))
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(_main(args))


if __name__ == "__main__":
    main()
