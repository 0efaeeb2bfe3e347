"""Fixtures shared by the whole suite, and the Hypothesis profiles.

Hypothesis profiles: ``dev`` (the default, quick) and ``ci`` (used when the
``CI`` environment variable is set: three times the examples, no derandomizing,
and a reproduction blob printed for every failure). Three, not ten: at 2,000
examples the protocol core's properties took four of the suite's minutes, run
twice (pure and C codec); bench/fuzz.py (atheris) goes deeper where depth
is the point. ``HYPOTHESIS_PROFILE`` picks a profile by name and wins over both.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from tests.support.loops import suite_loop, suite_loop_factory
from tests.support.redis_cluster import RedisCluster

settings.register_profile("ci", max_examples=600, deadline=None, derandomize=False, print_blob=True)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if "CI" in os.environ else "dev")
)


@pytest.fixture(scope="session")
def anyio_backend() -> str | tuple[str, dict[str, object]]:
    """Run ``@pytest.mark.anyio`` tests on asyncio only: the gateway is asyncio-based.

    On asyncio's own loop by default; ``ASBP_TEST_LOOP=uvloop`` runs them, and the
    in-process servers, on uvloop (tests/support/loops.py).
    """
    if suite_loop() == "uvloop":
        return ("asyncio", {"loop_factory": suite_loop_factory()})
    return "asyncio"


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """One private six-node Redis Cluster for the session, started by the first test
    that asks for it (tests/support/redis_cluster.py); tests that break it (failover,
    slot migration) start their own."""
    with RedisCluster(tmp_path_factory.mktemp("redis-cluster")) as cluster:
        yield cluster
