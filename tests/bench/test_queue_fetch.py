"""bench/queue_fetch.py runs as a user runs it and prints its three figures and the ratio.

A smoke test, not a timed one: a few hundred messages, one repeat. It checks that
the engine's fetch and the native read with its lease both read every message
(each loop ends only when all arrived), so the figure quoted for lever B of issue
17, point 2 (bench/README.md, "queues.py") stays measurable.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.timing import T

ROOT = Path(__file__).resolve().parents[2]
FETCH = ROOT / "bench" / "queue_fetch.py"


def test_script_and_native_fetch_are_measured_side_by_side(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONASYNCIODEBUG"}
    env["PYTHONPATH"] = str(ROOT)
    run = subprocess.run(
        [sys.executable, str(FETCH), "--messages", "300", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=120 * T,
        env=env,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    out = run.stdout
    assert re.search(
        r"^median: script \d+\.\d\d us, native \d+\.\d\d us, read \d+\.\d\d us", out, re.MULTILINE
    ), out
    assert re.search(r"^script/native: median \d+\.\d\d ", out, re.MULTILINE), out
