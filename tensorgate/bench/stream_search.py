"""``--search``: the largest number of concurrent real-time sequences a server sustains within its SLO.

A pure policy, driven by the command: :meth:`StreamSearch.next` says how many sequences to run
next, :meth:`StreamSearch.record` takes whether that run passed (every SLO met, no error). It
doubles from the starting count while runs pass, then bisects between the largest count that
passed and the smallest that failed, until they are adjacent or within ``precision`` of each other
(5 %: a run on a shared host is not steadier than that), never above ``limit``.

The answer is the largest count that passed below the smallest that failed: a noisy run that fails
below an earlier pass lowers the answer rather than being outvoted, since an SLO is a promise about
the bad runs too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(slots=True)
class StreamSearch:
    start: int = 1
    limit: int = 1024
    precision: float = 0.05
    runs: list[tuple[int, bool]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 1 <= self.start <= self.limit:
            raise ValueError(f"the search starts within 1..{self.limit} sequences, not at {self.start}")

    @property
    def failed(self) -> int | None:
        """The smallest count that failed; None while none has."""
        return min((count for count, ok in self.runs if not ok), default=None)

    @property
    def sustained(self) -> int:
        """The answer so far: the largest count that passed below the smallest that failed (0: none)."""
        failed = self.failed
        return max((c for c, ok in self.runs if ok and (failed is None or c < failed)), default=0)

    def next(self) -> int | None:
        """The count to run next; None when the search is over."""
        if not self.runs:
            return self.start
        low, high = self.sustained, self.failed
        if high is None:
            return None if low >= self.limit else min(low * 2, self.limit)
        if high - low <= 1 or (low > 0 and (high - low) / high <= self.precision):
            return None
        if low == 0 and high <= self.start:  # the start failed: bisect below it
            return high // 2 if high > 1 else None
        return (low + high) // 2

    def record(self, count: int, ok: bool) -> None:
        self.runs.append((count, ok))

    @staticmethod
    def most_runs(start: int, limit: int) -> int:
        """An upper bound on a search's runs (doublings, then bisections) when passing is monotone."""
        return math.ceil(math.log2(max(limit / start, 1))) + 1 + math.ceil(math.log2(max(limit, 2))) + 1
