"""bench/peers.py --quick: each case starts its peers and prints its ratios.

A smoke test, not a timed one: the figures of a quick run are rough, and the
benchmark itself (``python bench/peers.py``) is where they are measured. It
runs the benchmark as a user does, as a process: the benchmark installs the
peers it is missing (nats-server and rabbitmq-server with apt-get, nats-py and
aio-pika with pip), so CI needs no step of its own; that installation is
outside the run's deadline, since on a fresh machine it takes minutes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.timing import T

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / "bench" / "peers.py"
#: Each case's heading, as the benchmark prints it.
CASES = ("request/reply", "durable queues", "fan-out")
RATIO = re.compile(r"^  ratio .+ \d+\.\d\d ", re.MULTILINE)
GOAL = re.compile(r"^  goal .+: \d+\.\d\d, (met|missed)\b", re.MULTILINE)


def environment() -> dict[str, str]:
    # The brokers a benchmark starts run as deployed, not in asyncio's debug mode.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONASYNCIODEBUG"}
    env["PYTHONPATH"] = str(ROOT)
    return env


@pytest.fixture(scope="module")
def quick_run() -> str:
    install = subprocess.run(
        [sys.executable, str(PEERS), "--install-only"],
        capture_output=True,
        text=True,
        timeout=900 * T,
        env=environment(),
        cwd=ROOT,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    run = subprocess.run(
        [sys.executable, str(PEERS), "--quick"],
        capture_output=True,
        text=True,
        timeout=180 * T,
        env=environment(),
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    return run.stdout


def sections(output: str) -> dict[str, str]:
    """The output of each case, by its heading (``== request/reply: ... ==``)."""
    found = {}
    for part in output.split("\n== ")[1:]:
        heading = part.split(":", 1)[0]
        found[heading] = part
    return found


@pytest.mark.parametrize("case", CASES)
def test_each_case_prints_its_ratios(quick_run: str, case: str) -> None:
    section = sections(quick_run).get(case)
    assert section is not None, f"no {case!r} case in:\n{quick_run}"
    assert RATIO.search(section), section


@pytest.mark.parametrize("case", ["request/reply", "durable queues"])
def test_the_goals_of_the_issue_are_judged(quick_run: str, case: str) -> None:
    assert GOAL.search(sections(quick_run)[case]), sections(quick_run)[case]


def test_the_versions_are_stated(quick_run: str) -> None:
    versions = next(line for line in quick_run.splitlines() if line.startswith("versions: "))
    for name in ("nats-server", "rabbitmq-server", "nats-py", "aio-pika", "redis-server"):
        assert re.search(rf"\b{name} \d", versions), versions
