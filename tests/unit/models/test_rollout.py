"""The canary's policy (``decide``, property tests) and its driver (``Rollout``) on a manual clock."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tensorgate.clock import ManualClock
from tensorgate.config.model_config import CanaryConfig
from tensorgate.models.rollout import Rollout, RolloutState, StepFigures, StepWindow, decide

CONFIG = CanaryConfig(
    version=2, steps=[10, 25, 50, 100], step_s=60, max_error_rate=0.01, max_p99_ratio=1.5, min_requests=200
)

figures = st.builds(
    StepFigures,
    requests=st.integers(0, 5000),
    errors=st.integers(0, 5000),
    p99_s=st.one_of(st.none(), st.floats(1e-4, 10)),
).filter(lambda f: f.errors <= f.requests)


@given(st.integers(0, 3), st.floats(0, 600), figures, figures)
def test_too_few_requests_always_hold(step: int, elapsed: float, canary: StepFigures, stable: StepFigures) -> None:
    if canary.requests < CONFIG.min_requests:
        assert decide(CONFIG, step, elapsed, canary, stable).action == "hold"


@given(st.integers(0, 2), st.floats(0, 600), figures, figures)
def test_an_error_rate_over_the_bound_rolls_back_at_once(
    step: int, elapsed: float, canary: StepFigures, stable: StepFigures
) -> None:
    decision = decide(CONFIG, step, elapsed, canary, stable)
    if canary.requests >= CONFIG.min_requests and canary.error_rate > CONFIG.max_error_rate:
        assert decision.action == "rollback" and "error rate" in decision.reason
    elif decision.action == "rollback":
        assert "P99" in decision.reason and elapsed >= CONFIG.step_s


@given(st.integers(0, 2), st.floats(0, 600), figures, figures)
def test_a_step_moves_on_only_after_step_s_and_within_both_bounds(
    step: int, elapsed: float, canary: StepFigures, stable: StepFigures
) -> None:
    decision = decide(CONFIG, step, elapsed, canary, stable)
    if decision.action in ("advance", "promote"):
        assert elapsed >= CONFIG.step_s
        assert canary.requests >= CONFIG.min_requests
        assert canary.error_rate <= CONFIG.max_error_rate
        if canary.p99_s is not None and stable.p99_s is not None:
            assert canary.p99_s <= CONFIG.max_p99_ratio * stable.p99_s
        assert decision.action == ("promote" if step == 2 else "advance")


def test_a_slow_canary_is_rolled_back_on_its_p99() -> None:
    slow, fast = StepFigures(500, 0, 0.300), StepFigures(5000, 0, 0.100)
    decision = decide(CONFIG, 0, 61, slow, fast)
    assert decision.action == "rollback" and "3.00x" in decision.reason


@given(st.lists(st.floats(1e-5, 100), min_size=1, max_size=300))
def test_a_windows_p99_is_within_five_percent_of_the_true_one(latencies: list[float]) -> None:
    window = StepWindow()
    for value in latencies:
        window.add(value, False)
    ordered = sorted(latencies)
    true = ordered[-(-99 * len(ordered) // 100) - 1]  # the ceil(0.99 n)-th smallest
    p99 = window.p99()
    assert p99 is not None and true <= p99 * 1.0000001 and p99 <= true * 1.05 + 1e-12


def _drive(rollout: Rollout, clock: ManualClock, canary_fails: float, seconds: float, per_second: int) -> None:
    """``per_second`` requests a second split by the current share, for ``seconds``."""
    failures = 0.0
    for _ in range(int(seconds * 10)):
        clock.advance(0.1)
        for i in range(per_second // 10):
            to_canary = (i % 100) < rollout.share
            if to_canary:
                failures += canary_fails
                failed = failures >= 1
                failures -= 1 if failed else 0
                rollout.observe(2, 0.010, failed)
            else:
                rollout.observe(1, 0.010, False)


def test_a_healthy_canary_walks_every_step_to_promotion_in_virtual_time() -> None:
    clock = ManualClock()
    changes: list[str] = []
    rollout = Rollout("m", CONFIG, 1, clock, lambda r: changes.append(f"{r.state.value}:{r.share:g}"))
    shares = []
    for _ in range(8):
        shares.append(rollout.share)
        _drive(rollout, clock, 0.0, 60.5, 100)
    assert rollout.state is RolloutState.PROMOTED and rollout.share == 100
    assert shares[:4] == [10, 25, 50, 100]
    assert changes == ["stepping:25", "stepping:50", "promoted:100"]
    assert [h["action"] for h in rollout.history] == ["advance", "advance", "promote"]


def test_a_failing_canary_returns_to_zero_before_its_first_step_ends() -> None:
    clock = ManualClock()
    rollout = Rollout("m", CONFIG, 1, clock)
    _drive(rollout, clock, 0.2, 30, 1000)  # 20 % of the canary's requests fail
    assert rollout.state is RolloutState.ROLLED_BACK and rollout.share == 0 and rollout.step == 0
    assert rollout.shares() == [(1, 100.0)]
    assert rollout.history[-1]["canary"]["requests"] == CONFIG.min_requests  # decided at the first chance
