"""The TypeScript client's own tests (``node --test`` in agents/js/test), run by pytest.

They check the codec against tests/vectors/frames.json and the client's state
machine against a WebSocket server in Node; pytest runs them so that the
README's test command covers the client too.
"""

from __future__ import annotations

from tests.support import T
from tests.support.js import run_node


def test_node_test_runner_passes() -> None:
    done = run_node(["--test", "test/"], timeout=120 * T)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "# fail 0" in done.stdout
