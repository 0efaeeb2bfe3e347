"""bench/resume.py --quick: the replay and the cost run, and their ratios are printed.

A smoke test, not a timed one: the figures of a quick run are rough, and the
benchmark itself (``python bench/resume.py``) is where they are measured.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.timing import T

ROOT = Path(__file__).resolve().parents[2]


def test_quick_run_prints_the_ratios() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONASYNCIODEBUG"}
    env["PYTHONPATH"] = str(ROOT)
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "resume.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=180 * T,
        env=env,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    out = run.stdout
    assert re.search(r"^  resume +[\d,]+ Commands/s", out, re.MULTILINE), out
    assert re.search(r"^  XRANGE baseline +[\d,]+ Commands/s", out, re.MULTILINE), out
    assert re.search(r"^  ratio resume / XRANGE: \d+\.\d\d$", out, re.MULTILINE), out
    pattern = r"^  ratio on / off: throughput \d+\.\d\d, p50 \d+\.\d\d$"
    assert re.search(pattern, out, re.MULTILINE), out
