"""gateway.ops.collector: start-up frozen, full collections rare, the young generations
as they were. Run in a child process: the test process's collector is left alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gateway.ops.collector import FULL_COLLECTION_THRESHOLD
from tests.support import T

#: The repository's root: ``python -c`` imports from its working directory.
ROOT = Path(__file__).resolve().parents[3]

_CHILD = """
import gc
from gateway.ops.collector import tune_collector
gc.set_threshold(500, 7, 10)
before = gc.get_freeze_count()
tune_collector()
print(*gc.get_threshold(), before, gc.get_freeze_count())
"""


def test_tune_collector_freezes_start_up_and_defers_full_collections() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD],
        capture_output=True,
        text=True,
        check=True,
        timeout=30 * T,
        cwd=ROOT,
    )
    young, middle, full, before, after = map(int, done.stdout.split())
    assert (young, middle, full) == (500, 7, FULL_COLLECTION_THRESHOLD)
    assert before == 0
    assert after > 0
