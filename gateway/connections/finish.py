"""Finishing, in a task, an awaitable whose first step ran outside any task.

Two hot paths run an awaitable's first step on the spot instead of in a new
task, to save the task and its trip through the event loop: the messaging
service's engine calls (gateway.messaging.eager) and the WebSocket writer's
ASGI ``send`` (gateway.transports.websocket). When that step suspends, the
rest must still run, in order, as ``asyncio.Task`` would have run it: that is
:func:`finish`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

__all__ = ["finish"]

T = TypeVar("T")


async def finish(steps: Coroutine[Any, Any, T] | Generator[Any, None, T], waiting_on: Any) -> T:
    """Run the rest of ``steps``, whose first step suspended on ``waiting_on``.

    ``steps`` is a coroutine, or an awaitable's ``__await__()``. ``waiting_on``
    is what its first step yielded: the asyncio future it awaits, or None for a
    bare yield (as in ``asyncio.sleep(0)``). This task awaits it in its stead,
    then resumes ``steps``, until it returns: what ``asyncio.Task`` would have
    done with it from the start.
    """
    while True:
        try:
            if waiting_on is None:
                await asyncio.sleep(0)
            else:
                # As a Task does with a future it is handed: the flag set when the
                # future was yielded is cleared, or awaiting it again would fail.
                waiting_on._asyncio_future_blocking = False
                await waiting_on
        except BaseException as exc:
            # The future's own outcome reaches ``steps`` when it resumes (its own
            # await of that future raises it); anything else, such as this task's
            # cancellation, is thrown into it.
            own = waiting_on is not None and waiting_on.done()
            own = own and (waiting_on.cancelled() or waiting_on.exception() is exc)
            if not own:
                try:
                    waiting_on = steps.throw(exc)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]  # steps' T
                continue
        try:
            waiting_on = steps.send(None)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]  # steps' T
