"""The completion estimate deadline admission judges by, and the cost line it reads."""

from __future__ import annotations

import pytest

from tensorgate.scheduling.batch_cost import MIN_SAMPLES, BatchCost
from tensorgate.scheduling.deadline_admission import completion_estimate


def line(fixed: float, per_row: float) -> BatchCost:
    cost = BatchCost()
    for _ in range(MIN_SAMPLES * 2):
        for rows in (1, 4, 8):
            cost.observe(rows, fixed + per_row * rows, now=0.0)
    return cost


def test_the_cost_line_is_the_fit_of_the_executions() -> None:
    cost = line(0.002, 0.001)
    assert cost.cost(8) == pytest.approx(0.010)
    assert cost.cost(1) == pytest.approx(0.003)


def test_one_batch_size_seen_is_scaled_up_and_kept_for_fewer_rows() -> None:
    cost = BatchCost()
    assert cost.cost(1) is None  # nothing seen: no estimate
    for _ in range(MIN_SAMPLES):
        cost.observe(1, 0.010, now=0.0)
    assert cost.cost(1) == pytest.approx(0.010)
    assert cost.cost(3) == pytest.approx(0.030)


def test_waves_of_full_batches_over_the_instances() -> None:
    cost = line(0.002, 0.001).cost
    # 30 rows ahead + 2 of its own at 8 a batch: 4 batches, on 2 instances 2 waves of 10 ms.
    assert completion_estimate(30, 2, 8, 2, 0, cost) == pytest.approx(0.020)
    # The batches running now go first: 2 more make 3 waves.
    assert completion_estimate(30, 2, 8, 2, 2, cost) == pytest.approx(0.030)
    # Alone and idle: one batch of its own rows.
    assert completion_estimate(0, 1, 8, 1, 0, cost) == pytest.approx(0.003)


def test_without_a_measured_cost_everything_is_admitted() -> None:
    assert completion_estimate(1000, 1, 8, 1, 4, BatchCost().cost) is None
