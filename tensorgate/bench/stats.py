"""Latency statistics: percentiles, summaries and their merge across client processes.

Percentiles use linear interpolation between closest ranks, the same definition as
``numpy.percentile``'s default, so the numbers agree with whatever an operator computes from
the same latencies with numpy (the tests pin this).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# The percentiles every report shows; an SLO may ask for any other.
REPORTED = (50.0, 90.0, 95.0, 99.0, 99.9)
TAIL_RATIO_WARNING = 3.0


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of already sorted values; NaN when there are none."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    n = len(sorted_values)
    if n == 0:
        return math.nan
    rank = (n - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, n - 1)
    fraction = rank - low
    lo, hi = sorted_values[low], sorted_values[high]
    return lo + (hi - lo) * fraction if fraction else lo


@dataclass(frozen=True, slots=True)
class Summary:
    """One distribution in seconds: what the report prints for latency, TTFT and ITL."""

    count: int
    mean: float
    minimum: float
    maximum: float
    percentiles: dict[float, float]

    def get(self, q: float) -> float:
        return self.percentiles[q]

    @property
    def tail_ratio(self) -> float:
        """P99 / P50: a ratio above ~3 means a long tail worth looking at (queueing, GC, retries)."""
        p50, p99 = self.percentiles.get(50.0, math.nan), self.percentiles.get(99.0, math.nan)
        return p99 / p50 if p50 > 0 else math.nan


def summarize(values: Sequence[float], extra: Sequence[float] = ()) -> Summary:
    """Summary of ``values`` with the reported percentiles plus any ``extra`` ones (e.g. from SLOs)."""
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    qs = sorted({*REPORTED, *extra})
    if ordered.size == 0:
        return Summary(0, math.nan, math.nan, math.nan, {q: math.nan for q in qs})
    as_list = ordered.tolist()
    return Summary(
        count=int(ordered.size),
        mean=float(ordered.mean()),
        minimum=as_list[0],
        maximum=as_list[-1],
        percentiles={q: percentile(as_list, q) for q in qs},
    )
