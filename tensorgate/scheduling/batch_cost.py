"""Whether holding a batch open for company can pay, judged from the model's own executions and
the rate requests arrive at.

The delay window trades an idle instance's time now for a bigger batch later. With the cost of a
batch of ``rows`` modelled as ``fixed + per_row * rows`` (per-call overhead, kernel launches,
reading the weights once per call, against work in proportion to rows), an instance holding ``k``
rows that waits ``w`` seconds gathers ``rate * w`` more, and its time per row goes from
``fixed / k + per_row`` to ``(w + fixed) / (k + rate * w) + per_row``: lower exactly when
``k < fixed * rate``, whatever ``w``. So holding pays while the batch has fewer rows than arrive
during one fixed cost, and stops paying as soon as it has that many.

- A GPU, or a small model whose cost is mostly per call, under load: ``fixed * rate`` is tens of
  rows, so the window fills batches.
- A model whose cost is proportional to its rows (a convolution net on a CPU): its fixed part is
  small against a row's cost, so ``fixed * rate`` stays under one row and an idle instance never
  waits. A threshold on the fixed share alone would not do: the share's estimate is noisy, and
  each time it crossed the threshold the instances would sit idle waiting out the window.
  ``benchmarks/bench_serving.py`` serves this case (the ResNet-shaped model with batching on).
- Light traffic: the rate is low, so a request is not held for company that is not coming.

The estimate: a least-squares line through the recent mean execution time at each batch size, and
the rows admitted per second between two fits. Until two batch sizes have been seen
``MIN_SAMPLES`` times each, when the line is degenerate, or when bigger batches cost no more in
total, the answer is that holding pays: the configured window applies, as in Triton.

Pure: no clock, no I/O; the scheduler feeds it each admission's rows and each execution's rows
and seconds, with the time it ended.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MIN_SAMPLES = 8
# Weight of the newest execution in a batch size's running mean: ~30 executions of memory, so the
# estimate follows a host whose speed drifts without being swung by one slow call.
SMOOTHING = 1 / 32
# Refit after this many executions: the line changes slowly and the scheduler asks on every pump.
REFIT_EVERY = 8


@dataclass(slots=True)
class _SizeMean:
    count: int
    seconds: float


class BatchCost:
    def __init__(self) -> None:
        self._sizes: dict[int, _SizeMean] = {}
        self._since_fit = 0
        self._admitted = 0  # rows admitted since the last fit
        self._fitted_at: float | None = None
        self.fixed_s: float | None = None  # the last fit's fixed cost per call (None: no usable fit)
        self.per_row_s: float | None = None  # and its cost per row
        self.rate: float | None = None  # rows admitted per second between the last two fits

    def admitted(self, rows: int) -> None:
        """A request of ``rows`` rows joined the queue."""
        self._admitted += rows

    def observe(self, rows: int, seconds: float, now: float) -> None:
        """One execution of ``rows`` rows took ``seconds``, ending at ``now`` (monotonic seconds)."""
        mean = self._sizes.get(rows)
        if mean is None:
            self._sizes[rows] = _SizeMean(1, seconds)
        else:
            mean.count += 1
            weight = max(SMOOTHING, 1 / mean.count)  # a plain mean until the window fills
            mean.seconds += weight * (seconds - mean.seconds)
        self._since_fit += 1
        if self._since_fit >= REFIT_EVERY:
            self._since_fit = 0
            self._measure_rate(now)
            self._refit()

    @property
    def hold_below_rows(self) -> float:
        """An idle instance waits (up to the configured window) while its batch has fewer rows than
        this; ``inf`` while the estimate says holding always pays or knows too little to say."""
        if self.fixed_s is None or self.rate is None:
            return math.inf
        return self.fixed_s * self.rate

    def _measure_rate(self, now: float) -> None:
        if self._fitted_at is not None and now > self._fitted_at:
            self.rate = self._admitted / (now - self._fitted_at)
        self._fitted_at = now
        self._admitted = 0

    def _refit(self) -> None:
        points = [(rows, mean.seconds, min(mean.count, 1 / SMOOTHING)) for rows, mean in self._sizes.items()]
        points = [p for p in points if p[2] >= MIN_SAMPLES]
        self.fixed_s = self.per_row_s = None
        if len(points) < 2:
            return
        total = sum(w for _, _, w in points)
        mean_x = sum(w * x for x, _, w in points) / total
        mean_y = sum(w * y for _, y, w in points) / total
        spread = sum(w * (x - mean_x) ** 2 for x, _, w in points)
        if spread <= 0:
            return
        per_row = sum(w * (x - mean_x) * (y - mean_y) for x, y, w in points) / spread
        fixed = mean_y - per_row * mean_x
        one_row = fixed + per_row
        if per_row <= 0 or one_row <= 0:  # bigger batches no dearer: batching is all gain
            return
        self.fixed_s = max(0.0, fixed)
        self.per_row_s = per_row

    def cost(self, rows: int) -> float | None:
        """The expected seconds of one execution of ``rows`` rows; None while too little is known.

        The fitted line where there is one; else the mean of the nearest batch size seen
        ``MIN_SAMPLES`` times (a model that never batches sees only one size), scaled up in
        proportion for more rows than it had and kept for fewer: an estimate that errs long.
        """
        if self.fixed_s is not None and self.per_row_s is not None:
            return self.fixed_s + self.per_row_s * rows
        known = [(size, mean.seconds) for size, mean in self._sizes.items() if mean.count >= MIN_SAMPLES]
        if not known:
            return None
        size, seconds = min(known, key=lambda k: abs(k[0] - rows))
        return seconds * rows / size if rows > size else seconds
