"""``/metrics``: the Prometheus families, built from the broker's counters at scrape.

Nothing here runs per Command. A scrape reads the plain counters the router,
the registries and the messaging built-ins keep (gateway.metrics.counts), walks
the open Channels and Tubes once for the gauges, asks the engine for every
queue's depth in one call, keeps the ``top_queues`` deepest, and hands the
families to ``prometheus_client``'s text encoder. No registry is global: each
scrape builds its own collector over one Broker, so several brokers can share
a process (the tests run many).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from importlib import metadata

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from gateway.broker import Broker
from gateway.connections.channels import ChannelKind
from gateway.metrics.catalogue import by_name
from gateway.metrics.counts import Histogram

__all__ = ["CONTENT_TYPE_LATEST", "BrokerCollector", "render"]

_CATALOGUE = by_name()


def _version() -> str:
    try:
        return metadata.version("asbp-gateway")
    except metadata.PackageNotFoundError:  # run from a checkout without installing
        return "unknown"


def _counter(name: str) -> CounterMetricFamily:
    entry = _CATALOGUE[name]
    return CounterMetricFamily(name, entry.doc, labels=entry.labels)


def _gauge(name: str) -> GaugeMetricFamily:
    entry = _CATALOGUE[name]
    return GaugeMetricFamily(name, entry.doc, labels=entry.labels)


def _histogram(name: str) -> HistogramMetricFamily:
    entry = _CATALOGUE[name]
    return HistogramMetricFamily(name, entry.doc, labels=entry.labels)


def _add_histogram(family: HistogramMetricFamily, labels: list[str], histogram: Histogram) -> None:
    family.add_metric(labels, histogram.cumulative(), histogram.total)


class BrokerCollector(Collector):
    """One scrape of one broker.

    Args:
        broker: the broker scraped.
        depths: every queue's depth (``Engine.depths``), fetched before the scrape
            because a collector cannot await.
        throttled: Tube handshakes the throttle refused so far.
        busy: handshakes refused with 503 so far (``channels.max_handshakes``).
        abandoned: handshakes not served because their client had gone.
    """

    def __init__(
        self,
        broker: Broker,
        depths: Mapping[str, int],
        *,
        throttled: int,
        busy: int = 0,
        abandoned: int = 0,
    ) -> None:
        self._broker = broker
        self._depths = depths
        self._throttled = throttled
        self._busy = busy
        self._abandoned = abandoned

    def collect(self) -> Iterator[Metric]:
        broker = self._broker
        config = broker.config
        router = broker.router

        info = _gauge("asbp_broker_info")
        info.add_metric([broker.broker_id, config.engine, _version()], 1)
        yield info
        started = _gauge("asbp_start_time_seconds")
        started.add_metric([], broker.started_at)
        yield started

        counts = router.counts
        commands = _counter("asbp_commands")
        faults = _counter("asbp_faults")
        latency = _histogram("asbp_respondent_latency_seconds")
        if counts is not None:
            for name, value in counts.channel_commands.items():
                commands.add_metric(["channel", name], value)
            for name, value in counts.agent_commands.items():
                commands.add_metric(["agent", name], value)
            for code, value in sorted(counts.faults.items()):
                faults.add_metric([str(code)], value)
            for name, histogram in counts.respondent_latency.items():
                _add_histogram(latency, [name], histogram)
        yield commands
        yield faults

        for name, value in (
            ("asbp_channels_opened", broker.channels.opened),
            ("asbp_channels_closed", broker.channels.closed),
            ("asbp_tubes_opened", broker.respondents.attached),
            ("asbp_tubes_closed", broker.respondents.detached),
            ("asbp_throttled_handshakes", self._throttled),
            ("asbp_busy_handshakes", self._busy),
            ("asbp_abandoned_handshakes", self._abandoned),
            (
                "asbp_event_log_dropped",
                broker.event_log.dropped if broker.event_log is not None else 0,
            ),
        ):
            family = _counter(name)
            family.add_metric([], value)
            yield family
        slow = _counter("asbp_slow_reader_disconnects")
        slow.add_metric(["channel"], router.replies.slow_channels)
        slow.add_metric(["tube"], router.replies.slow_tubes)
        yield slow
        yield from self._courses()

        queue_counts = broker.messaging.counts
        for name, value in (
            ("asbp_queue_publications", queue_counts.publications),
            ("asbp_queue_deliveries", queue_counts.deliveries),
            ("asbp_queue_redeliveries", queue_counts.redeliveries),
            ("asbp_queue_acks", queue_counts.acks),
        ):
            family = _counter(name)
            family.add_metric([], value)
            yield family

        yield from self._connections()
        yield from self._queues()

        yield latency
        engine = _histogram("asbp_engine_call_seconds")
        _add_histogram(engine, [], queue_counts.engine_latency)
        yield engine
        poll = _histogram("asbp_poll_wait_seconds")
        _add_histogram(poll, [], queue_counts.poll_wait)
        yield poll

    def _courses(self) -> Iterator[Metric]:
        courses = self._broker.courses
        up = _gauge("asbp_course_up")
        queued = _gauge("asbp_course_queued")
        crossings = _counter("asbp_course_crossings")
        received = _counter("asbp_course_received")
        if courses is not None:
            for domain, is_up, depth, sent, acknowledged in courses.peers():
                up.add_metric([domain], 1 if is_up else 0)
                queued.add_metric([domain], depth)
                crossings.add_metric([domain, "sent"], sent)
                crossings.add_metric([domain, "acknowledged"], acknowledged)
            for outcome, value in (
                ("accepted", courses.accepted),
                ("duplicate", courses.duplicates),
                ("spoofed", courses.spoofed),
            ):
                received.add_metric([outcome], value)
        yield up
        yield queued
        yield crossings
        yield received

    def _connections(self) -> Iterator[Metric]:
        broker = self._broker
        by_transport = dict.fromkeys((kind.value for kind in ChannelKind), 0)
        channel_bytes = 0
        for channel in broker.channels:
            by_transport[channel.kind.value] += 1
            channel_bytes += channel.outbox.queued_bytes
        channels = _gauge("asbp_channels")
        for transport, value in by_transport.items():
            channels.add_metric([transport], value)
        yield channels

        tubes = _gauge("asbp_tubes")
        tube_bytes = 0
        for agent, agent_tubes in sorted(broker.respondents.agents().items()):
            tubes.add_metric([agent], len(agent_tubes))
            tube_bytes += sum(tube.outbox.queued_bytes for tube in agent_tubes)
        yield tubes

        outbox = _gauge("asbp_outbox_bytes")
        outbox.add_metric(["channel"], channel_bytes)
        outbox.add_metric(["tube"], tube_bytes)
        yield outbox

        auth = broker.router.auth
        subjects = _gauge("asbp_subjects")
        subjects.add_metric([], len(auth.subjects) if auth is not None else 0)
        yield subjects
        in_flight = _gauge("asbp_commands_in_flight")
        in_flight.add_metric([], broker.router.in_flight)
        yield in_flight

    def _queues(self) -> Iterator[Metric]:
        depths = self._depths
        queues = _gauge("asbp_queues")
        queues.add_metric([], len(depths))
        yield queues
        top = _gauge("asbp_queue_depth")
        # nlargest is O(n log k): a hundred thousand queues cost a few milliseconds.
        limit = self._broker.config.metrics.top_queues
        for name, depth in heapq.nlargest(limit, depths.items(), key=lambda item: item[1]):
            top.add_metric([name], depth)
        yield top
        total = _gauge("asbp_queue_depth_all")
        total.add_metric([], sum(depths.values()))
        yield total


async def render(broker: Broker, *, throttled: int, busy: int = 0, abandoned: int = 0) -> bytes:
    """The Prometheus text exposition of ``broker`` now."""
    depths = await broker.engine.depths()
    collector = BrokerCollector(broker, depths, throttled=throttled, busy=busy, abandoned=abandoned)
    return generate_latest(collector)
