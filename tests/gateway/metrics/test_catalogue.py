"""The catalogue of metrics and docs/operations.md agree."""

from __future__ import annotations

import re
from pathlib import Path

from gateway.metrics.catalogue import METRICS, metrics_table

OPERATIONS = Path(__file__).resolve().parents[3] / "docs" / "operations.md"


def test_the_operations_page_lists_every_metric_as_the_catalogue_does() -> None:
    text = OPERATIONS.read_text(encoding="utf-8")
    match = re.search(r"<!-- metrics-table: [^>]*-->\n(.*?)<!-- /metrics-table -->", text, re.S)
    assert match is not None, "docs/operations.md lost its metrics table markers"
    assert match[1] == metrics_table(), (
        "docs/operations.md's metrics table is stale: paste metrics_table() from "
        "gateway/metrics/catalogue.py"
    )


def test_names_are_unique_and_prometheus_shaped() -> None:
    names = [metric.name for metric in METRICS]
    assert len(set(names)) == len(names)
    for metric in METRICS:
        assert re.fullmatch(r"asbp_[a-z_]+", metric.name)
        assert not metric.name.endswith("_total"), "counters get _total from the encoder"
        assert metric.doc.endswith(".")
