"""The TypeScript client in agents/js: built once per test session, run with Node.

``npm ci --prefix agents/js`` (scripts/test and .ci/run do it) installs the
client's development packages; :func:`built_client` then runs its build once
per session (``tsc`` and the ``esbuild`` bundle) and returns the package's
folder. :func:`run_node` runs a Node script with a deadline and returns what
it printed. The browser tests drive Chromium from Node scripts through
agents/js/test/browser.mjs (see there): the same helper serves any test that
needs a page.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path
from typing import Final

__all__ = ["CHROMIUM", "JS_ROOT", "built_client", "node", "run_node"]

#: The client's npm package.
JS_ROOT: Final = Path(__file__).parents[2] / "agents" / "js"
#: Debian's chromium: playwright-core cannot download a browser here.
CHROMIUM: Final = Path("/usr/bin/chromium")


def node() -> str:
    """The ``node`` executable (Node 20 or later), or an error saying what to install."""
    found = shutil.which("node")
    if found is None:
        raise RuntimeError("node is required for the TypeScript client's tests (Node 20+)")
    return found


@functools.cache
def built_client() -> Path:
    """Build agents/js once per session (``npm run build``) and return its folder."""
    if not (JS_ROOT / "node_modules").is_dir():
        raise RuntimeError("run `npm ci --prefix agents/js` first (scripts/test does)")
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is required for the TypeScript client's tests")
    subprocess.run([npm, "run", "--silent", "build"], cwd=JS_ROOT, check=True, timeout=300)
    return JS_ROOT


def run_node(
    args: list[str], *, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``node args...`` in agents/js and return it finished (not checked)."""
    return subprocess.run(
        [node(), *args],
        cwd=built_client(),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
