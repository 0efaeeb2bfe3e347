"""gateway/ops/loops.py: which event loop a broker runs on.

End to end (``asbp broker --loop``, the ``listening`` line, a round trip on each loop,
an install without uvloop) in tests/gateway/ops/test_cli.py.
"""

from __future__ import annotations

import asyncio
import os
import sys

import pytest
import uvloop

from gateway.config import ConfigError
from gateway.config.model import GatewayConfig, LoopName
from gateway.ops.loops import (
    RunningLoop,
    chosen_loop,
    loop_factory,
    run,
    running_loop,
    uvloop_installed,
)


@pytest.fixture
def without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    """uvloop cannot be imported, as on PyPy, Windows or an install that left it out:
    None in ``sys.modules`` is how Python blocks an import."""
    monkeypatch.setitem(sys.modules, "uvloop", None)


def test_the_default_is_auto() -> None:
    assert GatewayConfig().loop == "auto"


@pytest.mark.parametrize(
    ("setting", "runs"), [("auto", "uvloop"), ("uvloop", "uvloop"), ("asyncio", "asyncio")]
)
def test_with_uvloop_installed(setting: LoopName, runs: RunningLoop) -> None:
    assert uvloop_installed()
    assert chosen_loop(setting) == runs


@pytest.mark.usefixtures("without_uvloop")
def test_without_uvloop_auto_runs_asyncio_and_uvloop_is_refused() -> None:
    assert not uvloop_installed()
    assert chosen_loop("auto") == chosen_loop("asyncio") == "asyncio"
    with pytest.raises(ConfigError, match='loop = "uvloop" but uvloop is not installed'):
        chosen_loop("uvloop")
    with pytest.raises(ConfigError):
        loop_factory("uvloop")
    assert loop_factory("auto") is asyncio.new_event_loop


@pytest.mark.parametrize(
    ("setting", "runs"), [("auto", "uvloop"), ("uvloop", "uvloop"), ("asyncio", "asyncio")]
)
def test_run_runs_on_the_loop_chosen(setting: LoopName, runs: RunningLoop) -> None:
    async def main() -> tuple[RunningLoop, type[asyncio.AbstractEventLoop]]:
        loop = asyncio.get_running_loop()
        return running_loop(), type(loop)

    name, kind = run(main, setting)
    assert name == runs
    assert issubclass(kind, uvloop.Loop) == (runs == "uvloop")


@pytest.mark.usefixtures("without_uvloop")
def test_run_refuses_a_missing_uvloop_before_making_a_coroutine() -> None:
    made: list[str] = []

    async def main() -> None:
        made.append("ran")

    with pytest.raises(ConfigError):
        run(main, "uvloop")
    assert made == []  # no coroutine left never awaited (filterwarnings = error)


def test_running_loop_names_a_loop_it_is_given() -> None:
    for make, name in ((asyncio.new_event_loop, "asyncio"), (uvloop.new_event_loop, "uvloop")):
        loop = make()
        try:
            assert running_loop(loop) == name
        finally:
            loop.close()


@pytest.mark.anyio
async def test_the_suite_runs_on_the_loop_it_was_asked_for() -> None:
    # tests/conftest.py: ASBP_TEST_LOOP=uvloop puts the in-process servers on uvloop.
    wanted = "uvloop" if os.environ.get("ASBP_TEST_LOOP") == "uvloop" else "asyncio"
    assert running_loop() == wanted
