"""bench/api.py on a small bus: each size's page is checked against the baseline's
(the benchmark asserts they are the same page) and its ratio is printed.

A smoke test, not a timed one: the benchmark itself (``python bench/api.py``) is
where the figures are measured.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.timing import T

ROOT = Path(__file__).resolve().parents[2]


def test_a_small_run_prints_each_size_and_its_ratio() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONASYNCIODEBUG"}
    env["PYTHONPATH"] = str(ROOT)
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "api.py"), "--sizes", "0,250", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=120 * T,
        env=env,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    for size in ("0", "250"):
        pattern = (
            rf"^ +{size} Channels +ours +\d+\.\d\d ms .*baseline/ours +\d+\.\dx +API +\d+\.\d\d ms$"
        )
        assert re.search(pattern, run.stdout, re.MULTILINE), run.stdout
