"""Whether a request can meet its deadline, judged at admission (``dynamic_batching.deadline_admission``).

A request that waits behind more work than can be done before its deadline will time out anyway,
after holding a queue slot and, if it reaches an instance before its deadline, some of the
instance's time. Refused at once instead (503 + Retry-After), its client can go elsewhere or come
back, and the requests that can still make it are served sooner.

The estimate: the rows ahead of it (``RequestQueue.rows_ahead``, which knows the level's order)
and its own make ``ceil(rows / max_rows)`` batches; with the batches already running they go out
in waves of one per instance; each wave costs one execution at the batch size the rows make, from
the version's measured cost line (``BatchCost.cost``). It errs long by at most the rest of the
running batches (counted whole), and short by the batching window an idle instance may wait,
which only applies when there is little ahead. Until the cost is measured, everything is admitted.

Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable


def completion_estimate(
    rows_ahead: int,
    rows: int,
    max_rows: int,
    instances: int,
    running_batches: int,
    cost: Callable[[int], float | None],
) -> float | None:
    """Seconds from now until a request of ``rows`` rows with ``rows_ahead`` ahead of it is answered;
    None while the cost of a batch is not known."""
    total = rows_ahead + rows
    batch_rows = min(total, max_rows)
    seconds_per_wave = cost(batch_rows)
    if seconds_per_wave is None:
        return None
    batches = math.ceil(total / max_rows) + running_batches
    waves = math.ceil(batches / max(1, instances))
    return waves * seconds_per_wave
