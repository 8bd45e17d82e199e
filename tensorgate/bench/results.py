"""The raw record of one run: every latency kept, so percentiles are exact and runs merge by concatenation.

Keeping raw latencies (8 bytes each) rather than a histogram costs ~80 MB for 10 million
requests, which a load test of that size can afford, and makes merging the results of
``--processes N`` exact: concatenate, then compute percentiles once.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from tensorgate.bench.targets.base import Outcome


@dataclass(slots=True)
class RunResult:
    """Counted requests of one run (warm-up excluded). Latencies are those of successful requests."""

    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    tokens: int = 0
    elapsed_s: float = 0.0
    sequences: int = 0  # ``--sequences``: sequences sent to their last chunk, every chunk answered
    sequences_failed: int = 0  # ``--sequences``: sequences cut short by a failed chunk

    @property
    def successes(self) -> int:
        return len(self.latencies)

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    @property
    def completed(self) -> int:
        return self.successes + self.error_count

    @property
    def throughput(self) -> float:
        """Completed requests per second over the measured window."""
        return self.completed / self.elapsed_s if self.elapsed_s > 0 else math.nan

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else math.nan


def merge(results: Iterable[RunResult]) -> RunResult:
    """One result from several client processes that ran side by side over the same window."""
    merged = RunResult()
    errors: Counter[str] = Counter()
    for result in results:
        merged.latencies.extend(result.latencies)
        merged.ttft.extend(result.ttft)
        merged.itl.extend(result.itl)
        merged.tokens += result.tokens
        merged.sequences += result.sequences
        merged.sequences_failed += result.sequences_failed
        errors.update(result.errors)
        merged.elapsed_s = max(merged.elapsed_s, result.elapsed_s)
    merged.errors = dict(errors)
    return merged


class Recorder:
    """Collects outcomes as they complete, over a window that starts at the end of warm-up.

    Without ``window_end``, the caller decides which requests count (those that start inside the
    window) and the window runs to the last answer. With it, as in perf_analyzer's time windows,
    what counts is what completes inside ``[window_start, window_end)``, whenever it started, and
    the window is exactly that long: a closed loop keeps its concurrency up to the window's end, so
    every second of it is a second at full load. Counting by start instead stretches the window
    over the drain after the last start, while fewer and fewer requests are in flight, so the
    throughput reads low by about one request latency over the window's length (the share that
    matters on slow models, such as the ResNet-shaped one of ``benchmarks/bench_protocols.py``).
    Requests that the window's end cuts off still count if they fail, so the cut never hides an
    error.
    """

    def __init__(self, window_start: float, window_end: float | None = None) -> None:
        self.result = RunResult()
        self._window_start = window_start
        self._window_end = window_end
        self._last_end = window_start

    def add(self, start: float, end: float, outcome: Outcome, counted: bool = True) -> None:
        """``start`` is when the request was due (scheduled time in open loop), ``end`` when it finished;
        ``counted``: it started inside the window."""
        if self._window_end is None:
            counts = counted
        else:
            inside = self._window_start <= end < self._window_end
            counts = inside or (counted and outcome.error is not None)
        if not counts:
            return
        result = self.result
        if end > self._last_end:
            self._last_end = end
        if outcome.error is not None:
            result.errors[outcome.error] = result.errors.get(outcome.error, 0) + 1
            return
        result.latencies.append(end - start)
        times = outcome.token_times
        if times:
            result.ttft.append(times[0] - start)
            result.itl.extend(b - a for a, b in itertools.pairwise(times))
            result.tokens += len(times)

    def finish(self) -> RunResult:
        end = self._last_end if self._window_end is None else self._window_end
        self.result.elapsed_s = end - self._window_start
        return self.result
