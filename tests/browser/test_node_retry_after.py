"""The TypeScript client's long-poll transport honours ``Retry-After``.

A broker (in this process) that lets an address open one HTTP Channel a second
(``channels.http_opens_per_second = 1``); agents/js/test/retry_after.mjs opens one
Channel, then a second, whose first POST is answered 429 with ``Retry-After: 1``
and fault 2108. The second Client must ask for a delay of at least that second
before its next attempt (before: its backoff of 10 to 20 ms, so dozens of refused
POSTs within the second), and then open. Only long-poll: a browser's WebSocket
API shows neither the status nor the headers of a refused handshake.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from gateway.app import create_app
from gateway.config.model import ChannelLimits, GatewayConfig
from tests.support import T, serve_app
from tests.support.js import run_node


def test_a_long_poll_client_waits_the_retry_after_of_a_429(tmp_path: Path) -> None:
    config = GatewayConfig(data_dir=tmp_path, channels=ChannelLimits(http_opens_per_second=1))
    with serve_app(create_app(config)) as server:
        env = {**os.environ, "ASBP_URL": server.http_url}
        done = run_node(["test/retry_after.mjs"], timeout=60 * T, env=env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    summary = orjson.loads(done.stdout.splitlines()[-1])
    print(f"TypeScript client turned away with 429: {summary}")
    assert summary["ping"] == "lp", summary
    assert summary["refused"] == 1, summary
    assert summary["delays"][0] >= 1000, summary
    assert summary["waited"] >= 1000, summary
