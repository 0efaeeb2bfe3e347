"""Ending the broker's own tasks without losing the caller's cancellation.

The usual idiom, ``task.cancel()`` then ``with suppress(CancelledError): await
task``, has two faults that a stopping broker meets:

- the ``CancelledError`` it suppresses may be the *caller's* own: a stop bounded
  by a timeout, or a connection Hypercorn cancels at the end of its grace
  period, is swallowed there and runs on past its bound;
- a cancellation can be lost inside the task: Python 3.11's ``asyncio.wait_for``
  (which redis-py's connections use) returns its result and drops the
  cancellation when both arrive together, and a task that waits in a loop then
  never ends.

:func:`cancel_and_wait` waits with ``asyncio.wait``, which never raises the
task's outcome and always lets the caller's cancellation through, and asks
again until the task is done (or a deadline passes).
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

__all__ = ["CANCEL_AGAIN", "cancel_and_wait", "end_within"]

#: Seconds to wait for a cancelled task to end before cancelling it again.
CANCEL_AGAIN: Final = 0.1


async def cancel_and_wait(
    task: asyncio.Future[Any],
    *,
    ignore: tuple[type[BaseException], ...] = (),
    deadline: float | None = None,
) -> bool:
    """Cancel ``task`` and wait until it has ended, cancelling it again if it goes on.

    Args:
        task: the task (or future) to end.
        ignore: exceptions the task may end with that are of no interest now (a
            read torn down mid-reply fails inside redis-py, say); others are raised.
        deadline: the event loop's time after which to stop asking and leave the
            task running (abandoned: the loop's close cancels it again).

    Returns:
        Whether the task has ended.
    """
    loop = asyncio.get_running_loop()
    while not task.done():
        if deadline is not None and loop.time() >= deadline:
            return False
        task.cancel()
        wait = CANCEL_AGAIN if deadline is None else min(CANCEL_AGAIN, deadline - loop.time())
        await asyncio.wait([task], timeout=max(wait, 0.0))
    _outcome(task, ignore)
    return True


async def end_within(
    task: asyncio.Future[Any],
    seconds: float,
    *,
    ignore: tuple[type[BaseException], ...] = (),
) -> None:
    """Let ``task`` end by itself for up to ``seconds``, then cancel it and wait."""
    if not task.done() and seconds > 0:
        await asyncio.wait([task], timeout=seconds)
    await cancel_and_wait(task, ignore=ignore)


def _outcome(task: asyncio.Future[Any], ignore: tuple[type[BaseException], ...]) -> None:
    if task.cancelled():
        return
    error = task.exception()
    if error is not None and not isinstance(error, ignore):
        raise error
