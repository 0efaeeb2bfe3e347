"""Fixtures shared by the whole suite."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """Run ``@pytest.mark.anyio`` tests on asyncio only: the gateway is asyncio-based."""
    return "asyncio"
