"""docs/javascript.md's snippets, run against ``asbp demo``: the Node script and the page.

The Node snippet runs as written, importing ``@asbp/client`` from a folder whose
``node_modules`` links to agents/js (what ``npm install ../path/to/agents/js``
makes); the HTML snippet is served at the broker's origin to Chromium.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tests.support import T
from tests.support.demo import Demo
from tests.support.js import built_client, run_node

DOC = Path(__file__).resolve().parents[2] / "docs" / "javascript.md"


def snippet(language: str) -> str:
    blocks = re.findall(rf"^```{language}\n(.*?)^```$", DOC.read_text(), re.MULTILINE | re.DOTALL)
    assert len(blocks) == 1, f"one ```{language} block in docs/javascript.md"
    return str(blocks[0])


def test_the_node_snippet_runs_as_documented(demo: Demo, tmp_path: Path) -> None:
    app = tmp_path / "my-app"
    (app / "node_modules" / "@asbp").mkdir(parents=True)
    (app / "node_modules" / "@asbp" / "client").symlink_to(built_client())
    (app / "hello.mjs").write_text(snippet("js"))
    env = {**os.environ, "ASBP_URL": demo.base + "/asbp"}
    done = run_node(["--experimental-websocket", str(app / "hello.mjs")], timeout=60 * T, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "echo.reply: hello" in lines
    assert sum(line.startswith("tick ") for line in lines) == 3
    for expected in ("fault 2101", "alice bob", "news: goal!", "job: job 1"):
        assert expected in lines, done.stdout
    assert lines[:2] == ["state: connecting", "state: open"]


def test_the_page_snippet_talks_to_the_example_agent(demo: Demo, tmp_path: Path) -> None:
    page = tmp_path / "page.html"
    page.write_text(snippet("html"))
    done = run_node(["test/browser/html-page.mjs", demo.base, str(page)], timeout=60 * T)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr
