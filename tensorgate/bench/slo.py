"""``--slo p99=80ms``: latency objectives a run must meet, or the command exits non-zero.

Pure parsing and checking, so CI pipelines can rely on exact semantics: an objective is met
when the measured statistic is less than or equal to the limit; a run with no successful
requests misses every objective.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from tensorgate.bench.stats import Summary

# The seed's real-time speech objectives, per chunk: what ``--sequences`` checks unless given others.
REAL_TIME_SPEECH = ("p50=20ms", "p90=50ms", "p99=100ms")

_UNITS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
_PATTERN = re.compile(r"^\s*(mean|p(\d+(?:\.\d+)?))\s*=\s*(\d+(?:\.\d+)?)\s*(us|µs|ms|s)\s*$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Slo:
    """One objective: ``percentile`` is None for the mean."""

    text: str
    percentile: float | None
    limit_s: float

    def measured(self, summary: Summary) -> float:
        if self.percentile is None:
            return summary.mean
        return summary.percentiles.get(self.percentile, math.nan)

    def met(self, summary: Summary) -> bool:
        value = self.measured(summary)
        return not math.isnan(value) and value <= self.limit_s


def parse_slo(text: str) -> Slo:
    """Parse ``pNN=VALUE(us|ms|s)`` or ``mean=VALUE(unit)``; raise ValueError with a usable message."""
    match = _PATTERN.match(text)
    if match is None:
        raise ValueError(f"cannot read SLO {text!r}: write pNN=VALUE or mean=VALUE with a unit us, ms or s (p99=80ms)")
    stat, q, value, unit = match.groups()
    percentile = None if stat.lower() == "mean" else float(q)
    if percentile is not None and not 0 < percentile <= 100:
        raise ValueError(f"SLO {text!r}: the percentile must be within (0, 100]")
    return Slo(text.strip(), percentile, float(value) * _UNITS[unit.lower()])


def extra_percentiles(slos: list[Slo]) -> list[float]:
    """The percentiles the summaries must compute so every SLO can be checked."""
    return [s.percentile for s in slos if s.percentile is not None]


def real_time_speech() -> list[Slo]:
    """:data:`REAL_TIME_SPEECH` parsed."""
    return [parse_slo(text) for text in REAL_TIME_SPEECH]
