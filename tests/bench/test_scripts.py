"""Every benchmark runs as its docs say: ``python bench/<name>.py`` from a checkout.

The scripts import each other by bare name (bench/ is their ``sys.path[0]``) and
``tests.support`` once they have put the checkout on the path; an import placed
before that line works under the test suite's PYTHONPATH and fails for a user
(bench/courses.py and bench/cluster.py each shipped that way once). ``--help``
imports every module a script needs and exits before measuring anything.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p for p in (ROOT / "bench").glob("*.py") if not p.name.startswith("_"))


def test_there_are_benchmarks_to_check() -> None:
    assert len(SCRIPTS) >= 20, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_benchmark_starts_without_pythonpath(script: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONASYNCIODEBUG")}
    done = subprocess.run(
        [sys.executable, str(script), "--help"],
        cwd=tmp_path,  # not the checkout: only what the script puts on sys.path counts
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
