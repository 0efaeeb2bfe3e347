"""The event loop the suite's in-process servers and async tests run on.

``ASBP_TEST_LOOP=uvloop`` runs them on uvloop, the loop a broker runs on by
default (gateway/ops/loops.py): the servers' threads (tests/support/servers.py)
and the ``@pytest.mark.anyio`` tests (tests/conftest.py) alike, so that what the
transports do beneath ASGI (gateway/transports/) is checked on uvloop's
transports as well as on asyncio's. Unset, or ``asyncio``: asyncio's own loop.
The brokers the suite starts as processes (``python -m gateway``) run on their
default, ``auto``, which is uvloop wherever the suite runs.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Final

__all__ = ["TEST_LOOP_ENV", "suite_loop", "suite_loop_factory"]

#: The environment variable naming the loop (``asyncio`` or ``uvloop``).
TEST_LOOP_ENV: Final = "ASBP_TEST_LOOP"


def suite_loop() -> str:
    """``asyncio`` or ``uvloop``, as ``ASBP_TEST_LOOP`` asks (asyncio by default)."""
    loop = os.environ.get(TEST_LOOP_ENV, "asyncio")
    if loop not in ("asyncio", "uvloop"):
        raise ValueError(f"{TEST_LOOP_ENV}={loop!r}: asyncio or uvloop")
    return loop


def suite_loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """A factory of the loop :func:`suite_loop` names, for ``asyncio.Runner``."""
    if suite_loop() == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop
