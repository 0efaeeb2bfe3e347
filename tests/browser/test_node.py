"""The TypeScript client's own tests (``node --test`` in agents/js/test), run by pytest.

They check the codec against tests/vectors/frames.json and the Client's state
machine against a real broker started here (its address in ``ASBP_URL``);
pytest runs them so that the README's test command covers the client too.
The bundle's size budget is checked here as well.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

from gateway.app import create_app
from gateway.config.model import ChannelLimits, GatewayConfig
from tests.support import T, serve_app
from tests.support.js import JS_ROOT, built_client, run_node

#: The minified, gzipped bundle's budget (issue 14).
BUNDLE_BUDGET = 12 * 1024


def test_node_test_runner_passes(tmp_path: Path) -> None:
    # The *.test.mjs files only: the browser scripts beside them are run by pytest.
    files = sorted(str(p.relative_to(JS_ROOT)) for p in (JS_ROOT / "test").glob("*.test.mjs"))
    assert len(files) >= 2
    # Resume on, so that a lone broker resumes the client's Channel (client.test.mjs).
    config = GatewayConfig(data_dir=tmp_path, channels=ChannelLimits(resume="on"))
    with serve_app(create_app(config)) as server:
        env = {**os.environ, "ASBP_URL": server.http_url}
        # Node 20 has a global WebSocket only behind this flag (Node 22 by default).
        done = run_node(["--experimental-websocket", "--test", *files], timeout=180 * T, env=env)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-4000:]
    assert "# fail 0" in done.stdout


def test_the_bundle_stays_under_its_size_budget() -> None:
    bundle = (built_client() / "dist" / "asbp.min.js").read_bytes()
    size = len(gzip.compress(bundle, compresslevel=9))
    print(f"asbp.min.js: {len(bundle)} bytes minified, {size} gzipped")
    assert size < BUNDLE_BUDGET
