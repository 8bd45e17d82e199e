"""The soak's detector (benchmarks/_soak.py) on series whose answer is known.

A synthetic series with a known slope gives that slope back; a flat series with noise passes the
0.5 MiB/min bar; a slow leak (a planted leak of 1 KiB per request) fails it; the
warm-up is left out of the fit.
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from _soak import (
    MIB,
    SLOPE_BAR_MIB_PER_MIN,
    flat,
    growth_bar_mib,
    growth_met,
    held_bytes,
    memory_fit,
    ols,
    p99_met,
    parse_rollup,
    percentile,
    slope_met,
    warmup_s,
    window_p99,
    word,
)

BASE = 180 * MIB  # about what a served MLP holds


def series(
    duration_s: float, every_s: float, slope_mib_per_min: float, noise_mib: float, seed: int = 0
) -> tuple[list[float], list[float]]:
    rng = random.Random(seed)
    times = [i * every_s for i in range(int(duration_s / every_s) + 1)]
    sizes = [BASE + (slope_mib_per_min * t / 60.0 + rng.gauss(0.0, noise_mib)) * MIB for t in times]
    return times, sizes


def test_a_known_slope_comes_back() -> None:
    times, sizes = series(600, 2, slope_mib_per_min=3.0, noise_mib=0.0)
    fit = memory_fit(times, sizes, warmup_s(600))
    assert fit.slope == pytest.approx(3.0, rel=1e-9)
    assert fit.intercept == pytest.approx(BASE / MIB, rel=1e-9)
    assert fit.stderr == pytest.approx(0.0, abs=1e-9)
    assert fit.at(10.0) == pytest.approx(BASE / MIB + 30.0)


def test_the_fit_agrees_with_numpy() -> None:
    rng = np.random.default_rng(1)
    xs = np.linspace(2, 10, 241)
    ys = 200 + 0.7 * xs + rng.normal(0, 1.5, xs.size)
    fit = ols(list(xs), list(ys))
    slope, intercept = np.polyfit(xs, ys, 1)
    assert fit.slope == pytest.approx(slope, rel=1e-9)
    assert fit.intercept == pytest.approx(intercept, rel=1e-9)
    assert fit.points == xs.size


def test_a_flat_noisy_series_passes() -> None:
    # 2 MiB of noise per sample, every 2 s for 10 minutes: the slope stays far under the bar.
    for seed in range(20):
        times, sizes = series(600, 2, slope_mib_per_min=0.0, noise_mib=2.0, seed=seed)
        fit = memory_fit(times, sizes, warmup_s(600))
        assert slope_met(fit), (seed, fit.slope)
        assert abs(fit.slope) < 0.25


def test_a_slow_leak_fails() -> None:
    # The planted leak: 1 KiB per request at 100 requests/s is ~5.9 MiB/min.
    leak = 1024 * 100 * 60 / MIB
    times, sizes = series(600, 2, slope_mib_per_min=leak, noise_mib=2.0)
    fit = memory_fit(times, sizes, warmup_s(600))
    assert not slope_met(fit)
    assert fit.slope == pytest.approx(leak, abs=0.3)
    assert word(slope_met(fit)) == "missed"


def test_a_leak_just_over_the_bar_fails_and_just_under_passes() -> None:
    over = memory_fit(*series(600, 2, SLOPE_BAR_MIB_PER_MIN * 1.5, 0.0), warmup_s(600))
    under = memory_fit(*series(600, 2, SLOPE_BAR_MIB_PER_MIN * 0.5, 0.0), warmup_s(600))
    assert not slope_met(over)
    assert slope_met(under)


def test_warmup_growth_is_left_out() -> None:
    # 40 MiB gained in the first two minutes (loading, allocator pools), flat afterwards.
    times, sizes = series(600, 2, slope_mib_per_min=0.0, noise_mib=0.0)
    sizes = [s + min(t, 120.0) / 120.0 * 40 * MIB for t, s in zip(times, sizes, strict=True)]
    assert warmup_s(600) == 120.0
    assert warmup_s(60) == 12.0
    fit = memory_fit(times, sizes, warmup_s(600))
    assert fit.slope == pytest.approx(0.0, abs=1e-9)
    assert memory_fit(times, sizes, 0.0).slope > SLOPE_BAR_MIB_PER_MIN  # kept in, it would fail


def test_too_few_points_is_an_error_not_a_pass() -> None:
    with pytest.raises(ValueError):
        memory_fit([0.0, 200.0], [BASE, BASE], warmup_s(600))
    with pytest.raises(ValueError):
        ols([1.0, 1.0, 1.0], [1.0, 2.0, 3.0])


def test_growth_flatness_and_p99_bars() -> None:
    assert growth_bar_mib(200.0) == 16.0
    assert growth_bar_mib(1000.0) == 50.0
    assert growth_met(200.0, 215.0) and not growth_met(200.0, 217.0)
    assert flat(40, 42) and flat(42, 40) and not flat(40, 43)
    assert p99_met(2.0, 2.9) and not p99_met(2.0, 3.0)


def test_window_p99_takes_only_its_window() -> None:
    starts = [0.5, 10.0, 59.9, 60.0, 61.0]
    latencies = [0.001, 0.002, 0.003, 1.0, 2.0]
    assert window_p99(starts, latencies, 0.0, 60.0) == pytest.approx(float(np.percentile([0.001, 0.002, 0.003], 99)))
    assert window_p99(starts, latencies, 60.0, 120.0) == pytest.approx(float(np.percentile([1.0, 2.0], 99)))
    assert math.isnan(window_p99(starts, latencies, 200.0, 260.0))
    assert percentile([5.0], 99.0) == 5.0


ROLLUP = """56294858d000-7fff7b405000 ---p 00000000 00:00 0                          [rollup]
Rss:                1612 kB
Pss:                 203 kB
Pss_Anon:            112 kB
Pss_File:             91 kB
Pss_Shmem:             4 kB
Private_Dirty:       112 kB
"""


def test_the_fitted_memory_is_the_anonymous_and_shmem_share_of_pss() -> None:
    fields = parse_rollup(ROLLUP)
    assert fields["Rss"] == 1612 * 1024
    assert fields["Pss_File"] == 91 * 1024
    assert held_bytes(fields) == (112 + 4) * 1024
