"""Work the messaging built-ins leave running: engine calls, polls, lease releases.

None of it is awaited by whoever started it (the router never awaits), yet
none of it may be lost when the broker stops: publications sent before a
Channel closed still reach the engine, and leases are given back. So every
such future is tracked here until it is done, and :meth:`BackgroundWork.drain`
gives what is left a grace period at stop, then cancels the rest.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from gateway.tasks import cancel_and_wait

__all__ = ["BackgroundWork"]


class BackgroundWork:
    """The futures of one broker's messaging that must end before it stops."""

    __slots__ = ("futures",)

    def __init__(self) -> None:
        #: Tracked until done. Public for the hot path: the in-order sequencing adds
        #: and discards engine calls itself rather than pay a done callback each.
        self.futures: set[asyncio.Future[Any]] = set()

    def track(self, future: asyncio.Future[Any]) -> None:
        """Keep ``future`` until it is done."""
        self.futures.add(future)
        future.add_done_callback(self.futures.discard)

    def spawn(self, work: Awaitable[object]) -> None:
        """Run ``work`` in a task of its own, tracked."""

        async def run() -> object:
            return await work

        self.track(asyncio.create_task(run()))

    async def drain(self, grace: float) -> None:
        """Let what is running end within ``grace`` seconds; cancel whatever is left then."""
        pending = list(self.futures)
        if pending:
            _, late = await asyncio.wait(pending, timeout=grace)
            for task in late:
                await cancel_and_wait(task)
