"""bench/fuzz.py, CI-sized: every target fuzzed for a few thousand inputs, none failing.

The benchmark (``python bench/fuzz.py``, a million inputs) is where the figures
come from; this runs it as a user does, as a process, small enough for the
suite, and checks that a failure would be seen: the canary target fails on
purpose and must be reported, with its input saved.
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
FUZZ = ROOT / "bench" / "fuzz.py"
ROW = re.compile(r"^(\S+)\s+([\d,]+)\s+[\d.]+\s+[\d,]+\s+(\d+)$", re.MULTILINE)
RUNS = 1_500


def fuzz(out: Path, *targets: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONASYNCIODEBUG"}
    env["PYTHONPATH"] = str(ROOT)
    command = [sys.executable, str(FUZZ), "--runs", str(RUNS), "--out", str(out), "--targets"]
    return subprocess.run(
        [*command, *targets],
        capture_output=True,
        text=True,
        timeout=240 * T,
        env=env,
        cwd=ROOT,
    )


def rows(stdout: str) -> dict[str, tuple[int, int]]:
    return {m[1]: (int(m[2].replace(",", "")), int(m[3])) for m in ROW.finditer(stdout)}


@pytest.fixture(scope="module")
def every_target(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    out = tmp_path_factory.mktemp("fuzz")
    run = fuzz(out, "decode-c", "decode-pure", "http", "websocket", "parse_qsl")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    return run.stdout, out


@pytest.mark.parametrize("target", ["decode-c", "decode-pure", "http", "websocket", "parse_qsl"])
def test_every_entry_point_takes_fuzzed_input_without_a_non_protocol_exception(
    target: str, every_target: tuple[str, Path]
) -> None:
    stdout, out = every_target
    assert rows(stdout)[target] == (RUNS, 0), stdout
    assert "non-protocol exceptions and other failures: 0" in stdout
    assert not list(out.glob(f"{target}-*.bin"))


def test_a_failure_is_counted_and_its_input_saved(tmp_path: Path) -> None:
    run = fuzz(tmp_path, "canary")
    assert run.returncode == 1, run.stdout[-4000:] + run.stderr[-4000:]
    inputs, failures = rows(run.stdout)["canary"]
    assert inputs == RUNS and 0 < failures < RUNS
    assert "FAILURE canary: LookupError at fuzz.py:" in run.stdout
    (saved,) = tmp_path.glob("canary-*.bin")
    assert len(saved.read_bytes()) % 2 == 1  # the input that failed, as it was
    assert "the canary" in Path(f"{saved}.txt").read_text()
