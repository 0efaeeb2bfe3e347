"""bench/queue_commandstats.py runs as a user runs it and names the scripts it profiles.

A smoke test, not a timed one: a few hundred messages through a real broker on a
private redis-server. It checks that the profile of issue 17, point 2 (bench/README.md,
"queues.py", sixth round) stays readable: every script the broker path calls per
message is named (not left as a SHA-1) with the commands it made counted under it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.timing import T

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "bench" / "queue_commandstats.py"


def test_the_broker_path_is_profiled_script_by_script(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONASYNCIODEBUG"}
    env["PYTHONPATH"] = str(ROOT)
    run = subprocess.run(
        [sys.executable, str(PROFILE), "--messages", "400", "--by-key"],
        capture_output=True,
        text=True,
        timeout=120 * T,
        env=env,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    out = run.stdout
    assert re.search(r"^evalsha +\d+\.\d{3} +\d+\.\d\d$", out, re.MULTILINE), out
    for script in ("enqueue", "fetch", "ack", "log_held_append"):
        assert re.search(rf"^script {script} +\d+\.\d{{3}} ", out, re.MULTILINE), out
    # The queue's XADDs counted under the script that made them, by their key's kind.
    assert re.search(r"^    xadd asbp:q +1\.000 per message$", out, re.MULTILINE), out
    assert re.search(r"^redis-server CPU per message: \d+\.\d\d us$", out, re.MULTILINE), out
