"""The completion estimate deadline admission judges by, and the cost line it reads."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

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


# A cost line as BatchCost fits it (seconds): a fixed part per call and a part per row.
_lines = st.tuples(st.floats(0.0, 0.05), st.floats(1e-5, 0.05))
_queue = st.tuples(
    st.integers(0, 500),  # rows ahead
    st.integers(1, 16),  # its own rows
    st.integers(1, 32),  # rows per batch
    st.integers(1, 8),  # instances
    st.integers(0, 8),  # batches running now
)


@given(_lines, _queue)
def test_the_estimate_errs_long_by_at_most_one_wave(
    line_: tuple[float, float], queue: tuple[int, int, int, int, int]
) -> None:
    """Never less than the work ahead (the running batches counted whole) spread perfectly over the
    instances, and never more than that plus one wave: the instances are not assumed to idle."""
    fixed, per_row = line_
    ahead, rows, max_rows, instances, running = queue

    def cost(batch_rows: int) -> float:
        return fixed + per_row * batch_rows

    estimate = completion_estimate(ahead, rows, max_rows, instances, running, cost)
    assert estimate is not None
    total = ahead + rows
    batches = math.ceil(total / max_rows) + running
    wave = cost(min(total, max_rows))
    work = batches * wave  # every batch costed at the size the rows make
    assert estimate >= (fixed * batches + per_row * total) / instances - 1e-9
    assert estimate <= work / instances + wave + 1e-9
    if ahead == 0 and running == 0 and rows <= max_rows:
        assert estimate == pytest.approx(cost(rows))  # alone and idle: one execution of its own rows


@given(_lines, _queue, st.integers(1, 100), st.integers(1, 4), st.integers(1, 4))
def test_the_estimate_grows_with_the_work_ahead_and_shrinks_with_instances(
    line_: tuple[float, float], queue: tuple[int, int, int, int, int], more_rows: int, more_running: int, more: int
) -> None:
    fixed, per_row = line_
    ahead, rows, max_rows, instances, running = queue

    def estimate(ahead: int, instances: int, running: int) -> float:
        found = completion_estimate(ahead, rows, max_rows, instances, running, lambda n: fixed + per_row * n)
        assert found is not None
        return found

    base = estimate(ahead, instances, running)
    assert estimate(ahead + more_rows, instances, running) >= base
    assert estimate(ahead, instances, running + more_running) >= base
    assert estimate(ahead, instances + more, running) <= base


@given(_queue)
def test_an_unknown_cost_admits_whatever_is_ahead(queue: tuple[int, int, int, int, int]) -> None:
    assert completion_estimate(*queue, lambda rows: None) is None
