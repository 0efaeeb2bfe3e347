"""bench/soak.py, CI-sized: 500 Channels with churn and traffic, no errors, memory in bounds.

The benchmark (``python bench/soak.py``: 10,000 Channels, 1,000 connects/s for
60 s) is where the figures come from. This runs it as a user does, as a
process, at a size the suite affords: the Channels held, churned and pinged,
the topic messages each received by every subscriber, and the broker's idle
memory per Channel within 2.5 times a plain ``websockets`` server's. Memory,
unlike time, does not depend on how busy the machine is.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.timing import T

ROOT = Path(__file__).resolve().parents[2]
SOAK = ROOT / "bench" / "soak.py"


def test_a_small_soak_has_no_errors_and_idle_channels_cost_at_most_2_5_raw() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONASYNCIODEBUG"}
    env["PYTHONPATH"] = str(ROOT)
    small = ["--channels", "500", "--rate", "250", "--seconds", "3", "--subscribers", "10"]
    run = subprocess.run(
        [sys.executable, str(SOAK), *small],
        capture_output=True,
        text=True,
        timeout=300 * T,
        env=env,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    out = run.stdout
    assert re.search(r"^  errors: 0$", out, re.MULTILINE), out
    (ratio,) = re.findall(r"ratio broker/hypercorn / raw-websockets: (\d+\.\d+)", out)
    assert 0 < float(ratio) <= 2.5, out
    (connects,) = re.findall(r"connects ([\d,]+) ", out)
    assert int(connects.replace(",", "")) > 0, out
    published, subscribers, received = map(
        int, re.findall(r"topic messages (\d+) x (\d+) subscribers \((\d+) received\)", out)[0]
    )
    assert published > 0 and received == published * subscribers, out
    # The server's log is kept apart from the report: nothing in it may be an error.
    assert re.search(r"^  server log: \d+ lines, 0 errors or tracebacks$", out, re.MULTILINE), out
