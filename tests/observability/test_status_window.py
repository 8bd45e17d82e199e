"""The status page's last-minute window (``observability/status_window.py``) on a manual clock:
counts are conserved while they are in the window, old seconds fall out, rates cover the short span,
and a percentile read from the buckets is at most 5 % above the true one."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensorgate.clock import ManualClock
from tensorgate.observability.status_window import (
    RATE_SPAN_S,
    WINDOW_S,
    MinuteWindow,
    StatusWindows,
    bucket_upper,
    latency_bucket,
)

START = 1000.0
OUTCOME_NAMES = st.sampled_from(["success", "success", "queue_full", "timeout", "internal"])
# (seconds after START, outcome): what ends when
EVENTS = st.lists(st.tuples(st.floats(0, 200, allow_nan=False), OUTCOME_NAMES), max_size=200)


@given(EVENTS, st.floats(0, 260, allow_nan=False))
def test_outcomes_in_the_window_are_conserved_and_older_ones_fall_out(
    events: list[tuple[float, str]], read_after: float
) -> None:
    window = MinuteWindow(START)
    events = sorted(events)
    read_at = START + max(read_after, events[-1][0] if events else 0.0)
    for at, name in events:
        window.outcome(name, START + at)
    figures = window.figures(read_at)
    current = math.floor(read_at)
    expected: dict[str, int] = {}
    recent = 0
    for at, name in events:
        age = current - math.floor(START + at)
        if age < WINDOW_S:
            expected[name] = expected.get(name, 0) + 1
            recent += age < RATE_SPAN_S
    assert figures.outcomes == dict(sorted(expected.items()))
    assert figures.requests == sum(expected.values())
    assert figures.errors == {k: v for k, v in expected.items() if k != "success"}
    covered = max(1.0, min(read_at - START, read_at - (current - RATE_SPAN_S + 1)))
    assert figures.requests_per_s == pytest.approx(recent / covered, abs=1e-3)


@given(st.lists(st.floats(1e-5, 100.0, allow_nan=False), min_size=1, max_size=300))
def test_percentiles_are_within_5_percent_above_the_true_ones(latencies: list[float]) -> None:
    window = MinuteWindow(START)
    for seconds in latencies:
        window.latency(seconds, START + 0.5)
    figures = window.figures(START + 0.9)
    ordered = sorted(latencies)
    for quantile, shown in ((0.50, figures.p50_ms), (0.99, figures.p99_ms)):
        true_ms = ordered[max(1, math.ceil(quantile * len(ordered))) - 1] * 1000
        assert shown is not None
        assert true_ms * (1 - 1e-9) <= shown <= true_ms * 1.05 + 1e-3


@given(st.floats(1e-7, 1e4, allow_nan=False))
def test_a_latency_lies_in_its_bucket(seconds: float) -> None:
    index = latency_bucket(seconds)
    assert bucket_upper(index) >= seconds
    assert index == 0 or bucket_upper(index - 1) < seconds


def test_batches_and_tokens_add_up_then_leave_the_window() -> None:
    window = MinuteWindow(START)
    for rows in (1, 4, 4, 8):
        window.batch(rows, START + 1.2)
    window.tokens(30, START + 1.2)
    window.tokens(20, START + 5.5)
    figures = window.figures(START + 6.0)
    assert figures.batch_sizes == {1: 1, 4: 2, 8: 1}
    assert figures.tokens == 50
    assert figures.tokens_per_s == pytest.approx(50 / 6.0, abs=1e-3)  # the window is 6 s old
    later = window.figures(START + 11.3)  # second 1 left the rate span; it covers 9 whole seconds and 0.3
    assert later.tokens == 50 and later.tokens_per_s == pytest.approx(20 / 9.3, abs=1e-3)
    gone = window.figures(START + 6.0 + WINDOW_S)
    assert gone.requests == 0 and gone.batch_sizes == {} and gone.tokens == 0
    assert gone.p50_ms is None and gone.p99_ms is None and gone.requests_per_s == 0.0


def test_a_young_window_covers_only_its_age() -> None:
    window = MinuteWindow(START)
    assert window.figures(START + 2.5).window_s == pytest.approx(2.5)
    assert window.figures(START + 500.25).window_s == pytest.approx(WINDOW_S - 1 + 0.25)  # whole seconds and this one


def test_the_rate_span_must_fit_the_window() -> None:
    with pytest.raises(ValueError, match="rate span"):
        MinuteWindow(START, window_s=5, rate_span_s=6)


def test_status_windows_are_fed_from_the_clock_and_kept_across_loads() -> None:
    clock = ManualClock(START)
    windows = StatusWindows(clock)
    assert windows.figures("m", "1") is None
    feed = windows.feed("m", "1")
    feed.outcome_listener("success")(3.0)
    feed.latency(0.002)
    feed.batch(3.0)
    clock.advance(1.0)
    assert windows.feed("m", "1") is feed  # a version loaded again keeps its window
    figures = windows.figures("m", "1")
    assert figures is not None
    assert figures.outcomes == {"success": 3} and figures.batch_sizes == {3: 1}
    assert figures.p50_ms is not None and 2.0 <= figures.p50_ms <= 2.0 * 1.05
