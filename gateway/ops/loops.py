"""The event loop the broker runs on: uvloop where it can, asyncio's own otherwise.

Why
---
Every time the broker wakes (a socket readable, a flush due, a Redis reply
in) it goes through the event loop, and uvloop's loop is C over libuv where
asyncio's is Python over a selector. The lead measured a Redis PING round
trip's process CPU at about 66 µs on asyncio's loop against 48 on uvloop
(redis-py), 45 against 32 with a bare ``asyncio.Protocol``; on the broker, a
round trip at a time costs about a fifth less CPU on uvloop, and pipelined
load, where one wake-up carries many Commands, about the same
(bench/README.md, "The broker on uvloop"). Uvicorn's ``loop="auto"`` and Hypercorn's
``worker_class="uvloop"`` pick it the same way, but neither applies here: the
broker runs its server *inside* its own loop (:func:`gateway.ops.server.serve`
under ``asyncio.Runner``), so the loop is chosen here, by the ``loop``
setting, before anything runs.

``auto`` takes uvloop when it can be imported (a dependency on CPython outside
Windows, so an ordinary install has it) and asyncio's loop otherwise (PyPy,
Windows, an install that left it out). ``asyncio`` and ``uvloop`` pin one;
``uvloop`` without uvloop installed is a configuration error, not a silent
fallback. The ``listening`` log line names the loop that actually runs
(:func:`running_loop`), never ``auto``.

What the broker does beneath the ASGI servers holds on both loops, and the
suite checks it on both (the brokers it starts as processes run on ``auto``;
``ASBP_TEST_LOOP=uvloop`` puts its in-process servers on uvloop:
tests/support/loops.py). uvloop's transports are Cython classes that quack
like ``asyncio.Transport`` without being one (gateway/transports/coalescing.py
no longer asks), their ``socket`` is a pseudo-socket whose ``getsockopt``
still reads ``TCP_INFO`` (gateway/transports/handshakes.py), and they keep
no reference cycle of their own: CPython 3.11's selector transport does, and
gateway/transports/connection_cycles.py breaks it there; on uvloop that is a
no-op, and a closed connection is freed by reference counting all the same
(tests/gateway/transports/test_connection_cycles.py counts uvloop's
transports too).
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Coroutine
from typing import Any, Final, Literal, TypeVar

from gateway.config.errors import ConfigError
from gateway.config.model import LoopName

__all__ = [
    "RunningLoop",
    "chosen_loop",
    "loop_factory",
    "run",
    "running_loop",
    "uvloop_installed",
]

#: The loop that actually runs: what ``loop = "auto"`` resolves to.
RunningLoop = Literal["asyncio", "uvloop"]

_UVLOOP: Final = "uvloop"

_T = TypeVar("_T")


def uvloop_installed() -> bool:
    """Whether uvloop can be imported here (without importing it)."""
    return importlib.util.find_spec(_UVLOOP) is not None


def chosen_loop(setting: LoopName) -> RunningLoop:
    """The loop ``setting`` runs: itself, or what ``auto`` resolves to.

    Raises:
        ConfigError: ``uvloop`` is asked for and not installed.
    """
    if setting == "asyncio":
        return "asyncio"
    if uvloop_installed():
        return "uvloop"
    if setting == "uvloop":
        raise ConfigError(
            'loop = "uvloop" but uvloop is not installed (pip install uvloop); '
            'loop = "auto" runs asyncio\'s loop without it'
        )
    return "asyncio"


def loop_factory(setting: LoopName) -> Callable[[], asyncio.AbstractEventLoop]:
    """A new loop of the kind ``setting`` runs, for ``asyncio.Runner(loop_factory=...)``.

    Raises:
        ConfigError: ``uvloop`` is asked for and not installed.
    """
    if chosen_loop(setting) == "uvloop":
        import uvloop  # imported only when it runs: not every platform has it

        return uvloop.new_event_loop
    return asyncio.new_event_loop


def run(main: Callable[[], Coroutine[Any, Any, _T]], setting: LoopName) -> _T:
    """Run the coroutine ``main()`` makes on a new loop of ``setting``'s kind, as
    ``asyncio.run`` does (the remaining tasks cancelled, async generators and the
    default executor shut down at the end).

    ``main`` is a function, not a coroutine: when the loop cannot be made, no
    coroutine exists to be left never awaited.

    Raises:
        ConfigError: ``uvloop`` is asked for and not installed.
    """
    factory = loop_factory(setting)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main())


def running_loop(loop: asyncio.AbstractEventLoop | None = None) -> RunningLoop:
    """The kind of ``loop`` (the running loop by default), as the log names it."""
    if loop is None:
        loop = asyncio.get_running_loop()
    return "uvloop" if type(loop).__module__.partition(".")[0] == _UVLOOP else "asyncio"
