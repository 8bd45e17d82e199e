"""``--slo`` parsing and checking, and duration parsing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensorgate.bench.slo import parse_slo
from tensorgate.bench.stats import summarize
from tensorgate.bench.units import parse_duration


@pytest.mark.parametrize(
    ("text", "percentile", "limit"),
    [
        ("p99=80ms", 99.0, 0.080),
        ("p50=500us", 50.0, 0.0005),
        ("p99.9=1.5s", 99.9, 1.5),
        ("mean=5ms", None, 0.005),
        ("P95 = 12 MS", 95.0, 0.012),
        ("p100=2s", 100.0, 2.0),
    ],
)
def test_parse(text: str, percentile: float | None, limit: float) -> None:
    slo = parse_slo(text)
    assert slo.percentile == percentile
    assert slo.limit_s == pytest.approx(limit)


@pytest.mark.parametrize("text", ["p99", "p99=80", "p99=80min", "q99=1ms", "p0=1ms", "p101=1ms", "mean=-1ms", ""])
def test_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="SLO"):
        parse_slo(text)


def test_met_and_missed() -> None:
    summary = summarize([0.010] * 99 + [0.100])
    assert parse_slo("p50=10ms").met(summary)
    assert not parse_slo("p99.9=50ms").met(summary)
    assert parse_slo("mean=11ms").met(summary)
    assert not parse_slo("mean=10ms").met(summary)


def test_no_data_misses_every_slo() -> None:
    assert not parse_slo("p99=1s").met(summarize([], extra=[99.0]))


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["us", "ms", "s"]))
def test_units(value: int, unit: str) -> None:
    scale = {"us": 1e-6, "ms": 1e-3, "s": 1.0}[unit]
    assert parse_slo(f"p90={value}{unit}").limit_s == pytest.approx(value * scale)


@pytest.mark.parametrize(("text", "seconds"), [("5s", 5.0), ("500ms", 0.5), ("2m", 120.0), ("1.5", 1.5)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


def test_parse_duration_rejects() -> None:
    with pytest.raises(ValueError):
        parse_duration("five seconds")
