"""Every test of asbp/ runs twice: with the C accelerator, then without.

``codec.decode`` tries ``asbp._speedups`` first when it was built; the pure
Python paths must give the same answers alone. The switch is
``codec.speedups_enabled``, set here for a whole pass of the suite (session
scope: Hypothesis refuses function-scoped fixtures around ``@given``, and one
switch per pass is all the parametrisation needs). tests/asbp/test_speedups.py
fails when the extension was not built, so the "speedups" pass never
silently runs pure Python.

A module whose tests call one decoder directly, or set the switch
themselves, can say so with ``DECODER_PASSES = ("speedups",)`` and run once.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from asbp import codec

#: Pass name -> the value of ``codec.speedups_enabled`` during that pass.
PASSES = {"speedups": True, "pure": False}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "speedups_enabled" in metafunc.fixturenames:
        names = getattr(metafunc.module, "DECODER_PASSES", tuple(PASSES))
        metafunc.parametrize(
            "speedups_enabled",
            [PASSES[name] for name in names],
            ids=names,
            indirect=True,
            scope="session",
        )


@pytest.fixture(scope="session", autouse=True)
def speedups_enabled(request: pytest.FixtureRequest) -> Iterator[bool]:
    """Whether ``decode`` tries the C accelerator in this pass."""
    saved = codec.speedups_enabled
    codec.speedups_enabled = request.param
    try:
        yield request.param
    finally:
        codec.speedups_enabled = saved
