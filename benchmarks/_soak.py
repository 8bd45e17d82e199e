"""The soak's arithmetic (its bars, and the planted leak that must miss them): pure functions, no I/O, no clock.

``bench_soak.py`` samples the server's memory and times every request; everything it concludes
from those numbers is decided here, so ``tests/bench/test_soak_fit.py`` can check the detector on
series whose answer is known: a known slope comes back, a flat noisy series passes, a leak fails.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MIB = 1024 * 1024
# The bar: the tree's memory may grow by less than this after warm-up.
SLOPE_BAR_MIB_PER_MIN = 0.5
# The soak discards the first 2 minutes of 10; shorter runs discard the same share.
WARMUP_FRACTION = 0.2
# PSS(end) - PSS(end of warm-up) below the larger of 5 % and 16 MiB.
GROWTH_BAR_FRACTION = 0.05
GROWTH_BAR_MIB = 16.0
# FDs, threads and children "flat": the end within 2 of the value at the end of warm-up.
FLAT_TOLERANCE = 2
# P99 of the last minute under 1.5 times P99 of the first.
P99_RATIO_BAR = 1.5


@dataclass(frozen=True, slots=True)
class Fit:
    """An ordinary least-squares line through (minutes, MiB) points.

    ``stderr`` is the slope's textbook standard error, which assumes independent residuals; memory
    samples a few seconds apart are correlated, so it understates the uncertainty and is shown
    for scale only. The verdict reads the slope alone.
    """

    slope: float  # MiB per minute
    intercept: float  # MiB at minute 0
    stderr: float  # MiB per minute
    points: int
    residual_sd: float  # MiB

    def at(self, minute: float) -> float:
        return self.intercept + self.slope * minute


def ols(xs: Sequence[float], ys: Sequence[float]) -> Fit:
    """The least-squares line of ``ys`` on ``xs``; needs at least three points with distinct xs."""
    n = len(xs)
    if n != len(ys):
        raise ValueError("xs and ys differ in length")
    if n < 3:
        raise ValueError("a fit needs at least three points")
    mean_x = math.fsum(xs) / n
    mean_y = math.fsum(ys) / n
    sxx = math.fsum((x - mean_x) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("a fit needs distinct xs")
    sxy = math.fsum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx
    intercept = mean_y - slope * mean_x
    sse = math.fsum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys, strict=True))
    residual_var = sse / (n - 2)
    return Fit(slope, intercept, math.sqrt(residual_var / sxx), n, math.sqrt(residual_var))


def warmup_s(duration_s: float, fraction: float = WARMUP_FRACTION) -> float:
    """Seconds at the start of a run that the fit leaves out: 120 of 600, the same share of less."""
    return duration_s * fraction


def memory_fit(times_s: Sequence[float], sizes_bytes: Sequence[float], warmup: float) -> Fit:
    """The slope of memory (bytes, sampled at seconds since the load began) after ``warmup`` seconds,
    in MiB per minute."""
    kept = [(t / 60.0, b / MIB) for t, b in zip(times_s, sizes_bytes, strict=True) if t >= warmup]
    return ols([m for m, _ in kept], [v for _, v in kept])


def slope_met(fit: Fit, bar: float = SLOPE_BAR_MIB_PER_MIN) -> bool:
    """The memory slope after warm-up is under the bar."""
    return fit.slope < bar


def growth_bar_mib(at_warmup_mib: float) -> float:
    """The allowance for growth from the end of warm-up to the end: max(5 %, 16 MiB)."""
    return max(GROWTH_BAR_FRACTION * at_warmup_mib, GROWTH_BAR_MIB)


def growth_met(at_warmup_mib: float, at_end_mib: float) -> bool:
    return at_end_mib - at_warmup_mib < growth_bar_mib(at_warmup_mib)


def flat(before: int, after: int, tolerance: int = FLAT_TOLERANCE) -> bool:
    """ "Flat" for counts (FDs, threads, processes): within ``tolerance`` of each other."""
    return abs(after - before) <= tolerance


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation, numpy's default; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def window_p99(starts_s: Sequence[float], latencies_s: Sequence[float], begin: float, end: float) -> float:
    """P99 of the latencies of requests due within ``[begin, end)`` seconds of the load's start."""
    return percentile([lat for t, lat in zip(starts_s, latencies_s, strict=True) if begin <= t < end], 99.0)


def p99_met(first: float, last: float, ratio: float = P99_RATIO_BAR) -> bool:
    return last < ratio * first


def word(met: bool) -> str:
    """How a verdict line says it."""
    return "met" if met else "missed"


def parse_rollup(text: str) -> dict[str, int]:
    """``/proc/<pid>/smaps_rollup`` as bytes per field (``Pss_Anon: 112 kB`` -> 114688)."""
    fields: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            fields[name] = int(parts[0]) * 1024
    return fields


def held_bytes(rollup: dict[str, int]) -> int:
    """What the soak fits: the process's proportional share of its anonymous and shared-memory
    pages (``Pss_Anon + Pss_Shmem``), which leaves out the file-backed share (``Pss_File``).

    Why not the whole PSS: a library page mapped by N processes counts 1/N in each, N counted over
    the whole host, so the server's PSS moves whenever unrelated processes map or unmap the same
    libraries (numpy, onnxruntime, the interpreter). On this shared host a 10-minute run of a flat
    server read +1.8 MiB/min of PSS (residual s.d. 3.7 MiB) while its USS and RSS read +0.04, with
    a test suite starting servers beside it. Anonymous pages are shared only between a process and
    its forks, and shared memory here only between the server and its workers, so their PSS summed
    over the tree counts each page once and depends on nothing outside the tree; a leak (heap
    that is never freed) is anonymous memory.
    """
    return rollup.get("Pss_Anon", 0) + rollup.get("Pss_Shmem", 0)
