"""Per-tenant figures (``observability/tenant_window.py``) on a manual clock: nothing until a tenant
is named, the busiest shown by name and the rest in one row, and whatever names clients send, a
bounded number of windows and of metric labels, with every request counted under one of them."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from tensorgate.clock import ManualClock
from tensorgate.observability.metrics import Metrics
from tensorgate.observability.tenant_window import (
    LABEL_AFTER,
    MAX_LABELLED,
    MAX_TRACKED,
    OTHER_LABEL,
    SHARED_LABEL,
    TenantWindows,
)


def setup(*configured: str) -> tuple[TenantWindows, Metrics, ManualClock]:
    clock = ManualClock()
    metrics = Metrics(CollectorRegistry(), process=False, clock=clock)
    metrics.tenants.configure(configured)
    return metrics.tenants, metrics, clock


def counted(metrics: Metrics) -> Counter[tuple[str, str]]:
    """The per-tenant counter's samples: (tenant label, outcome) -> requests."""
    found: Counter[tuple[str, str]] = Counter()
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name == "tensorgate_tenant_requests_total":
                found[(sample.labels["tenant"], sample.labels["outcome"])] += int(sample.value)
    return found


def test_nothing_is_shown_until_a_request_names_a_tenant() -> None:
    tenants, metrics, clock = setup()
    assert not tenants.active and tenants.rows() == []
    tenants.ended("", "success", 0.01)  # what a scheduler reports once one is active
    tenants.ended("steady", "success", 0.02)
    clock.advance(1.0)
    assert tenants.active
    rows = {row.name: row for row in tenants.rows()}
    assert set(rows) == {"", "steady"}
    assert counted(metrics) == {(SHARED_LABEL, "success"): 1, (OTHER_LABEL, "success"): 1}


def test_the_busiest_are_shown_by_name_and_the_rest_in_one_row() -> None:
    tenants, _, clock = setup()
    for rank, name in enumerate("abcdefghij"):  # a: 10 requests, b: 9, ... j: 1
        for _ in range(10 - rank):
            tenants.ended(name, "success", 0.001 * (rank + 1))
    tenants.ended("a", "queue_full", None)  # refused at admission: counted, no latency
    clock.advance(2.0)
    rows = tenants.rows(shown=3)
    assert [row.name for row in rows] == ["a", "b", "c", None]
    first = rows[0].figures
    assert first.outcomes == {"queue_full": 1, "success": 10} and first.p99_ms == pytest.approx(1.0, rel=0.05)
    others = rows[-1]
    assert others.tenants == 7 and others.figures.requests == sum(range(1, 8))
    assert others.figures.p99_ms == pytest.approx(10.0, rel=0.05)  # from the merged latencies: j's
    assert others.figures.requests_per_s == pytest.approx(others.figures.requests / 2.0, abs=0.01)
    clock.advance(61.0)
    assert tenants.rows() == []  # the minute passed: nothing to show, and they are forgotten


def test_a_flood_of_names_shares_one_window_until_the_idle_are_forgotten() -> None:
    tenants, _, clock = setup()
    for index in range(MAX_TRACKED + 50):
        tenants.ended(f"t{index}", "success", 0.001)
    rows = tenants.rows(shown=1000)
    assert len(rows) == MAX_TRACKED + 1 and rows[-1].name is None and rows[-1].figures.requests == 50
    clock.advance(61.0)
    tenants.ended("late", "success", 0.001)  # the first tracked went idle: room for a newcomer
    assert [row.name for row in tenants.rows(shown=1000)] == ["late"]


def test_configured_and_busy_tenants_get_labels_and_the_rest_count_as_other() -> None:
    tenants, metrics, _ = setup("gold", OTHER_LABEL)
    tenants.ended("gold", "success", 0.001)
    for _ in range(LABEL_AFTER + 5):
        tenants.ended("busy", "success", 0.001)
    tenants.ended("once", "timeout", 0.5)
    tenants.ended(OTHER_LABEL, "success", 0.001)  # a tenant that calls itself "other" gets no label
    assert counted(metrics) == {
        ("gold", "success"): 1,
        (OTHER_LABEL, "success"): LABEL_AFTER + 1,  # busy's requests before its label, and "other"'s
        ("busy", "success"): 5,
        (OTHER_LABEL, "timeout"): 1,
    }


_names = st.one_of(st.sampled_from(["", "gold", "a", "b"]), st.integers(0, 200).map(lambda n: f"n{n}"))
_events = st.lists(
    st.tuples(_names, st.sampled_from(["success", "queue_full", "timeout"]), st.integers(1, 300), st.booleans()),
    max_size=400,
)


@settings(max_examples=60, deadline=None)
@given(_events)
def test_whatever_names_clients_send_windows_and_labels_stay_bounded_and_every_request_counts(
    events: list[tuple[str, str, int, bool]],
) -> None:
    tenants, metrics, clock = setup("gold")
    for name, outcome, repeat, later in events:
        for _ in range(repeat):
            tenants.ended(name, outcome, None if outcome == "queue_full" else 0.001)
        if later:
            clock.advance(7.0)
    samples = counted(metrics)
    assert sum(samples.values()) == sum(repeat for _, _, repeat, _ in events)
    labels = {label for label, _ in samples}
    assert len(labels - {"gold", SHARED_LABEL, OTHER_LABEL}) <= MAX_LABELLED
    assert len(tenants.rows(shown=10_000)) <= MAX_TRACKED + 1
