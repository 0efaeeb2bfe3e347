"""The outbox of an HTTP Channel on a bus of many brokers: its Channel log in the plane.

On one broker an HTTP Channel's mailbox is a :class:`~gateway.connections.outboxes.Mailbox`
in memory. On a bus it is the Channel's log (:class:`gateway.plane.base.ChannelLog`),
so that any broker can answer any long-poll for it: every broker that serves a
request of the Channel holds a Channel object for it whose outbox is a
:class:`LogMailbox`, and ``offer`` appends to the log. Appends are submitted to
the plane's batched writer and never awaited: the router stays await-free, and
one broker's appends reach the log in the order it made them.

Nothing waits here, so the outbox is never full and never holds a publisher
back: the log's retention (time, Commands, bytes) is what bounds a Channel
whose client stopped reading, and it drops the oldest instead of closing the
Channel (a reader learns of the gap from the numbers).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable

from gateway.plane.base import ChannelLog

__all__ = ["LogMailbox"]

_log = logging.getLogger("asbp.plane")


class LogMailbox:
    """Appends every frame to the Channel log of ``channel_id``.

    Args:
        log: the plane's Channel logs.
        channel_id: the Channel (may be set after construction, once minted).
    """

    __slots__ = ("_closed", "_log", "channel_id")

    def __init__(self, log: ChannelLog, channel_id: str = "") -> None:
        self._log = log
        self.channel_id = channel_id
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def offer(self, frame: bytes) -> bool:
        if self._closed:
            return False
        self._log.append(self.channel_id, frame).add_done_callback(self._appended)
        return True

    def _appended(self, future: asyncio.Future[int]) -> None:
        if future.cancelled():
            return
        error = future.exception()
        if error is not None or not future.result():
            # The bus is unreachable, or the log expired bus-wide: the client
            # finds the Channel gone at its next request.
            _log.warning(
                "plane.log_append_failed",
                extra={"channel": self.channel_id, "error": str(error or "no such log")},
            )

    @property
    def queued_bytes(self) -> int:
        """Nothing waits here: each frame is handed to the plane as it is offered."""
        return 0

    def room(self) -> tuple[int, int]:
        # The log's retention, not this process, bounds what a Channel holds.
        return (0, 0) if self._closed else (sys.maxsize, sys.maxsize)

    def when_drained(self, callback: Callable[[], object] | None) -> None:
        if callback is not None:
            callback()

    def on_relief(self, callback: Callable[[], object]) -> None:
        """Never full, so never holds a publisher back."""
        callback()

    def stalled(self) -> None:
        """Nothing to give up on: frames leave as they are offered."""

    def close(self) -> None:
        self._closed = True

    def abort(self) -> None:
        self._closed = True
