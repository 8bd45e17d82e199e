"""Open-loop arrival schedules: when each request is due, independent of when answers come back.

A Poisson process (exponential gaps) is what many independent clients produce together. The
schedule is computed from a seeded generator so two runs with the same ``--seed`` send at the
same offsets, and the runner measures latency from these *scheduled* times: a request that
waits for a free slot because the server is slow is charged for the wait (no coordinated
omission).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def poisson_offsets(rate: float, seed: int) -> Iterator[float]:
    """Endless arrival offsets in seconds from the start, at ``rate`` requests per second on average."""
    if not rate > 0:
        raise ValueError(f"rate must be positive, got {rate}")
    rng = np.random.default_rng(seed)
    offset = 0.0
    while True:
        # Draw gaps in blocks: one numpy call per 1024 arrivals keeps the dispatcher cheap.
        for gap in rng.exponential(1.0 / rate, 1024).tolist():
            offset += gap
            yield offset


def poisson_schedule(rate: float, duration_s: float, seed: int) -> list[float]:
    """All arrival offsets within ``[0, duration_s)``."""
    schedule = []
    for offset in poisson_offsets(rate, seed):
        if offset >= duration_s:
            break
        schedule.append(offset)
    return schedule
