"""Commands in flight: User-Agent Commands with ``u`` that await an answer.

A Command from a User-Agent that carries ``u`` is in flight from the moment
the router hands it to a Respondent until a Command from the same
Application-Agent with ``d`` naming the Channel and the same ``u`` answers it
(for a stream: the one whose ``o`` reaches ``t``), the Respondent timeout
passes, or the Channel or the serving Tube closes. This table only keeps the
books; the router (gateway.routing.router) sends the User-Agent fault 2103 for a
timeout and 2102 for a Tube that closed.

Every deadline is "now + the one Respondent timeout", so arrival order is
deadline order and a deque serves where a heap would otherwise be needed.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from asbp import ChannelId, Command
from gateway.connections.channels import Channel
from gateway.connections.tubes import Tube
from gateway.metrics.counts import LATENCY_BUCKETS, RouterCounts

__all__ = ["InFlight", "InFlightTable"]

# Most answers come back within the first bucket (1 ms, from the Command's
# arrival to its answer's): one float comparison counts them, where the bucket
# search would cost a call (bench/metrics.py measures the difference).
_FIRST_BOUND = LATENCY_BUCKETS[0]


@dataclass(eq=False, slots=True)
class InFlight:
    """A User-Agent Command with ``u`` that a Respondent has not answered yet."""

    channel: Channel
    command_id: int
    tube: Tube
    name: str
    deadline: float
    #: When the Command reached the broker (the clock's seconds).
    started: float
    #: ``t`` of the answer stream, once an answer announced it.
    total: int | None = None
    done: bool = False


class InFlightTable:
    """The Commands in flight, broker-wide, with their deadlines.

    Args:
        timeout: the Respondent timeout, in seconds.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        *,
        timeout: float,
        clock: Callable[[], float] = time.monotonic,
        latency: RouterCounts | None = None,
    ) -> None:
        self._timeout = timeout
        self._clock = clock
        # The metrics' Respondent latency, counted when an answer finishes an entry.
        self._latency = latency.respondent_latency if latency is not None else None
        self._latency_histogram = latency.histogram if latency is not None else None
        self._latency_sample = latency.latency_sample if latency is not None else 1
        self._entries: dict[tuple[ChannelId, int], InFlight] = {}
        # (deadline, entry) in arrival order. A refreshed deadline appends the
        # entry again; items whose deadline no longer matches the entry's are
        # skipped.
        self._deadlines: deque[tuple[float, InFlight]] = deque()

    def __len__(self) -> int:
        return len(self._entries)

    def start(self, channel: Channel, command_id: int, tube: Tube, name: str) -> None:
        """``tube`` now owes ``channel`` an answer to ``command_id``."""
        key = (channel.id, command_id)
        previous = self._entries.get(key)
        if previous is not None:
            # The User-Agent reused a ``u`` that is still in flight (it wraps
            # at 65535): the older Command can no longer be told apart.
            self.finish(previous)
        now = self._clock()
        entry = InFlight(channel, command_id, tube, name, now + self._timeout, now)
        self._entries[key] = entry
        channel.in_flight.add(command_id)
        tube.in_flight += 1
        deadlines = self._deadlines
        # Answered entries wait at the head until their deadline; drop them
        # now, so the queue holds roughly what is in flight, not 60 s of
        # history (amortised O(1): each item is removed once).
        while deadlines and deadlines[0][1].done:
            deadlines.popleft()
        deadlines.append((entry.deadline, entry))

    def finish(self, entry: InFlight) -> None:
        """``entry`` needs no answer any more."""
        entry.done = True
        self._entries.pop((entry.channel.id, entry.command_id), None)
        entry.channel.in_flight.discard(entry.command_id)
        entry.tube.in_flight -= 1

    def get(self, channel_id: ChannelId, command_id: int) -> InFlight | None:
        """The entry for ``command_id`` of ``channel_id``, if it is in flight."""
        return self._entries.get((channel_id, command_id))

    def reassign(self, entry: InFlight, tube: Tube) -> None:
        """``tube`` owes ``entry`` from now on (a forward learned where it went)."""
        entry.tube.in_flight -= 1
        entry.tube = tube
        tube.in_flight += 1

    def answered(self, tube: Tube, channel: Channel, command: Command, command_id: int) -> None:
        """``tube`` sent ``channel`` ``command``, which carries ``u``: ``command_id``."""
        entry = self._entries.get((channel.id, command_id))
        if entry is None or entry.tube.agent_id != tube.agent_id:
            return
        total = command.total
        if total is not None:
            entry.total = total
        of_total = command.of_total
        position = of_total if of_total is not None else (1 if total is not None else None)
        if position is not None and entry.total is not None and position < entry.total:
            # A stream in progress: each part earns the Respondent more time.
            entry.deadline = self._clock() + self._timeout
            self._deadlines.append((entry.deadline, entry))
            return
        self.finish(entry)
        histograms = self._latency
        if histograms is not None:
            # RouterCounts.answered inlined (no call into gateway.metrics): this
            # runs once per answer. Only one answer in latency_sample is timed.
            histogram = histograms.get(entry.name)
            if histogram is None:
                assert self._latency_histogram is not None
                histogram = self._latency_histogram(entry.name)
            countdown = histogram.countdown - 1
            if countdown:
                histogram.countdown = countdown
                return
            weight = histogram.weight
            histogram.countdown = histogram.weight = self._latency_sample
            seconds = self._clock() - entry.started
            if seconds <= _FIRST_BOUND:
                histogram.counts[0] += weight
            else:
                histogram.counts[bisect_left(histogram.bounds, seconds)] += weight
            histogram.total += seconds * weight

    def expired(self) -> Iterator[InFlight]:
        """Finish and yield, one at a time, each entry whose deadline passed.

        A generator, so that what the caller does with one entry (a fault that
        closes a slow Channel, finishing its other entries) is seen before the
        next is taken.
        """
        now = self._clock()
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            deadline, entry = deadlines.popleft()
            if entry.done or entry.deadline != deadline:
                continue
            self.finish(entry)
            yield entry

    def close_channel(self, channel: Channel) -> None:
        """``channel`` closed: nothing it awaits is owed any more."""
        for command_id in list(channel.in_flight):
            entry = self._entries.get((channel.id, command_id))
            if entry is not None:
                self.finish(entry)

    def served_by(self, tube: Tube) -> list[InFlight]:
        """The entries ``tube`` owes an answer to."""
        return [e for e in self._entries.values() if e.tube is tube]
