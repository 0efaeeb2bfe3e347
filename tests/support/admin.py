"""The ``asbp`` command line run as a user runs it: a real process, a clean environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gateway.config.fields import FOREIGN_ENV_VARS
from tests.support.timing import T

__all__ = ["asbp_cli", "clean_environ"]


def clean_environ() -> dict[str, str]:
    """This environment without ``ASBP_*`` settings from the developer's shell."""
    return {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("ASBP_") or name in FOREIGN_ENV_VARS
    }


def asbp_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``asbp ARGS``: the console script's module, so this checkout's code runs."""
    return subprocess.run(
        [sys.executable, "-m", "gateway.ops.cli", *args],
        cwd=cwd,
        env=clean_environ(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=20 * T,
    )
