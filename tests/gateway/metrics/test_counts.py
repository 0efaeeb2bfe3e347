"""The hot path's counters: bounded Command-Name labels and plain histograms."""

from __future__ import annotations

from gateway.metrics.counts import OTHER, CommandNames, Histogram, RouterCounts


def test_the_first_names_get_labels_then_other() -> None:
    names = CommandNames(2)
    assert [names.label(n) for n in ("a", "b", "c", "a", "d")] == ["a", "b", OTHER, "a", OTHER]


def test_router_counts_stay_bounded_however_many_names_arrive() -> None:
    counts = RouterCounts(max_names=3)
    for n in range(1000):
        name = f"name{n}"
        try:
            counts.channel_commands[name] += 1
        except KeyError:
            counts.count_new(counts.channel_commands, name)
        counts.answered(name, 0.01)
    assert counts.channel_commands == {"name0": 1, "name1": 1, "name2": 1, OTHER: 997}
    assert set(counts.respondent_latency) == {"name0", "name1", "name2", OTHER}
    assert counts.respondent_latency[OTHER].count == 997


def test_histogram_buckets_are_cumulative_with_inf_last() -> None:
    histogram = Histogram((0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 2.0):
        histogram.observe(value)
    assert histogram.cumulative() == [("0.1", 2), ("1.0", 3), ("+Inf", 4)]
    assert histogram.count == 4
    assert histogram.total == 2.65


def test_faults_are_counted_by_code() -> None:
    counts = RouterCounts()
    for code in (2101, 2101, 2105):
        counts.fault(code)
    assert counts.faults == {2101: 2, 2105: 1}
