"""Each sender's messaging Commands, carried out and answered in the order sent.

Theory of operation
-------------------
A Command accepted on sight (gateway.messaging.dispatch) is an
:class:`~gateway.messaging.subscriptions.Operation` of its sender's
:class:`~gateway.messaging.subscriptions.Endpoint`. :meth:`Sequencer.submit`
takes it from there (gateway.messaging.service, "In order", tells why):

* *Pipelined* operations (queue publications, acknowledgements) start their
  engine call at once (:meth:`Sequencer._start`), its first step inside the
  caller's (gateway.messaging.eager), and join the sender's ``in_flight``
  FIFO. Only the head's call is watched: when it is done, it and every call
  behind it that is done too are answered (:meth:`Sequencer._call_done`), so
  a batch the engine settles at once costs one callback.
* *In turn* operations wait in ``operations`` for one task per sender
  (:meth:`Sequencer._work`) that starts each once everything ahead of it has
  been answered. A *detached* one (a poll) makes its first step in its turn,
  then runs beside the others.

``endpoint.pending`` counts what is accepted and not answered yet; the
dispatcher refuses one more than ``max_pending`` (2106, :class:`TooManyPending`).

An engine call that fails faults its own Command and no other
(:meth:`Sequencer._failed`); an error that is not an ASBP one is logged with
its traceback and answered with 2005.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Coroutine
from typing import Any

from asbp import AsbpError, FaultCode
from gateway.errors import GatewayError
from gateway.messaging.background import BackgroundWork
from gateway.messaging.eager import start_eagerly
from gateway.messaging.subscriptions import Endpoint, Operation
from gateway.metrics.counts import Histogram

__all__ = ["Sequencer", "TooManyPending"]


class TooManyPending(GatewayError):
    """2106: the sender has ``max_pending`` messaging Commands waiting already."""

    code = FaultCode.TOO_MANY_IN_FLIGHT


class Sequencer:
    """Starts and answers every sender's operations in the order they arrived.

    Args:
        background: where engine calls, polls and workers are tracked until done.
        log: where engine failures that are not ASBP errors go.
    """

    __slots__ = ("_background", "_futures", "_latency", "_log")

    def __init__(
        self,
        background: BackgroundWork,
        *,
        log: logging.Logger,
        latency: Histogram | None = None,
    ) -> None:
        self._background = background
        self._futures = background.futures
        self._log = log
        # Seconds from an engine call's start to its end, pipelined and in-turn
        # operations alike (not polls: their wait is asbp_poll_wait_seconds).
        self._latency = latency

    def submit(self, endpoint: Endpoint, operation: Operation) -> None:
        """Take an operation accepted on sight: start it now, or queue it for its turn."""
        endpoint.pending += 1
        if operation.pipelined and endpoint.worker is None:
            self._start(endpoint, operation)  # nothing waits for its turn: go now
            return
        endpoint.operations.append(operation)
        if endpoint.worker is None:
            endpoint.worker = worker = asyncio.create_task(
                self._work(endpoint), name=f"asbp-messaging:{endpoint.key}"
            )
            # Tracked until done, even after its endpoint is forgotten: stop() lets the
            # publications of closed Channels reach the engine.
            self._background.track(worker)

    def close(self, endpoint: Endpoint) -> None:
        """``endpoint`` closed: its polls end, and what waits for its turn is dropped,
        unless it still runs after a close (publications, acknowledgements)."""
        for task in list(endpoint.polls):
            task.cancel()
        kept = [o for o in endpoint.operations if o.after_close]
        endpoint.pending -= len(endpoint.operations) - len(kept)
        endpoint.operations.clear()
        endpoint.operations.extend(kept)

    def _start(self, endpoint: Endpoint, operation: Operation) -> None:
        """Start a pipelined operation's engine call; answer it once it and those ahead are done.

        The call's first step runs now (:func:`~gateway.messaging.eager.start_eagerly`):
        a call that finishes at once (the memory engine's) with nothing ahead of it is
        answered at once, without a task. An engine call that returns a future (the
        Redis engine's) was made already, and its future is awaited as it is.
        """
        if self._latency is not None:
            operation.began = time.perf_counter()
        try:
            awaitable = operation.run()
        except Exception as exc:  # raised before it could return an awaitable
            call: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            call.set_exception(exc)
        else:
            if isinstance(awaitable, asyncio.Future):
                call = awaitable
            else:
                assert isinstance(awaitable, Coroutine), awaitable
                call = start_eagerly(awaitable)
        operation.task = call
        if call.done():
            if not endpoint.in_flight:
                endpoint.pending -= 1
                self._settle(endpoint, operation, call)
                return
            endpoint.in_flight.append(operation)  # answered after those ahead of it
            return
        in_flight = endpoint.in_flight
        in_flight.append(operation)
        # Tracked until done, even after its endpoint is forgotten: stop() lets the
        # publications of closed Channels reach the engine.
        self._futures.add(call)
        if len(in_flight) == 1:
            # Only the head's call is watched: once it is done, _call_done answers it
            # and every one behind it that is done too, then watches the next head.
            # The engine settles a batch at once, so a batch costs one callback.
            call.add_done_callback(functools.partial(self._call_done, endpoint))

    def _call_done(self, endpoint: Endpoint, _: asyncio.Future[Any]) -> None:
        """The head's engine call ended: answer every operation at the head that is done."""
        in_flight = endpoint.in_flight
        while in_flight:
            operation = in_flight[0]
            done = operation.task
            assert done is not None
            if not done.done():
                # Answered after the one ahead of it; watched from now on, as the head.
                done.add_done_callback(functools.partial(self._call_done, endpoint))
                break
            in_flight.popleft()
            self._futures.discard(done)
            endpoint.pending -= 1
            self._settle(endpoint, operation, done)
        if not in_flight and endpoint.idle is not None:
            idle, endpoint.idle = endpoint.idle, None
            if not idle.done():
                idle.set_result(None)

    def _settle(self, endpoint: Endpoint, operation: Operation, call: asyncio.Future[Any]) -> None:
        """Answer a pipelined operation whose engine call is done."""
        if self._latency is not None:
            self._latency.observe(time.perf_counter() - operation.began)
        if call.cancelled():  # stop() gave up on it: nobody is left to answer
            if operation.abandon is not None:
                operation.abandon()
            return
        error = call.exception()
        if error is None:
            assert operation.answer is not None
            operation.answer(call.result())
            return
        if operation.abandon is not None:
            operation.abandon()
        self._failed(endpoint, operation, error)

    async def _work(self, endpoint: Endpoint) -> None:
        """Work through ``endpoint.operations``: in turn, or starting pipelined ones."""
        operations = endpoint.operations
        try:
            while operations:
                operation = operations[0]  # left in place while it waits: close() sees it
                if endpoint.closed and not operation.after_close:
                    operations.popleft()
                    endpoint.pending -= 1
                    continue
                if operation.pipelined:
                    operations.popleft()
                    self._start(endpoint, operation)
                    continue
                if endpoint.in_flight:
                    # In turn: everything ahead is answered first.
                    idle = endpoint.idle
                    if idle is None:
                        idle = endpoint.idle = asyncio.get_running_loop().create_future()
                    await idle
                    continue
                operations.popleft()
                if operation.detached:
                    # Its first step now (the fetch is in place before anything sent
                    # after it starts), the rest beside the others.
                    poll = start_eagerly(self._execute(endpoint, operation), task=True)
                    if not poll.done():
                        endpoint.polls.add(poll)
                        poll.add_done_callback(endpoint.polls.discard)
                        self._background.track(poll)
                    continue
                await self._execute(endpoint, operation)
        finally:
            endpoint.worker = None

    async def _execute(self, endpoint: Endpoint, operation: Operation) -> None:
        began = time.perf_counter()
        try:
            result = await operation.run()
        except BaseException as exc:
            if operation.abandon is not None:
                operation.abandon()
            if not isinstance(exc, Exception):  # cancelled: the broker is stopping
                raise
            self._failed(endpoint, operation, exc)
        else:
            if operation.answer is not None:
                operation.answer(result)
        finally:
            endpoint.pending -= 1
            if self._latency is not None and not operation.detached:
                self._latency.observe(time.perf_counter() - began)

    def _failed(self, endpoint: Endpoint, operation: Operation, error: BaseException) -> None:
        """Fault ``operation``'s Command (and only it) for ``error``."""
        if isinstance(error, AsbpError):
            if not endpoint.closed:
                endpoint.fault(
                    error.code, error.message, command_id=operation.command_id, cause=operation.name
                )
            return
        # Not an ASBP error: an engine bug or an unwrapped driver error. The sender
        # still gets an answer (never silence), and the log gets the traceback.
        self._log.error(
            "messaging.failed",
            extra={"endpoint": endpoint.key, "command": operation.name},
            exc_info=error,
        )
        if not endpoint.closed:
            endpoint.fault(
                FaultCode.ENGINE_UNAVAILABLE,
                "the engine failed; the operation may not have happened",
                command_id=operation.command_id,
                cause=operation.name,
            )
