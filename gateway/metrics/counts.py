"""The counters the router bumps per Command: plain ints and dicts, no locks.

Theory of operation
-------------------
``prometheus_client``'s ``Counter.inc`` takes a lock and walks a label lookup
on every call; at a hundred thousand Commands a second that is a visible share
of the router's budget. The router is single-threaded and never awaits while
it routes, so it can count with a dict lookup and an int add instead, and the
Prometheus families are built from these numbers when ``/metrics`` is scraped
(gateway.metrics.collector). A scrape reads the dicts from the same event loop,
so it never sees a half-made update.

Command-Names come from clients, so a label per name would let any client grow
the scrape (and the broker's memory) without bound: the first
``max_names`` names seen get their own label, every later one counts as
``other`` (Centrifugo labels by namespace, never by channel, for the same
reason).

The Respondent-latency histogram is a sample: per Command-Name, the first answer
and then one answer in ``latency_sample`` is timed, and each timed answer counts
for the ``latency_sample`` answers since the previous one. Timing every answer
(a clock read and a bucket search) was half of what metrics cost the router;
a countdown costs an int subtraction. Quantiles and the mean (``_sum`` over
``_count``) are estimated from that systematic sample (every eighth answer of a
name), which is unbiased unless latencies follow the sample's own period;
``_count`` trails the answers by less than ``latency_sample`` and never exceeds
them; ``asbp_commands_total`` counts every Command exactly.
"""

from __future__ import annotations

from bisect import bisect_left as _bisect
from collections.abc import Callable, Sequence
from typing import Final

__all__ = [
    "LATENCY_BUCKETS",
    "LATENCY_SAMPLE",
    "NO_NAME",
    "OTHER",
    "CommandNames",
    "Histogram",
    "MessagingCounts",
    "RouterCounts",
]

#: The label of every Command-Name past the first ``max_names``.
OTHER: Final = "other"
#: The label of an agent's Commands without a Command-Name (answers need none).
NO_NAME: Final = "(none)"

#: Upper bounds, in seconds, of the latency histograms' buckets (1 ms to 30 s).
LATENCY_BUCKETS: Final = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


#: One Respondent answer in this many is timed, per Command-Name (see above).
LATENCY_SAMPLE: Final = 8


class CommandNames:
    """The first ``limit`` Command-Names seen, each its own label; then ``other``."""

    __slots__ = ("_known", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._known: set[str] = set()

    def label(self, name: str) -> str:
        """The label ``name`` is counted under."""
        known = self._known
        if name in known:
            return name
        if len(known) < self.limit:
            known.add(name)
            return name
        return OTHER


class Histogram:
    """Observations counted into fixed buckets: a list of ints, no lock.

    ``counts[i]`` is the observations in ``(bounds[i-1], bounds[i]]``, the last
    one those above every bound; Prometheus' cumulative form is made at scrape.
    """

    __slots__ = ("bounds", "countdown", "counts", "total", "weight")

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0
        #: For a sampled histogram (RouterCounts.answered): answers until the
        #: next one is timed, and how many answers that one counts for. The
        #: first answer is timed, and counts for itself.
        self.countdown = 1
        self.weight = 1

    @property
    def count(self) -> int:
        """Observations so far (summed at scrape, not kept per observation)."""
        return sum(self.counts)

    def observe(self, value: float, weight: int = 1) -> None:
        """Count ``weight`` observations of ``value`` seconds."""
        self.counts[_bisect(self.bounds, value)] += weight
        self.total += value * weight

    def cumulative(self) -> list[tuple[str, float]]:
        """The buckets as Prometheus wants them: ``(le, observations <= le)``."""
        buckets: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip(self.bounds, self.counts, strict=False):
            running += count
            buckets.append((repr(bound), running))
        buckets.append(("+Inf", self.count))
        return buckets


class RouterCounts:
    """What the router counts while it routes; read at scrape time.

    Args:
        max_names: Command-Names with a label of their own; later ones are ``other``.
        latency_sample: one Respondent answer in this many is timed (1: every one).
    """

    __slots__ = (
        "agent_commands",
        "channel_commands",
        "faults",
        "latency_sample",
        "names",
        "respondent_latency",
    )

    def __init__(self, *, max_names: int = 100, latency_sample: int = LATENCY_SAMPLE) -> None:
        self.names = CommandNames(max_names)
        self.latency_sample = latency_sample
        #: Commands from User-Agents (Channels) by Command-Name label.
        self.channel_commands: dict[str, int] = {}
        #: Commands from Application-Agents (Tubes) by Command-Name label.
        self.agent_commands: dict[str, int] = {}
        #: Faults sent, by code.
        self.faults: dict[int, int] = {}
        #: Seconds from a Command reaching the broker to its Respondent's answer,
        #: by Command-Name label.
        self.respondent_latency: dict[str, Histogram] = {}

    def count_new(self, counts: dict[str, int], name: str) -> None:
        """Count ``name``'s first Command in ``counts`` (the hot path's miss)."""
        label = self.names.label(name)
        # An ``other`` name misses the dict again next time, and lands here again.
        counts[label] = counts.get(label, 0) + 1

    def answered(self, name: str, seconds: Callable[[], float]) -> None:
        """A Respondent answered a ``name`` Command; ``seconds()`` times it if sampled.

        gateway.routing.inflight inlines this for the router's hot path.
        """
        histogram = self.respondent_latency.get(name)
        if histogram is None:
            histogram = self.histogram(name)
        countdown = histogram.countdown - 1
        if countdown:
            histogram.countdown = countdown
            return
        weight = histogram.weight
        histogram.countdown = histogram.weight = self.latency_sample
        histogram.observe(seconds(), weight)

    def histogram(self, name: str) -> Histogram:
        """The Respondent-latency histogram ``name`` is counted in (made if new)."""
        label = self.names.label(name)
        histogram = self.respondent_latency.get(label)
        if histogram is None:
            histogram = self.respondent_latency[label] = Histogram()
        return histogram

    def fault(self, code: int) -> None:
        """A fault with ``code`` was sent."""
        faults = self.faults
        faults[code] = faults.get(code, 0) + 1


class MessagingCounts:
    """What the messaging built-ins count: queue traffic and long-polls."""

    __slots__ = (
        "acks",
        "deliveries",
        "engine_latency",
        "poll_wait",
        "publications",
        "redeliveries",
    )

    def __init__(self) -> None:
        #: Messages published to queues (``asbp.publish`` to a queue).
        self.publications = 0
        #: Messages handed to consumers and pollers, redeliveries included.
        self.deliveries = 0
        #: Of those, the ones delivered before (``deliveries`` > 1).
        self.redeliveries = 0
        #: Messages acknowledged.
        self.acks = 0
        #: Seconds an ``asbp.poll`` waited for its messages.
        self.poll_wait = Histogram()
        #: Seconds the engine took for a messaging Command's call (publish, ack,
        #: subscribe...; polls excepted, which wait on purpose).
        self.engine_latency = Histogram()

    def delivered(self, delivery_count: int) -> None:
        """A queue message went to a consumer or poller, for the ``delivery_count``-th time."""
        self.deliveries += 1
        if delivery_count > 1:
            self.redeliveries += 1
