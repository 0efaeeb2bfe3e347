"""The hot path's counters: bounded Command-Name labels and plain histograms."""

from __future__ import annotations

from gateway.metrics.counts import LATENCY_SAMPLE, OTHER, CommandNames, Histogram, RouterCounts


def test_the_first_names_get_labels_then_other() -> None:
    names = CommandNames(2)
    assert [names.label(n) for n in ("a", "b", "c", "a", "d")] == ["a", "b", OTHER, "a", OTHER]


def test_router_counts_stay_bounded_however_many_names_arrive() -> None:
    counts = RouterCounts(max_names=3, latency_sample=1)
    for n in range(1000):
        name = f"name{n}"
        try:
            counts.channel_commands[name] += 1
        except KeyError:
            counts.count_new(counts.channel_commands, name)
        counts.answered(name, lambda: 0.01)
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


def test_latency_is_sampled_and_weighted_so_the_count_never_exceeds_the_answers() -> None:
    counts = RouterCounts(latency_sample=4)
    timed: list[int] = []
    for answer in range(1, 11):

        def seconds(answer: int = answer) -> float:
            timed.append(answer)
            return 0.002

        counts.answered("quote", seconds)
        histogram = counts.respondent_latency["quote"]
        # Timed: the first, then every fourth, each counting for the four since.
        assert histogram.count == 1 + 4 * ((answer - 1) // 4) <= answer
    assert timed == [1, 5, 9]
    assert histogram.cumulative()[:2] == [("0.001", 0), ("0.0025", 9)]
    assert histogram.total == 9 * 0.002


def test_the_default_sample_times_the_first_answer_of_every_name() -> None:
    counts = RouterCounts()
    for name in ("a", "b"):
        counts.answered(name, lambda: 0.5)
    assert {name: h.count for name, h in counts.respondent_latency.items()} == {"a": 1, "b": 1}
    for _ in range(LATENCY_SAMPLE):
        counts.answered("a", lambda: 0.5)
    assert counts.respondent_latency["a"].count == 1 + LATENCY_SAMPLE
