"""One User-Agent Channel at a Broker-Agent: its bounded outbox and its Commands in flight.

Theory of operation
-------------------
A :class:`ChannelConnection` is the Broker-Agent's side of one WebSocket
Channel (draft §2.1), the same two books the broker keeps for each Channel:

* **The outbox.** Everything sent to the User-Agent (the greeting, answers,
  faults, pushes) is queued as encoded frames and written by one writer task,
  so a handler never waits on a slow reader and one reader never holds up
  another. The queue is bounded in Commands and bytes; a reader that lets it
  fill is closed with 1008 ``2105 Slow consumer``, as the broker closes one
  (docs/protocol.md, "Backpressure"), so memory stays bounded.
* **Commands in flight.** A Command with ``u`` sent to a Respondent is in
  flight until an answer with that ``u`` comes back: a plain answer or a
  fault ends it, a streamed one ends with the part whose ``o`` reaches ``t``
  and each part earns a fresh timeout. At ``max_in_flight`` a new one gets
  fault 2106; past the Respondent timeout the User-Agent gets fault 2103 (a
  late answer is still delivered). Reusing a ``u`` still in flight replaces
  the older entry. Never silence.

Text or binary: as the broker does, a frame that is valid UTF-8 goes out as a
text message while the User-Agent's last message was text (or it has sent
nothing yet), so ``websocat`` and a browser's ``onmessage`` see strings;
anything else goes out as binary.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

import asbp
from asbp import ChannelId, Command, FaultCode, fault_command
from asbp.names import FAULT

__all__ = ["ChannelConnection", "InFlight", "OutboxLimits"]

#: The close code and reason of a reader whose outbox filled (as the broker's).
_SLOW_CLOSE: Final = 1008
_SLOW_REASON: Final = f"{int(FaultCode.SLOW_CONSUMER)} Slow consumer"


@dataclass(frozen=True, slots=True)
class OutboxLimits:
    """How much may wait for one User-Agent before it counts as too slow."""

    #: Commands queued.
    max_commands: int = 1024
    #: Bytes queued.
    max_bytes: int = 4 * 1024 * 1024


@dataclass(slots=True)
class InFlight:
    """One Command with ``u`` awaiting its Respondent's answer."""

    #: The Command-Name, for the timeout's fault.
    name: str
    #: Fires the timeout fault; replaced by each part of a streamed answer.
    timer: asyncio.TimerHandle | None = None
    #: ``t`` from the first part of a streamed answer, once seen.
    total: int | None = None

    def cancel(self) -> None:
        """Stop the timeout."""
        if self.timer is not None:
            self.timer.cancel()


#: Called when a Command in flight times out: (channel, u, entry).
OnTimeout = Callable[["ChannelConnection", int, InFlight], None]


class ChannelConnection:
    """The Broker-Agent's side of one WebSocket Channel.

    Args:
        channel_id: ``i``, made by the Broker-Agent.
        websocket: the accepted connection.
        limits: the outbox bounds.
        logger: where to log.
    """

    def __init__(
        self,
        channel_id: ChannelId,
        websocket: ServerConnection,
        limits: OutboxLimits,
        logger: logging.Logger,
    ) -> None:
        self.id = channel_id
        self.websocket = websocket
        self._limits = limits
        self._log = logger
        self._outbox: deque[bytes] = deque()
        self._outbox_bytes = 0
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        #: Commands awaiting an answer, by ``u``.
        self.in_flight: dict[int, InFlight] = {}
        #: Whether the User-Agent's last message was text (none yet counts as text).
        self.text = True
        #: False once the Channel is closing: nothing more is queued.
        self.open = True

    def __repr__(self) -> str:
        return f"<Channel {self.id} in flight={len(self.in_flight)}>"

    # -- the outbox --------------------------------------------------------------

    def start(self) -> None:
        """Start the writer task."""
        self._writer = asyncio.create_task(self._write(), name=f"asbp-channel {self.id}")

    def send(self, command: Command) -> None:
        """Queue ``command`` for the User-Agent; never awaits.

        A reader whose outbox is full is closed (fault 2105) and this Command
        is dropped with what was queued.
        """
        if not self.open:
            return
        frame = asbp.encode(command)
        if (
            len(self._outbox) >= self._limits.max_commands
            or self._outbox_bytes + len(frame) > self._limits.max_bytes
        ):
            self._log.warning("broker agent: channel %s is too slow; closing it", self.id)
            self._outbox.clear()
            self._outbox_bytes = 0
            self.open = False
            task = asyncio.create_task(self.websocket.close(_SLOW_CLOSE, _SLOW_REASON))
            task.add_done_callback(_ignore)
            self._wake.set()
            return
        self._outbox.append(frame)
        self._outbox_bytes += len(frame)
        self._wake.set()

    def fault(
        self, code: FaultCode, message: str, *, command_id: int | None, cause: str | None = None
    ) -> None:
        """Queue an ``asbp.fault`` (docs/protocol.md, "Faults on the wire")."""
        self.send(fault_command(code, message, command_id=command_id, cause=cause))

    async def _write(self) -> None:
        websocket = self.websocket
        try:
            while True:
                while self._outbox:
                    frame = self._outbox.popleft()
                    self._outbox_bytes -= len(frame)
                    await websocket.send(self._as_message(frame))
                if not self.open:
                    return
                self._wake.clear()
                await self._wake.wait()
        except ConnectionClosed:
            self.open = False

    def _as_message(self, frame: bytes) -> str | bytes:
        if self.text:
            try:
                return frame.decode("utf-8")
            except UnicodeDecodeError:
                pass
        return frame

    async def finish(self, timeout: float) -> None:
        """Stop queueing, write what is queued (up to ``timeout``), stop the writer."""
        self.open = False
        self._wake.set()
        writer = self._writer
        if writer is None:
            return
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(writer)
        except TimeoutError:
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer

    # -- Commands in flight --------------------------------------------------------

    def begin(self, command_id: int, name: str, timeout: float, on_timeout: OnTimeout) -> None:
        """Book ``command_id`` as awaiting an answer (replacing an older one)."""
        older = self.in_flight.pop(command_id, None)
        if older is not None:
            older.cancel()
        entry = InFlight(name)
        entry.timer = asyncio.get_running_loop().call_later(
            timeout, on_timeout, self, command_id, entry
        )
        self.in_flight[command_id] = entry

    def answered(self, command: Command, timeout: float, on_timeout: OnTimeout) -> None:
        """An answer with ``u`` is going out: end (or, for a stream part, extend) its entry."""
        command_id = command.command_id
        if command_id is None:
            return
        entry = self.in_flight.get(command_id)
        if entry is None:
            return
        entry.cancel()
        if command.total is not None:
            entry.total = command.total
        position = command.of_total
        streaming = command.name != FAULT and (entry.total is not None or position is not None)
        if streaming and (entry.total is None or position is None or position < entry.total):
            loop = asyncio.get_running_loop()
            entry.timer = loop.call_later(timeout, on_timeout, self, command_id, entry)
            return
        del self.in_flight[command_id]

    def end_all(self) -> list[tuple[int, InFlight]]:
        """Forget every entry (the Channel is closing); returns them."""
        entries = list(self.in_flight.items())
        for _, entry in entries:
            entry.cancel()
        self.in_flight.clear()
        return entries


def _ignore(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved, so asyncio does not log it: the peer is gone anyway
