"""The release barrier on a Redis Cluster: counted frames instead of an entry ID.

Why
---
On one Redis a forward to the holder of a Channel log is one script that XADDs to
the holder's inbound stream and records the entry's ID in the log (``wp``), and
the release barrier waits for the holder's reader to pass that entry
(gateway.plane.redis.release_barriers). On a Redis Cluster the log (slot
``{<i>}``) and the holder's stream (slot ``{<prefix>in:<b>}``) are in different
slots, so the forward is two calls and no ID can be recorded where the release
reads it: a frame whose first call saw the old holder but whose send landed in its
stream after the release was read after the Channel had gone, passed on into the
log, and found newer frames there before it (issue 11, "in order, none twice").

What
----
The first call (``LOG_OR_HOLDER``, in the log's slot) counts each frame it sends
on to the holder (the log's field ``q``), and the sender marks the stream entry
as counted (:data:`COUNTED`). The holder counts the counted entries its reader
has handled for each Channel it holds (:meth:`CountedBarriers.read`). Its
release (``LOG_RELEASE_COUNTED``) gives the log its count: if more were sent,
the barrier goes up and the release returns how many; the broker lifts it
(``LOG_SETTLED``) once its reader has handled that many. Every counted frame
was counted before the release in the log's slot, so it is among them, wherever
it is on its way; the frames passed on are submitted to the Batcher as the
reader hands each entry on, so the lift reaches the log's slot after them; and
the frames other brokers route while the barrier is up wait beside the log
(``logv``) and follow. A sender's frames keep their order: one counted before
the release is in the count, one routed after it waits behind the barrier.

A counted frame that never arrives (its sender died between the two calls)
would hold the barrier up: it is lifted anyway after ``give_up`` seconds (the
bus lease, after which a resume takes the log regardless, LOG_HOLD).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

__all__ = ["COUNTED", "CountedBarriers"]

#: The ``g`` of a stream entry whose frame was counted as on its way to the holder.
#: A Channel's envelopes carry no ``among``, and no header value holds a control
#: character, so it is told from any real one.
COUNTED: Final = "\x01"


class CountedBarriers:
    """One broker's counts of counted frames read, and the barriers it has up.

    Args:
        lift: submits the call that lifts the barrier of a Channel (``LOG_SETTLED``).
        give_up: seconds after which a barrier still up is lifted anyway.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        lift: Callable[[str], Any],
        *,
        give_up: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lift = lift
        self._give_up = give_up
        self._clock = clock
        #: Channel held here (or released, its barrier up) -> counted frames read.
        self._read: dict[str, int] = {}
        #: Channel -> (how many were sent, when to give up) while its barrier is up.
        self._waiting: dict[str, tuple[int, float]] = {}

    def holding(self, channel_id: str) -> None:
        """This broker takes the log of ``channel_id``: its count starts again (the hold
        resets the log's, and lifts a barrier of ours still up)."""
        self._read[channel_id] = 0
        self._waiting.pop(channel_id, None)

    def count(self, channel_id: str) -> int:
        """The counted frames for ``channel_id`` the reader has handled so far."""
        return self._read.get(channel_id, 0)

    def read(self, channel_id: str) -> None:
        """The reader handed a counted frame for ``channel_id`` on (delivered, or
        passed on into the log)."""
        read = self._read.get(channel_id)
        if read is None:
            return
        read += 1
        self._read[channel_id] = read
        waiting = self._waiting.get(channel_id)
        if waiting is not None and read >= waiting[0]:
            self._done(channel_id)

    def released(self, channel_id: str, sent: int | None) -> None:
        """The release of ``channel_id`` ran: ``sent`` frames had been counted (0: no
        barrier went up; None: the log was not held here)."""
        if not sent:
            self._read.pop(channel_id, None)
            self._waiting.pop(channel_id, None)
            return
        if self._read.get(channel_id, 0) >= sent:
            self._done(channel_id)
            return
        self._read.setdefault(channel_id, 0)
        self._waiting[channel_id] = (sent, self._clock() + self._give_up)

    def forget(self, channel_id: str) -> None:
        """The log is gone (dropped): nothing to count or lift."""
        self._read.pop(channel_id, None)
        self._waiting.pop(channel_id, None)

    def expire(self) -> None:
        """Lift the barriers up for longer than ``give_up``."""
        if not self._waiting:
            return
        now = self._clock()
        for channel_id in [c for c, (_, until) in self._waiting.items() if until <= now]:
            self._done(channel_id)

    def _done(self, channel_id: str) -> None:
        self._waiting.pop(channel_id, None)
        self._read.pop(channel_id, None)
        self._lift(channel_id)
