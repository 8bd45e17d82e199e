"""Percentile math agrees with numpy's default (linear) definition."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensorgate.bench.stats import REPORTED, percentile, summarize

finite = st.floats(min_value=0.0, max_value=1e4, allow_nan=False, allow_infinity=False)


@given(st.lists(finite, min_size=1, max_size=300), st.floats(min_value=0.0, max_value=100.0))
def test_percentile_matches_numpy(values: list[float], q: float) -> None:
    expected = float(np.percentile(values, q))
    assert percentile(sorted(values), q) == pytest.approx(expected, rel=1e-9, abs=1e-9)


@given(st.lists(finite, min_size=1, max_size=300))
def test_summary_matches_numpy(values: list[float]) -> None:
    summary = summarize(values, extra=[99.99])
    assert summary.count == len(values)
    assert summary.mean == pytest.approx(float(np.mean(values)), rel=1e-9, abs=1e-9)
    assert summary.minimum == min(values)
    assert summary.maximum == max(values)
    for q in [*REPORTED, 99.99]:
        assert summary.get(q) == pytest.approx(float(np.percentile(values, q)), rel=1e-9, abs=1e-9)


def test_empty_summary_is_nan() -> None:
    summary = summarize([])
    assert summary.count == 0
    assert math.isnan(summary.mean) and math.isnan(summary.get(99.0)) and math.isnan(summary.tail_ratio)


def test_tail_ratio() -> None:
    values = [0.001] * 98 + [0.010] * 2
    summary = summarize(values)
    assert summary.tail_ratio == pytest.approx(summary.get(99.0) / summary.get(50.0))


def test_percentile_rejects_out_of_range() -> None:
    with pytest.raises(ValueError):
        percentile([1.0], 101.0)
