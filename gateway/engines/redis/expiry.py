"""Expiry in the Redis engine: the sweeper that removes expired messages nobody fetches.

Theory of operation
-------------------
A fetch removes the expired messages it meets; the *sweep* removes
the others, so that a queue nobody consumes still loses its expired messages
(and their publishers get the EXPIRED notice) near their expiration, as the
memory engine's periodic sweep does. ``{asbp:vqueues}:expiry`` holds every queue with
something in it, scored by the earliest time its sweep could find work: a
message's expiration, a delayed message's due time, the end of a lease (the
lease decides until then: a message that expired while leased leaves when its
lease ends, unless acknowledged). ``enqueue`` and the virtual-queue copies lower
a queue's score to their messages' times (``ZADD LT``, once per script call),
and a release to now. Each engine runs a sweeper task: every
``sweep_interval`` seconds at most, sooner when the index's earliest score
comes first, it reads the queues that are due and runs one script per queue
(:meth:`Sweeper.sweep_once`). That script removes the expired messages no
consumer has read yet (after the group's last delivered id) and those whose
lease ended, promotes due delayed messages, and sets the queue's next score
from what is left, or removes the queue from the index when nothing is. It
examines ``SWEEP_BUDGET`` entries at most, and comes back to a queue at the next
tick if that was not enough. Every broker sweeps; the scripts are atomic, so
two sweeps of one queue cost twice, never a duplicate notice. A delayed message
that expires before it is due leaves when it is due.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Final, TypeVar

from gateway.engines.base import EngineUnavailable
from gateway.engines.redis.calls import EXPIRY, CommandCall, FutureCall, QueueKeys, SweepCall
from gateway.tasks import cancel_and_wait

__all__ = ["DEFAULT_SWEEP_INTERVAL", "MIN_SWEEP_PAUSE", "SWEEP_BUDGET", "SWEEP_QUEUES", "Sweeper"]

_log = logging.getLogger(__name__)

#: Seconds between two sweeps for expired messages, at most (as the memory engine's).
DEFAULT_SWEEP_INTERVAL: Final = 1.0
#: Seconds between two sweeps, at least: the pause when a sweep left work due.
MIN_SWEEP_PAUSE: Final = 0.01
#: Queues one sweep looks at, at most (the rest at the next one).
SWEEP_QUEUES: Final = 100
#: Entries one queue's sweep examines, at most.
SWEEP_BUDGET: Final = 1000

T = TypeVar("T")


class Sweeper:
    """Sweeps the queues the ``{asbp:vqueues}:expiry`` index says are due, on a timer.

    Args:
        submit: hands a call to the engine's batcher and returns its future (so a
            sweep shares pipelines with everything else the engine sends).
        keys: a queue's keys, by name (the engine's cache).
        clock: wall-clock seconds since the epoch (the engine's).
    """

    def __init__(
        self,
        submit: Callable[[FutureCall[Any]], asyncio.Future[Any]],
        keys: Callable[[str], QueueKeys],
        clock: Callable[[], float],
    ) -> None:
        self._submit = submit
        self._keys = keys
        self._clock = clock
        self._task: asyncio.Task[None] | None = None

    def start(self, interval: float) -> None:
        """Sweep every ``interval`` seconds at most, sooner when something is due."""
        self._task = asyncio.create_task(self._sweep_periodically(interval), name="redis sweep")

    async def stop(self) -> None:
        """Stop the timer (idempotent); a sweep under way is cancelled."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    async def sweep_once(self) -> tuple[int, float | None]:
        """One sweep: (messages removed, the earliest score left, None if none).

        Raises:
            EngineUnavailable: Redis cannot be reached.
        """
        now = self._clock()
        due = await self._submit(
            CommandCall(("ZRANGEBYSCORE", EXPIRY, "-inf", repr(now), "LIMIT", 0, SWEEP_QUEUES))
        )
        calls = []
        for raw_name in due:
            name = raw_name.decode()
            call = SweepCall(name, self._keys(name), budget=SWEEP_BUDGET, clock=self._clock)
            calls.append(self._submit(call))
        # Submitted now, so it shares the sweeps' pipeline and sees their scores.
        earliest = self._submit(CommandCall(("ZRANGE", EXPIRY, 0, 0, "WITHSCORES")))
        *swept, first = await asyncio.gather(*calls, earliest)
        removed = sum(result[0] for result in swept)
        if not first:
            return removed, None
        # [member, score] (RESP2), or [[member, score]] (RESP3)
        return removed, float(first[0][1] if isinstance(first[0], list) else first[1])

    async def _sweep_periodically(self, interval: float) -> None:
        failing = False
        while True:
            pause = interval
            try:
                _, earliest = await self.sweep_once()
            except EngineUnavailable as exc:
                # Redis is away: the next tick tries again. Said once per outage, not
                # once a second.
                _log.log(
                    logging.DEBUG if failing else logging.WARNING,
                    "redis.sweep_failed",
                    extra={"reason": str(exc)},
                )
                failing = True
            except Exception:  # a bug: logged, and the sweeper lives on (fetches still expire)
                _log.exception("redis.sweep_failed")
            else:
                failing = False
                if earliest is not None:
                    pause = min(pause, max(MIN_SWEEP_PAUSE, earliest - self._clock()))
            await asyncio.sleep(pause)
