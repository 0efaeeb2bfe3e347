"""What a browser sees when a broker refuses a message: the same on every server.

A real Chromium (agents/js/test/browser/close-codes.mjs) opens a WebSocket
Channel on a broker served by Hypercorn and on one served by Uvicorn (as
gateway/ops/server.py serves it: the coalescing protocol), sends a message one
byte over the servers' limit and reports the close event. Chromium offers
permessage-deflate, which both servers accept, so this is the path where each
server's WebSocket library reads every frame (gateway/transports/hypercorn_ws.py
on Hypercorn): the close code and reason must still be the same.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import asbp
from gateway.app import create_app
from gateway.config.model import GatewayConfig
from gateway.transports.websocket import max_message_bytes
from tests.support import T, serve_app
from tests.support.js import run_node

LIMITS = asbp.Limits(max_frame_bytes=16 * 1024)
MAX_MESSAGE = max_message_bytes(LIMITS)


def test_a_message_over_the_limit_closes_alike_on_every_server(tmp_path: Path) -> None:
    with contextlib.ExitStack() as stack:
        bases = []
        for server in ("hypercorn", "uvicorn"):
            app = create_app(
                GatewayConfig(broker_id=server, data_dir=tmp_path / server, limits=LIMITS)
            )
            running = stack.enter_context(
                serve_app(app, server=server, max_message_bytes=MAX_MESSAGE)
            )
            bases.append(running.http_url)
        done = run_node(
            ["test/browser/close-codes.mjs", str(MAX_MESSAGE + 1), *bases], timeout=90 * T
        )
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines[-1:] == ["ok"], f"{done.stdout}\n{done.stderr}"
    hypercorn, uvicorn = (json.loads(line) for line in lines[:-1])
    for seen in (hypercorn, uvicorn):
        # Each server's own parameters; compressed either way.
        assert seen.pop("extensions").startswith("permessage-deflate"), seen
    expected = {"code": 1009, "reason": f"frame exceeds limit of {MAX_MESSAGE} bytes"}
    assert hypercorn == uvicorn == expected
