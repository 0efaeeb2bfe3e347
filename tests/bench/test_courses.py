"""bench/courses.py --quick: both buses start, both figures and the outage counts print.

A smoke test, not a timed one: the figures of a quick run are rough, and the
benchmark itself (``python bench/courses.py``) is where they are measured.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.timing import T

ROOT = Path(__file__).resolve().parents[2]


def _as_a_user_would() -> dict[str, str]:
    """The environment without PYTHONPATH: ``python bench/courses.py`` from the
    checkout, as a user runs it, must find the checkout's packages by itself."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONASYNCIODEBUG", "PYTHONPATH")}


def test_a_quick_run_prints_the_ratio_the_drain_and_the_outage_counts() -> None:
    env = _as_a_user_would()
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "courses.py"), "--quick", "--outage", "1"],
        capture_output=True,
        text=True,
        timeout=180 * T,
        env=env,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert re.search(r"^  ratio two-buses / one-bus .+: \d+\.\d\d$", run.stdout, re.MULTILINE)
    assert re.search(r"^drain of a 1000-Command backlog: \d+ Commands/s", run.stdout, re.MULTILINE)
    counts = re.search(r": (\d+) sent, (\d+) delivered once and in order", run.stdout)
    assert counts is not None, run.stdout
    assert counts[1] == counts[2] and int(counts[1]) > 0


def test_a_quick_http2_run_prints_both_courses_beside_one_bus() -> None:
    env = _as_a_user_would()
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "courses.py"), "--quick", "--http2"],
        capture_output=True,
        text=True,
        timeout=180 * T,
        env=env,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "on TLS" in run.stdout
    # From the brokers' own course.up records: b.test is told never, c.test auto, and the
    # drains' d.test and e.test (through the relay, only receiving) the same.
    assert (
        "Courses: a.test->b.test HTTP/1.1, a.test->c.test HTTP/2, a.test->d.test HTTP/1.1, "
        "a.test->e.test HTTP/2, b.test->a.test HTTP/1.1, c.test->a.test HTTP/2"
    ) in run.stdout
    for line in (
        r"^two-buses-h2 +\d+ +\d+\.\d +\d+\.\d$",  # trips/s, CPU and bench us/trip
        r"^  ratio two-buses / one-bus .+: \d+\.\d\d$",
        r"^  ratio two-buses over HTTP/2 / one-bus .+: \d+\.\d\d$",
        r"^  ratio HTTP/2 Course / HTTP/1.1 Course .+: \d+\.\d\d$",
        r"^drain of a 1000-Command backlog over HTTP/2: \d+ Commands/s",
    ):
        assert re.search(line, run.stdout, re.MULTILINE), (line, run.stdout)
