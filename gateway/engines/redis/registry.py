"""Registering queues on a Redis Cluster, apart from the per-message scripts.

On one Redis the enqueue script adds its queue to the registry (``max_queues``
is checked there, atomically). On a cluster the registry lives in another slot
than the queue (gateway.engines.redis.layout), so the first enqueue to a queue
at each engine registers it first, with one ``REGISTER`` script call on the
registry's primary, and only then stores: a queue past ``max_queues`` gets
``QueueLimitReached`` and nothing stored, as on one Redis. The registry never
forgets a queue, so once registered an engine remembers it and its later
enqueues pay nothing for the registry.

Enqueues to a queue whose registration is under way are held, in the order
made, and released together when it ends: so calls made one after another
still reach Redis in that order (gateway.engines.redis.batch).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from gateway.engines.redis.calls import CommandCall, FutureCall, script_command
from gateway.engines.redis.scripts import REGISTER

__all__ = ["Registrations"]

#: What a held enqueue is resumed with: None once registered, or the error.
Resume = Callable[[BaseException | None], None]


class Registrations:
    """Which queues this engine registered, and the enqueues held until theirs is.

    Args:
        submit: hands a call to the engine's batcher and returns its future.
        registry: the registry's key.
        max_queues: the limit REGISTER checks.
        remembered: how many queue names to remember at most (then forgotten all
            at once and registered again, idempotently: memory stays bounded).
    """

    def __init__(
        self,
        submit: Callable[[FutureCall[Any]], asyncio.Future[Any]],
        registry: str,
        max_queues: int,
        *,
        remembered: int,
    ) -> None:
        self._submit = submit
        self._registry = registry
        self._max_queues = max_queues
        self._remembered = remembered
        self._known: set[str] = set()
        self._held: dict[str, list[Resume]] = {}

    def known(self, queue: str) -> bool:
        """Whether ``queue`` was registered by this engine."""
        return queue in self._known

    def hold(self, queue: str, resume: Resume) -> None:
        """Call ``resume`` once ``queue`` is registered (None) or cannot be (the error).

        The first holder of a queue starts its registration.
        """
        held = self._held.get(queue)
        if held is None:
            held = self._held[queue] = []
            call = CommandCall(
                script_command(REGISTER, (self._registry,), (queue, self._max_queues))
            )
            self._submit(call).add_done_callback(lambda future: self._registered(queue, future))
        held.append(resume)

    def _registered(self, queue: str, future: asyncio.Future[Any]) -> None:
        held = self._held.pop(queue, [])
        error = future.exception()
        if error is None:
            if len(self._known) >= self._remembered:
                self._known.clear()
            self._known.add(queue)
        for resume in held:  # in the order held: their enqueues keep it
            resume(error)
