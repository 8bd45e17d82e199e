"""Whether holding a batch open for company can pay, judged from the model's own executions.

The delay window trades an idle instance's time now for a bigger batch later. The trade pays only
when part of a batch's cost does not grow with its rows (per-call overhead, kernel launches,
reading the weights once per call): a GPU, or a small model whose cost is mostly per call. A model
whose cost is proportional to its rows gains nothing from bigger batches, so every millisecond an
idle instance waits is throughput lost. Measured: a ResNet-18-shaped network on a 2-core CPU runs
55-60 images/s at batch 1 and at batch 8 alike, and waiting out a 5 ms window left its instances
idle about 2 % of the time under 10 clients.

The estimate: cost(rows) = fixed + per_row * rows, a least-squares line through the recent mean
execution time at each batch size. Holding pays when the fixed part is at least ``MIN_FIXED_SHARE``
of a one-row batch's cost. Until two batch sizes have been seen ``MIN_SAMPLES`` times each, or when
the line is degenerate, the answer is that it pays: the configured window applies, as in Triton.

Pure: no clock, no I/O; the scheduler feeds it each execution's rows and seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

# Below this share of fixed cost, a batch of 8 saves under ~9 % per row over a batch of 1.
MIN_FIXED_SHARE = 0.1
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
        self._pays = True
        self.fixed_share: float | None = None  # the last fit's fixed share of a one-row batch

    def observe(self, rows: int, seconds: float) -> None:
        """One execution of ``rows`` rows took ``seconds``."""
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
            self._refit()

    @property
    def holding_pays(self) -> bool:
        """Whether an idle instance should wait for a bigger batch (the configured window)."""
        return self._pays

    def _refit(self) -> None:
        points = [(rows, mean.seconds, min(mean.count, 1 / SMOOTHING)) for rows, mean in self._sizes.items()]
        points = [p for p in points if p[2] >= MIN_SAMPLES]
        self.fixed_share = None
        self._pays = True
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
        self.fixed_share = max(0.0, fixed) / one_row
        self._pays = self.fixed_share >= MIN_FIXED_SHARE
