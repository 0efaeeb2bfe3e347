"""bench/queues.py with ``broker-noresume``: both brokers run and their ratios print.

A smoke test, not a timed one: a few hundred messages through each target, as a
user runs the benchmark (a process). It checks that the broker started with
``[channels] resume = "off"`` carries every message and is reported beside the
default broker, so the Channel log's share of Redis's work (issue 17, point 2)
stays measurable.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.timing import T

ROOT = Path(__file__).resolve().parents[2]
QUEUES = ROOT / "bench" / "queues.py"


def test_broker_noresume_is_measured_beside_the_broker(tmp_path: Path) -> None:
    # The brokers a benchmark starts run as deployed, not in asyncio's debug mode.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONASYNCIODEBUG"}
    env["PYTHONPATH"] = str(ROOT)
    command = [sys.executable, str(QUEUES), "--messages", "300", "--repeats", "1"]
    run = subprocess.run(
        [*command, "--targets", "broker", "broker-noresume"],
        capture_output=True,
        text=True,
        timeout=120 * T,
        env=env,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    out = run.stdout
    for name in ("broker", "broker-noresume"):
        assert re.search(rf"^ratio {name}/raw: median \d+\.\d\d ", out, re.MULTILINE), out
        assert re.search(
            rf"^redis-server CPU per message, {name}/raw: median \d+\.\d\d ", out, re.MULTILINE
        ), out
    # Only the default broker's ratios are held to the goal.
    for line in out.splitlines():
        if "broker-noresume/raw" in line:
            assert "goal" not in line, line
        elif line.startswith("ratio broker/raw"):
            assert "goal" in line, line
