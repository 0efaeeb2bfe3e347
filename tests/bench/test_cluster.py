"""bench/cluster.py on the two-brokers path alone (``--no-queues --no-http
--no-cluster``), with ``--hold`` and ``--cprofile``: the layouts run, the held
round trips are reported with both brokers' pids, each repeat's ratio is
printed, and each broker leaves its profile.

A smoke test, not a timed one: the figures of so short a run are rough, and the
benchmark itself (``python bench/cluster.py``) is where they are measured.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.timing import T

ROOT = Path(__file__).resolve().parents[2]


def test_the_two_brokers_path_alone_held_and_profiled(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONASYNCIODEBUG"}
    env["PYTHONPATH"] = str(ROOT)
    args = ["--repeats", "1", "--no-queues", "--no-http", "--no-cluster", "--warmup", "10"]
    args += ["--trips", "20", "--requests", "300", "--window", "20", "--hold", "0.2"]
    args += ["--cprofile", str(tmp_path)]
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "cluster.py"), *args],
        capture_output=True,
        text=True,
        timeout=180 * T,
        env=env,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    out = run.stdout
    assert re.search(r"^holding two-brokers .* A pid \d+, .* B pid \d+$", out, re.M), out
    assert re.search(r"^held: \d+ round trips in ", out, re.M), out
    assert re.search(r"^two-brokers / one-broker, pipelined Commands/s: \d+\.\d\d", out, re.M)
    assert re.search(r"^  per repeat: ratio \d+\.\d\d; two-brokers broker CPU", out, re.M), out
    assert "two-on-cluster" not in out and "HTTP layout" not in out, out
    assert (tmp_path / "a.pstats").stat().st_size > 0
    assert (tmp_path / "b.pstats").stat().st_size > 0


def test_the_hold_alone_leaves_its_profiles_and_reports_nothing(tmp_path: Path) -> None:
    # ``--repeats 0``: the way to profile the two-brokers layout alone (the one-broker
    # layout's trips would be in broker A's profile); it used to end in StatisticsError.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONASYNCIODEBUG"}
    env["PYTHONPATH"] = str(ROOT)
    args = ["--repeats", "0", "--no-queues", "--no-http", "--no-cluster", "--warmup", "10"]
    args += ["--hold", "0.2", "--cprofile", str(tmp_path)]
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "cluster.py"), *args],
        capture_output=True,
        text=True,
        timeout=180 * T,
        env=env,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert re.search(r"^held: \d+ round trips in ", run.stdout, re.M), run.stdout
    assert "--repeats 0: nothing measured to report" in run.stdout
    assert (tmp_path / "a.pstats").stat().st_size > 0
    assert (tmp_path / "b.pstats").stat().st_size > 0


def test_queues_only_wants_the_cluster() -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "cluster.py"), "--queues-only", "--no-cluster"],
        capture_output=True,
        text=True,
        timeout=60 * T,
        cwd=ROOT,
    )
    assert run.returncode == 2, run.stderr
    assert "--queues-only compares against the cluster" in run.stderr
