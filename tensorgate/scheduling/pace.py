"""How long an instance's batches take, and when a running batch is so far past that it is suspect.

A fixed batch timeout fits no model: two minutes is forever for a model that answers in 5 ms, and a
long generation batch may need it. Each instance instead keeps the durations of its recent batches,
grouped by size (batches of 1, 2-3, 4-7 ... rows: a bigger batch takes longer), and a batch running
past ``max(floor_s, factor * the 99th percentile of its group)`` is suspect. Until an instance has
enough history of its own, the pooled history of the version's instances stands in (a restarted or
newly added instance runs the same model); with none at all, only the hard cap applies.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable

# Recent batches kept per group: enough for a 99th percentile to mean something, few enough that
# the estimate follows a model whose pace changes (a longer input mix, another tenant's load).
WINDOW = 64
# Fewer batches than this in a group is no history: a first estimate from two or three batches
# would suspect the first slightly slow one.
MIN_HISTORY = 8
QUANTILE = 0.99


class History:
    """One group's recent durations and its high quantile, recomputed as durations arrive."""

    __slots__ = ("_durations", "_seen", "quantile")

    def __init__(self) -> None:
        self._durations: deque[float] = deque(maxlen=WINDOW)
        self._seen = 0
        self.quantile: float | None = None  # None until MIN_HISTORY durations

    def add(self, seconds: float) -> None:
        self._durations.append(seconds)
        self._seen += 1
        # Sorting the window on every batch would cost more than the batch's bookkeeping: recompute
        # while the history fills, then every eighth batch (the window moves slowly anyway).
        if self._seen >= MIN_HISTORY and (self._seen <= WINDOW or self._seen % 8 == 0):
            ordered = sorted(self._durations)
            self.quantile = ordered[min(len(ordered) - 1, math.ceil(QUANTILE * len(ordered)) - 1)]


def group(rows: int) -> int:
    """Batches of 1, 2-3, 4-7, 8-15 ... rows share a group."""
    return max(1, rows).bit_length()


class Pace:
    """The recent durations of each instance's batches, and when a new batch becomes suspect."""

    def __init__(self, floor_s: float, factor: float, cap_s: float) -> None:
        self.floor_s = floor_s
        self.factor = factor
        self.cap_s = cap_s  # the hard cap (the instance's batch timeout): past it a batch is hung
        self._own: dict[tuple[Hashable, int], History] = {}
        self._pooled: dict[int, History] = {}

    def observe(self, instance: Hashable, rows: int, seconds: float) -> None:
        """A batch of ``rows`` rows finished on ``instance`` in ``seconds``."""
        key = group(rows)
        own = self._own.get((instance, key))
        if own is None:
            own = self._own[(instance, key)] = History()
        own.add(seconds)
        pooled = self._pooled.get(key)
        if pooled is None:
            pooled = self._pooled[key] = History()
        pooled.add(seconds)

    def suspect_after(self, instance: Hashable, rows: int) -> float | None:
        """Seconds after which a batch of ``rows`` rows on ``instance`` is suspect; None when there is
        no history to judge by (or the limit would reach the hard cap, which then applies)."""
        estimate = self._estimate(instance, group(rows))
        if estimate is None:
            return None
        limit = max(self.floor_s, self.factor * estimate)
        return limit if limit < self.cap_s else None

    def _estimate(self, instance: Hashable, key: int) -> float | None:
        known = self._known(instance, key)
        if known is not None:
            return known
        # No batch of this size yet: a smaller group's pace scaled up by the size ratio (batching
        # makes a bigger batch cost less than in proportion, so this errs long, never short), or a
        # bigger group's as it is.
        for smaller in range(key - 1, 0, -1):
            known = self._known(instance, smaller)
            if known is not None:
                return known * 2.0 ** (key - smaller)
        for bigger in sorted(k for k in self._pooled if k > key):
            known = self._known(instance, bigger)
            if known is not None:
                return known
        return None

    def _known(self, instance: Hashable, key: int) -> float | None:
        """The instance's own estimate for the group, else the version's pooled one."""
        own = self._own.get((instance, key))
        if own is not None and own.quantile is not None:
            return own.quantile
        pooled = self._pooled.get(key)
        return None if pooled is None else pooled.quantile
