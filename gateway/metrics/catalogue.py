"""Every metric the broker exports, named once: its type, labels and meaning.

The collector (gateway.metrics.collector) builds its families from these
entries, ``docs/operations.md`` lists them (a test checks the page against this
table) and a test checks the Grafana dashboard in ``k8s/`` names only these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

__all__ = ["METRICS", "Metric", "MetricKind", "by_name", "metrics_table"]

MetricKind = Literal["counter", "gauge", "histogram"]


@dataclass(frozen=True, slots=True)
class Metric:
    """One metric family."""

    #: The family's name; a counter's samples add ``_total``, a histogram's
    #: ``_bucket``, ``_sum`` and ``_count``.
    name: str
    kind: MetricKind
    #: Its label names.
    labels: tuple[str, ...]
    #: What it counts or measures (the HELP line).
    doc: str


METRICS: Final = (
    Metric(
        "asbp_broker_info",
        "gauge",
        ("broker", "engine", "version"),
        "Always 1; the labels name this broker, its engine and the gateway's version.",
    ),
    Metric("asbp_start_time_seconds", "gauge", (), "When this broker started (Unix time)."),
    Metric(
        "asbp_commands",
        "counter",
        ("origin", "command"),
        "Commands routed, by origin (channel: a User-Agent; agent: an Application-Agent)"
        " and Command-Name (the first [metrics] command_names names, then other).",
    ),
    Metric("asbp_faults", "counter", ("code",), "Faults sent, by fault code."),
    Metric("asbp_channels_opened", "counter", (), "Channels opened since the start."),
    Metric("asbp_channels_closed", "counter", (), "Channels closed since the start."),
    Metric("asbp_tubes_opened", "counter", (), "Tubes opened since the start."),
    Metric("asbp_tubes_closed", "counter", (), "Tubes closed since the start."),
    Metric(
        "asbp_course_up",
        "gauge",
        ("peer",),
        "1 while the Course this broker dials to the peer bus is up, else 0 (docs/courses.md).",
    ),
    Metric(
        "asbp_course_queued",
        "gauge",
        ("peer",),
        "Commands waiting in the queue for the peer bus, or sent and not yet acknowledged.",
    ),
    Metric(
        "asbp_course_crossings",
        "counter",
        ("peer", "event"),
        "Crossings to the peer bus: sent (resends included) and acknowledged.",
    ),
    Metric(
        "asbp_course_received",
        "counter",
        ("outcome",),
        "Crossings from peer buses: accepted, duplicate (seen before, dropped) or spoofed"
        " (dropped).",
    ),
    Metric(
        "asbp_slow_reader_disconnects",
        "counter",
        ("kind",),
        "Channels (kind=channel) and Tubes (kind=tube) closed with fault 2105 for not reading.",
    ),
    Metric(
        "asbp_throttled_handshakes",
        "counter",
        (),
        "Tube handshakes refused with HTTP 429 (too many failed handshakes from one address).",
    ),
    Metric(
        "asbp_busy_handshakes",
        "counter",
        (),
        "WebSocket handshakes and HTTP Channel opens refused with HTTP 503 and fault 2115"
        " (channels.max_handshakes being served already).",
    ),
    Metric(
        "asbp_abandoned_handshakes",
        "counter",
        (),
        "WebSocket handshakes not served because their client had closed its side before the"
        " server read the upgrade request (it waited for longer than its client did).",
    ),
    Metric(
        "asbp_event_log_dropped",
        "counter",
        (),
        "Event-log records dropped because the log's buffer was full.",
    ),
    Metric("asbp_queue_publications", "counter", (), "Messages published to queues."),
    Metric(
        "asbp_queue_deliveries",
        "counter",
        (),
        "Queue messages handed to consumers and pollers, redeliveries included.",
    ),
    Metric(
        "asbp_queue_redeliveries",
        "counter",
        (),
        "Queue messages handed out again after an earlier delivery was not acknowledged.",
    ),
    Metric("asbp_queue_acks", "counter", (), "Queue messages acknowledged."),
    Metric("asbp_channels", "gauge", ("transport",), "Open Channels by transport."),
    Metric("asbp_tubes", "gauge", ("agent",), "Open Tubes by Application-Agent identity."),
    Metric("asbp_subjects", "gauge", (), "Subjects signed in or signing in."),
    Metric(
        "asbp_commands_in_flight",
        "gauge",
        (),
        "User-Agent Commands awaiting their Respondent's answer.",
    ),
    Metric(
        "asbp_outbox_bytes",
        "gauge",
        ("kind",),
        "Bytes waiting in the outboxes of Channels (kind=channel) and Tubes (kind=tube).",
    ),
    Metric("asbp_queues", "gauge", (), "Queues and virtual queues in the engine."),
    Metric(
        "asbp_queue_depth",
        "gauge",
        ("queue",),
        "Messages in a queue: the [metrics] top_queues deepest queues only.",
    ),
    Metric("asbp_queue_depth_all", "gauge", (), "Messages in every queue together."),
    Metric(
        "asbp_respondent_latency_seconds",
        "histogram",
        ("command",),
        "Seconds from a User-Agent Command reaching the broker to its Respondent's"
        " answer, by Command-Name (bounded as for asbp_commands_total); a sample: the"
        " first answer and one in 8 after it timed, each counting for the 8 since.",
    ),
    Metric(
        "asbp_engine_call_seconds",
        "histogram",
        (),
        "Seconds the engine took to carry out a messaging Command (publish, ack,"
        " subscribe...; polls excepted).",
    ),
    Metric(
        "asbp_poll_wait_seconds",
        "histogram",
        (),
        "Seconds an asbp.poll waited before it was answered.",
    ),
)


def by_name() -> dict[str, Metric]:
    """The catalogue by family name."""
    return {metric.name: metric for metric in METRICS}


def _sample_name(metric: Metric) -> str:
    return metric.name + "_total" if metric.kind == "counter" else metric.name


def metrics_table() -> str:
    """The Markdown table of every metric, as ``docs/operations.md`` holds it."""
    rows = [
        "| Metric | Type | Labels | Meaning |",
        "|---|---|---|---|",
    ]
    for metric in METRICS:
        labels = ", ".join(f"`{label}`" for label in metric.labels) or "none"
        doc = metric.doc.replace("|", "\\|")
        rows.append(f"| `{_sample_name(metric)}` | {metric.kind} | {labels} | {doc} |")
    return "\n".join(rows) + "\n"
