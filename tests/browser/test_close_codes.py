"""What a browser sees when a broker refuses a message: the same on every server.

A real Chromium (agents/js/test/browser/close-codes.mjs) opens a WebSocket
Channel on a broker served by Hypercorn and on one served by Uvicorn (as
gateway/ops/server.py serves them: our WebSocket stream on Hypercorn, the
coalescing protocol on Uvicorn), sends a message one byte over the servers'
limit and reports the close event: the same code and reason from both. Chromium
offers permessage-deflate; both decline it, as the broker does by default
(websocket_compression), so both refuse the message from its frame header.
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
    expected = {
        "code": 1009,
        "reason": f"frame with {MAX_MESSAGE + 1} bytes exceeds limit of {MAX_MESSAGE} bytes",
        "extensions": "",  # offered, declined
    }
    assert hypercorn == uvicorn == expected
