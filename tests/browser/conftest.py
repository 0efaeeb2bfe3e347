"""Fixtures for the browser tests: ``asbp demo`` as a user runs it, on a free port."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import listen_port
from tests.support.demo import Demo


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    """``asbp demo`` on a free port, stopped (by its PID) after the test."""
    running = Demo(port=listen_port(), data_dir=tmp_path / "demo")
    running.start()
    try:
        yield running
    finally:
        running.stop()
