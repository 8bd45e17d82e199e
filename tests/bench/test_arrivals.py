"""Poisson schedules: the right rate, exponential gaps, repeatable with a seed."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgate.bench.arrivals import poisson_offsets, poisson_schedule


@pytest.mark.parametrize("rate", [50.0, 1000.0, 20000.0])
def test_rate_within_tolerance(rate: float) -> None:
    duration = 200_000 / rate  # ~200k expected arrivals: the count's sd is ~0.22 %
    schedule = poisson_schedule(rate, duration, seed=3)
    assert len(schedule) / duration == pytest.approx(rate, rel=0.01)


def test_gaps_are_exponential() -> None:
    offsets = np.array(list(itertools.islice(poisson_offsets(100.0, seed=1), 50_000)))
    gaps = np.diff(offsets, prepend=0.0)
    assert gaps.mean() == pytest.approx(0.01, rel=0.02)
    assert gaps.std() == pytest.approx(0.01, rel=0.03)  # exponential: sd equals the mean
    assert np.all(gaps >= 0)


def test_seeded_and_seed_sensitive() -> None:
    assert poisson_schedule(500.0, 2.0, seed=7) == poisson_schedule(500.0, 2.0, seed=7)
    assert poisson_schedule(500.0, 2.0, seed=7) != poisson_schedule(500.0, 2.0, seed=8)


@settings(max_examples=50)
@given(st.floats(min_value=0.5, max_value=5000.0), st.floats(min_value=0.01, max_value=2.0), st.integers(0, 1000))
def test_schedule_is_sorted_and_inside_the_window(rate: float, duration: float, seed: int) -> None:
    schedule = poisson_schedule(rate, duration, seed)
    assert schedule == sorted(schedule)
    assert all(0.0 <= t < duration for t in schedule)


def test_rejects_non_positive_rate() -> None:
    with pytest.raises(ValueError):
        next(poisson_offsets(0.0, seed=0))
