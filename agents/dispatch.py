"""Dispatch: from a Command that arrived on a Tube to a running handler and its answer.

Theory of operation
-------------------
Every Command a broker sends that answers no call of the SDK's own comes
here (``TubeLink``'s ``on_command``). :meth:`Dispatcher.dispatch` never
awaits: it sorts the Command and, for a Respondent, starts one task, so a
slow handler never holds up the Tube's reader (which must keep reading for
the broker's acknowledgements and the other handlers' requests).

* A broker built-in: ``asbp.fault`` answering nothing of ours is logged, at
  INFO for 2104 (a User-Agent we answered has left, which is routine) and at
  WARNING otherwise; anything else is logged at DEBUG.
* A late answer on the agent-to-agent inbox: logged and dropped. (A
  User-Agent that sends to the inbox name gets fault 2101, like any name
  the agent has no handler for.)
* A Command-Name nobody serves (a request racing an unregistration): fault
  2101 to the requester. While shutting down: fault 2102.
* Otherwise a task runs the handler, at most ``max_concurrency`` at once;
  the others wait their turn (their number is bounded by the brokers'
  per-Channel in-flight limits, and pausing the Tube's reader instead would
  stall acknowledgements and let the broker's outbox fill).

A handler that raises sends the requester fault **2107**
(``RESPONDENT_FAILED``, our extension in the routing block) with a fixed
message that leaks nothing of the exception. The traceback goes to the log,
and the agent keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, Final

from agents import control
from agents.addressing import ChannelMemory
from agents.errors import AgentError, FaultError
from agents.respondent import Handler, Request, RequestSession, RespondentTable
from asbp import Command, FaultCode

__all__ = ["HANDLER_FAILED", "Dispatcher"]

#: The fault a requester gets when a handler raises (see the module docstring).
HANDLER_FAILED: Final = FaultCode.RESPONDENT_FAILED


class Dispatcher:
    """Runs handlers for the Commands that arrive, with bounded concurrency.

    Args:
        identity: the agent's identity, for log lines.
        respondents: the handlers, by Command-Name.
        channels: learns where each requesting Channel lives.
        max_concurrency: handlers running at once.
        logger: where to log.
    """

    def __init__(
        self,
        identity: str,
        respondents: RespondentTable,
        channels: ChannelMemory,
        *,
        max_concurrency: int,
        logger: logging.Logger,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        self._identity = identity
        self._respondents = respondents
        self._channels = channels
        self._slots = asyncio.Semaphore(max_concurrency)
        self._log = logger
        self._tasks: set[asyncio.Task[None]] = set()
        #: False once shutdown began: new requests get fault 2102.
        self.accepting = True
        #: Callers of ``send(confirm=...)`` waiting for a fault about their Command,
        #: by its Command-Name and ``u`` (a fault carries both, as ``cause`` and ``u``).
        self._fault_waiters: dict[tuple[str | None, int | None], asyncio.Future[FaultError]] = {}

    def expect_fault(self, name: str | None, command_id: int | None) -> asyncio.Future[FaultError]:
        """A future set to the broker's next fault about ``name`` with ``u`` ``command_id``.

        The caller must :meth:`forget` it when it stops waiting.
        """
        future: asyncio.Future[FaultError] = asyncio.get_running_loop().create_future()
        self._fault_waiters[(name, command_id)] = future
        return future

    def forget(self, name: str | None, command_id: int | None) -> None:
        """Stop waiting for a fault about ``name`` with ``command_id``."""
        self._fault_waiters.pop((name, command_id), None)

    @property
    def in_flight(self) -> int:
        """Handlers running or waiting for a slot, and faults being sent."""
        return len(self._tasks)

    async def wait_for_room(self, limit: int) -> None:
        """Return once fewer than ``limit`` handlers are running or waiting for a slot.

        A reader that calls this before taking the next Command holds its
        sender back (TCP pushes back once buffers fill) instead of letting
        waiting handlers pile up without bound.
        """
        while len(self._tasks) >= limit:
            await asyncio.wait(set(self._tasks), return_when=asyncio.FIRST_COMPLETED)

    async def drain(self, timeout: float) -> int:
        """Wait up to ``timeout`` for every task, then cancel the rest; returns how many."""
        if not self._tasks:
            return 0
        _, late = await asyncio.wait(set(self._tasks), timeout=max(0.0, timeout))
        for task in late:
            task.cancel()
        if late:
            await asyncio.gather(*late, return_exceptions=True)
        return len(late)

    def dispatch(self, session: RequestSession, command: Command) -> None:
        """Handle one Command from a broker that answers no call of ours."""
        name = command.name
        channel_id = command.channel_id
        if channel_id is not None:
            self._channels.remember(channel_id, session.broker_id)
        if name is None:
            self._log.warning(
                "agent %s: dropped a Command without 'c': %r", self._identity, command
            )
            return
        if name.startswith(control.PREFIX):
            self._builtin(session, name, command)
            return
        if name == self._respondents.inbox and channel_id is None:
            self._log.info("agent %s: an answer came too late: %r", self._identity, command)
            return
        handler = self._respondents.lookup(name)
        request = Request(command, session)
        if handler is None or not self.accepting:
            if handler is None:
                code, message = FaultCode.NO_RESPONDENT, f"this agent does not serve {name!r}"
            else:
                code, message = FaultCode.RESPONDENT_LEFT, "the Application-Agent is shutting down"
            if request.command_id is not None and request.answerable:
                self._spawn(self._answer(request, request.fault(code, message)), name)
            return
        self._spawn(self._serve(request, handler), name)

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(work, name=f"asbp-respondent {name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _builtin(self, session: RequestSession, name: str, command: Command) -> None:
        if name == control.FAULT:
            fault = FaultError.from_command(command)
            waiter = self._fault_waiters.pop((fault.cause, fault.command_id), None)
            if waiter is not None and not waiter.done():
                waiter.set_result(fault)  # its caller raises it: no log line needed
                return
            level = logging.INFO if fault.code == FaultCode.UNKNOWN_CHANNEL else logging.WARNING
            self._log.log(
                level,
                "agent %s: fault from broker %s: %s",
                self._identity,
                session.broker_id,
                fault,
            )
        elif name == control.TUBE:
            self._log.warning(
                "agent %s: a second greeting on one Tube: %r", self._identity, command
            )
        else:
            self._log.debug("agent %s: unmatched %r", self._identity, command)

    async def _serve(self, request: Request, handler: Handler) -> None:
        async with self._slots:
            try:
                result = await handler(request)
                reply = None if result is None else request.as_reply(result)
            except Exception:
                self._log.exception(
                    "agent %s: the Respondent for %r failed on %r",
                    self._identity,
                    request.name,
                    request,
                )
                if request.command_id is not None and request.answerable:
                    message = f"the Command-Respondent for {request.name!r} failed"
                    await self._answer(request, request.fault(HANDLER_FAILED, message))
                return
            if reply is not None:
                await self._answer(request, request.send(reply))
            elif not request.answered and request.command_id is not None and request.answerable:
                await self._answer(request, request.reply())

    async def _answer(self, request: Request, sending: Coroutine[Any, Any, None]) -> None:
        try:
            await sending
        except AgentError as exc:
            self._log.info("agent %s: could not answer %r: %s", self._identity, request, exc)
