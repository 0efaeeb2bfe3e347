"""bench/cluster_held.py --quick: frames for a held Channel on one Redis and on a Redis
Cluster, every one arrives at the holder (the benchmark checks), and the ratios are
printed.

A smoke test, not a timed one: the figures of a quick run are rough, and the
benchmark itself (``python bench/cluster_held.py``) is where they are measured.
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
        [sys.executable, str(ROOT / "bench" / "cluster_held.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=180 * T,
        env=env,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    for layout in ("one-redis", "cluster"):
        assert re.search(rf"^{layout} +[\d,]+ +\d+\.\d +\d+\.\d$", run.stdout, re.M), run.stdout
    assert re.search(r"^cluster / one-redis: frames/s \d+\.\d\d", run.stdout, re.M), run.stdout
