"""When a broker that let go of a Channel log has handled what was on its way to it.

Why
---
While a broker holds a resumable WebSocket Channel's log, frames routed to the
Channel from other brokers are forwarded to its inbound stream
(gateway.plane.redis.log_scripts, ``LOG_OR_FORWARD``). When its connection
drops, the broker releases the log, and from then on frames go into the log;
but the frames already in its stream are read after the release, find no
Channel, and are forwarded again, to the log or to the broker the Channel
resumed at. Had that broker taken the log in between and delivered newer
frames, these older ones would arrive after them: out of order (issue 11,
"in order, none twice").

What
----
Each forward to the holder records, in the log, the ID of the entry it added to
the holder's stream (``wp``). The release puts up a *barrier* in the log (its
field ``v``: this broker) when there was such an entry, and returns its ID. While
the barrier is up, frames other brokers route to the Channel are held back in a
list beside the log (``logv``), while the frames this broker passes on go into the
log at once. The broker lifts the barrier (``LOG_SETTLED``: the held-back frames
follow into the log) once its reader has handled that entry: the reader hands
each entry to the router synchronously, and a frame passed on is submitted to the
same Batcher then, so the lift, submitted after the reader has passed that entry,
reaches Redis after every one of those. A resume elsewhere waits for the barrier
before it holds the log (gateway.connections.resume, ``ChannelLog.pending``).
So the log takes the frames in the order they were routed, whichever way each
went.

A broker that dies with its barrier up is passed over: ``LOG_PENDING`` and
``LOG_HOLD`` salvage its unread frames into the log, as for a dead holder.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["ReleaseBarriers", "entry_order"]


def entry_order(entry_id: bytes) -> tuple[int, int]:
    """A stream entry ID (``<ms>-<seq>``) as a pair that sorts as Redis orders them."""
    ms, _, seq = entry_id.partition(b"-")
    return (int(ms), int(seq or b"0"))


class ReleaseBarriers:
    """One broker's barriers still up, and how far its reader has handled its stream.

    Args:
        lift: submits the call that lifts the barrier of a Channel (``LOG_SETTLED``).
    """

    def __init__(self, lift: Callable[[str], Any]) -> None:
        self._lift = lift
        #: The last entry the reader handled (every entry up to it was handed on).
        self._through = (0, 0)
        #: Channel -> the entry the reader must pass before its barrier lifts.
        self._waiting: dict[str, tuple[int, int]] = {}

    def released(self, channel_id: str, last: bytes | None) -> None:
        """The log of ``channel_id`` was released; ``last`` is the last entry forwarded
        to this broker for it (None: none)."""
        if last is None or entry_order(last) <= self._through:
            self._lift(channel_id)
            return
        target = entry_order(last)
        self._waiting[channel_id] = max(target, self._waiting.get(channel_id, target))

    def handled(self, entry_id: bytes) -> None:
        """The reader handed every entry through ``entry_id`` to the router."""
        self._through = entry_order(entry_id)
        if not self._waiting:
            return
        through = self._through
        done = [channel for channel, target in self._waiting.items() if target <= through]
        for channel_id in done:
            del self._waiting[channel_id]
            self._lift(channel_id)
