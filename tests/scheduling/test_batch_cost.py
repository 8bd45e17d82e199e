"""The batch-cost estimate: does holding a batch open pay on this model?"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgate.scheduling.batch_cost import MIN_FIXED_SHARE, MIN_SAMPLES, BatchCost


def fed(fixed: float, per_row: float, sizes: range, per_size: int, noise: float = 0.0, seed: int = 0) -> BatchCost:
    """An estimate fed ``per_size`` executions at each size, interleaved, costs off by up to ``noise``."""
    rng = random.Random(seed)
    cost = BatchCost()
    for _ in range(per_size):
        for rows in sizes:
            cost.observe(rows, (fixed + per_row * rows) * (1 + rng.uniform(-noise, noise)))
    return cost


def test_cost_proportional_to_rows_does_not_pay_for_waiting() -> None:
    cost = fed(fixed=0.0, per_row=0.02, sizes=range(1, 9), per_size=MIN_SAMPLES)
    assert not cost.holding_pays
    assert cost.fixed_share == pytest.approx(0.0, abs=1e-9)


def test_cost_mostly_per_call_pays_for_waiting() -> None:
    cost = fed(fixed=50e-6, per_row=1e-6, sizes=range(1, 65), per_size=MIN_SAMPLES)
    assert cost.holding_pays
    assert cost.fixed_share == pytest.approx(50 / 51)


def test_until_two_sizes_are_well_sampled_the_window_applies() -> None:
    assert BatchCost().holding_pays
    assert fed(fixed=0.0, per_row=0.02, sizes=range(1, 9), per_size=MIN_SAMPLES - 1).holding_pays
    assert fed(fixed=0.0, per_row=0.02, sizes=range(3, 4), per_size=10 * MIN_SAMPLES).holding_pays


def test_bigger_batches_that_cost_less_in_total_count_as_gain() -> None:
    assert fed(fixed=0.05, per_row=-0.001, sizes=range(1, 9), per_size=MIN_SAMPLES).holding_pays


def test_the_estimate_follows_a_model_whose_costs_change() -> None:
    cost = fed(fixed=0.0, per_row=0.02, sizes=range(1, 5), per_size=4 * MIN_SAMPLES)
    assert not cost.holding_pays
    for _ in range(64):  # the same model, now behind a per-call cost (a busier device, say)
        for rows in range(1, 5):
            cost.observe(rows, 0.1 + 0.02 * rows)
    assert cost.holding_pays


@settings(max_examples=60, deadline=None)
@given(
    per_row=st.floats(1e-5, 0.1),
    share=st.one_of(st.floats(0.0, MIN_FIXED_SHARE / 4), st.floats(MIN_FIXED_SHARE * 3, 0.99)),
    seed=st.integers(0, 2**16),
)
def test_noisy_costs_are_classified_by_their_fixed_share(per_row: float, share: float, seed: int) -> None:
    fixed = share * per_row / (1 - share)  # so that fixed / (fixed + per_row) == share
    cost = fed(fixed, per_row, sizes=range(1, 9), per_size=64, noise=0.1, seed=seed)
    assert cost.holding_pays == (share >= MIN_FIXED_SHARE)
