"""The lock-free metric families export exactly what prometheus_client's own types would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tensorgate.observability.loop_metrics import Counter, Gauge, Histogram, LoopCollector


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_counters_gauges_and_histograms_export_in_prometheus_form() -> None:
    loop = LoopCollector()
    requests = loop.add(Counter("t_requests", "Requests.", ["model"]))
    depth = loop.add(Gauge("t_depth", "Depth.", ["model"]))
    seconds = loop.add(Histogram("t_seconds", "Seconds.", ["model"], buckets=(0.001, 0.01, 0.1)))
    registry = CollectorRegistry()
    registry.register(loop)

    requests.labels("m").inc()
    requests.labels("m").inc(2)
    gauge = depth.labels("m")
    gauge.inc()
    gauge.inc()
    gauge.dec()
    child = seconds.labels("m")
    for value in (0.0005, 0.001, 0.05, 3.0):  # 0.001 lands in le=0.001: buckets are "less or equal"
        child.observe(value)

    samples = _samples(registry)
    m = (("model", "m"),)
    assert samples[("t_requests_total", m)] == 3
    assert samples[("t_depth", m)] == 1
    assert samples[("t_seconds_bucket", (("le", "0.001"), ("model", "m")))] == 2
    assert samples[("t_seconds_bucket", (("le", "0.01"), ("model", "m")))] == 2
    assert samples[("t_seconds_bucket", (("le", "0.1"), ("model", "m")))] == 3
    assert samples[("t_seconds_bucket", (("le", "+Inf"), ("model", "m")))] == 4
    assert samples[("t_seconds_count", m)] == 4
    assert abs(samples[("t_seconds_sum", m)] - 3.0515) < 1e-9


def test_a_child_is_created_once_per_label_set() -> None:
    family = Counter("t", "T.", ["a", "b"])
    assert family.labels("x", "y") is family.labels("x", "y")
    assert family.labels("x", "z") is not family.labels("x", "y")


def test_a_family_not_recording_hands_out_children_that_keep_nothing() -> None:
    """Metrics off: the same child types (callers bind them once either way), updates dropped."""
    counter, gauge = Counter("t_c", "C.", ["m"]), Gauge("t_g", "G.", ["m"])
    histogram = Histogram("t_h", "H.", ["m"], buckets=(0.1,))
    for family in (counter, gauge, histogram):
        family.recording = False
    counter.labels("x").inc()
    gauge.labels("x").inc(3)
    gauge.labels("x").set(7)
    histogram.labels("x").observe(0.05)
    assert counter.labels("x").value == 0 and gauge.labels("x").value == 0
    assert histogram.labels("x").counts == [0, 0] and histogram.labels("x").sum == 0
