"""The batch-cost estimate: while a batch has how few rows does holding it open pay on this model?"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgate.scheduling.batch_cost import MIN_SAMPLES, BatchCost


def fed(
    fixed: float,
    per_row: float,
    sizes: range,
    per_size: int,
    rate: float = 100.0,
    noise: float = 0.0,
    seed: int = 0,
    cost: BatchCost | None = None,
    start: float = 1000.0,
) -> BatchCost:
    """An estimate fed ``per_size`` executions at each size, interleaved, costs off by up to
    ``noise``, their rows admitted at ``rate`` rows/s."""
    rng = random.Random(seed)
    cost = cost if cost is not None else BatchCost()
    now = start
    for _ in range(per_size):
        for rows in sizes:
            cost.admitted(rows)
            now += rows / rate
            cost.observe(rows, (fixed + per_row * rows) * (1 + rng.uniform(-noise, noise)), now)
    return cost


def test_cost_proportional_to_rows_never_holds() -> None:
    cost = fed(fixed=0.0, per_row=0.02, sizes=range(1, 9), per_size=MIN_SAMPLES, rate=10_000.0)
    assert cost.fixed_s == pytest.approx(0.0, abs=1e-9)
    assert cost.hold_below_rows == pytest.approx(0.0, abs=1e-6)


def test_cost_mostly_per_call_holds_for_the_rows_that_arrive_during_one_call() -> None:
    cost = fed(fixed=50e-6, per_row=1e-6, sizes=range(1, 65), per_size=MIN_SAMPLES, rate=200_000.0)
    assert cost.fixed_s == pytest.approx(50e-6)
    assert cost.rate == pytest.approx(200_000.0)
    assert cost.hold_below_rows == pytest.approx(10.0)


def test_a_convolution_net_on_cpu_never_holds_at_its_own_rate() -> None:
    # Measured on a 2-core host (ResNet-18 shape): 0-3 ms per call against ~22 ms a row, ~100 rows/s.
    cost = fed(fixed=0.003, per_row=0.022, sizes=range(1, 9), per_size=MIN_SAMPLES, rate=100.0)
    assert cost.hold_below_rows < 1


def test_light_traffic_is_not_held_for_company_that_is_not_coming() -> None:
    busy = fed(fixed=0.01, per_row=0.001, sizes=range(1, 9), per_size=MIN_SAMPLES, rate=5_000.0)
    light = fed(fixed=0.01, per_row=0.001, sizes=range(1, 9), per_size=MIN_SAMPLES, rate=20.0)
    assert busy.hold_below_rows == pytest.approx(50.0)
    assert light.hold_below_rows == pytest.approx(0.2)


def test_until_two_sizes_are_well_sampled_and_a_rate_is_known_the_window_applies() -> None:
    assert BatchCost().hold_below_rows == math.inf
    assert fed(fixed=0.0, per_row=0.02, sizes=range(1, 9), per_size=MIN_SAMPLES - 1).hold_below_rows == math.inf
    assert fed(fixed=0.0, per_row=0.02, sizes=range(3, 4), per_size=10 * MIN_SAMPLES).hold_below_rows == math.inf
    once = BatchCost()
    for rows in range(1, 9):  # one fit's worth of executions: no second fit to measure a rate from
        once.observe(rows, 0.02 * rows, 1000.0 + rows)
    assert once.rate is None and once.hold_below_rows == math.inf


def test_bigger_batches_that_cost_less_in_total_always_hold() -> None:
    cost = fed(fixed=0.05, per_row=-0.001, sizes=range(1, 9), per_size=MIN_SAMPLES)
    assert cost.hold_below_rows == math.inf


def test_the_estimate_follows_a_model_whose_costs_change() -> None:
    cost = fed(fixed=0.0, per_row=0.02, sizes=range(1, 5), per_size=4 * MIN_SAMPLES)
    assert cost.hold_below_rows < 1
    # The same model, now behind a per-call cost (a busier device, say).
    fed(fixed=0.1, per_row=0.02, sizes=range(1, 5), per_size=128, rate=100.0, cost=cost, start=5000.0)
    assert cost.hold_below_rows == pytest.approx(10.0, rel=0.05)


def test_the_threshold_follows_the_arrival_rate() -> None:
    cost = fed(fixed=0.01, per_row=0.001, sizes=range(1, 9), per_size=MIN_SAMPLES, rate=2_000.0)
    assert cost.hold_below_rows == pytest.approx(20.0)
    fed(fixed=0.01, per_row=0.001, sizes=range(1, 9), per_size=2, rate=100.0, cost=cost, start=5000.0)  # traffic falls
    assert cost.hold_below_rows == pytest.approx(1.0)


@settings(max_examples=60, deadline=None)
@given(
    per_row=st.floats(1e-5, 0.1),
    share=st.floats(0.0, 0.99),
    rate=st.floats(1.0, 1e6),
    seed=st.integers(0, 2**16),
)
def test_noisy_costs_give_about_the_rows_that_arrive_during_one_fixed_cost(
    per_row: float, share: float, rate: float, seed: int
) -> None:
    fixed = share * per_row / (1 - share)  # so that fixed / (fixed + per_row) == share
    cost = fed(fixed, per_row, sizes=range(1, 9), per_size=64, rate=rate, noise=0.1, seed=seed)
    # Off by at most a tenth of a one-row call's cost, in rows arriving meanwhile.
    assert cost.hold_below_rows == pytest.approx(fixed * rate, abs=0.1 * (fixed + per_row) * rate)
