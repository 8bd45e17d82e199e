"""The health policy: when consecutive failures take an instance out and good probes bring it back."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tensorgate.backends.base import Device
from tensorgate.config.model_config import HealthCheck
from tensorgate.instances.base import Instance, InstanceDied, ModelFailed
from tensorgate.instances.health import HealthMonitor, HealthRecord, finite_outputs, probe_problem
from tensorgate.instances.pool import InstancePool
from tensorgate.types import Array, DataType, TensorSpec

events = st.lists(st.sampled_from(["ok", "fail", "fatal"]), max_size=60)


@given(st.integers(1, 5), st.integers(1, 4), events)
def test_out_only_after_enough_failures_in_a_row_back_only_after_enough_successes(
    failure_threshold: int, success_threshold: int, history: list[str]
) -> None:
    record = HealthRecord(failure_threshold, success_threshold)
    in_rotation, failures, successes = True, 0, 0
    for event in history:
        if event == "ok":
            changed = record.succeeded()
            failures = 0
            if not in_rotation:
                successes += 1
                if successes >= success_threshold:
                    in_rotation, successes = True, 0
                    assert changed
        else:
            changed = record.failed("boom", fatal=event == "fatal")
            failures, successes = failures + 1, 0
            if in_rotation and (event == "fatal" or failures >= failure_threshold):
                in_rotation = False
                assert changed
        assert record.in_rotation == in_rotation


def test_a_success_between_failures_resets_the_count() -> None:
    record = HealthRecord(3, 1)
    for _ in range(10):
        assert not record.failed("slow")
        assert not record.failed("slow")
        record.succeeded()
    assert record.in_rotation
    assert not record.failed("x") and not record.failed("x") and record.failed("x")
    assert record.last_error == "x"


def test_non_finite_outputs_fail_a_probe_only_where_the_reference_was_finite() -> None:
    reference = {"p": np.array([[0.1, 0.9]], np.float32), "raw": np.array([np.inf]), "n": np.array([3])}
    finite = finite_outputs(reference)
    assert finite == {"p"}
    assert probe_problem({"p": np.array([[0.2, 0.8]], np.float32), "raw": np.array([np.nan])}, finite) == ""
    assert "non-finite" in probe_problem({"p": np.array([[np.nan, 0.8]], np.float32)}, finite)
    assert "no output 'p'" in probe_problem({}, finite)


class _Flaky(Instance):
    """Answers probes with ``answer`` (or raises ModelFailed while ``broken``); counts restarts."""

    def __init__(self, name: str) -> None:
        super().__init__(name, Device())
        self.broken = False
        self.nan = False
        self.restarts = 0
        self.restarted = asyncio.Event()

    async def start(self) -> None:
        return None

    def input_specs(self) -> tuple[TensorSpec, ...]:
        return (TensorSpec("x", DataType.FP32, (-1, 1)),)

    output_specs = input_specs

    async def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        if self.broken:
            raise ModelFailed("device error")
        return {"x": np.full((1, 1), np.nan if self.nan else 1.0, np.float32)}

    @property
    def healthy(self) -> bool:
        return True

    @property
    def can_restart(self) -> bool:
        return True

    async def restart(self) -> None:
        self.restarts += 1
        self.restarted.set()

    async def aclose(self) -> None:
        return None


async def test_a_fatal_failure_ejects_restarts_and_good_probes_readmit() -> None:
    bad, good = _Flaky("a"), _Flaky("b")
    pool = InstancePool([bad, good])
    pokes: list[int] = []
    probes: list[tuple[str, bool]] = []
    settings = HealthCheck(interval_s=60, timeout_s=1, failure_threshold=3, success_threshold=2)
    monitor = HealthMonitor(
        "m/1",
        pool,
        settings,
        {"x": np.zeros((1, 1), np.float32)},
        None,
        lambda: pokes.append(1),
        on_probe=lambda i, ok: probes.append((i.name, ok)),
    )
    rejoined = asyncio.Event()
    bad.on_health_change = lambda instance, available: rejoined.set() if available else None
    monitor.start()
    bad.broken = True
    monitor.batch_failed(bad, InstanceDied("hung"))
    assert bad.ejected and not bad.available and pool.available_count() == 1
    await asyncio.wait_for(bad.restarted.wait(), 5)
    bad.restarted.clear()
    # Its probes after the restart fail while it is broken: it stays out and is restarted again.
    await asyncio.wait_for(bad.restarted.wait(), 5)
    assert bad.ejected and bad.restarts == 2 and ("a", False) in probes
    bad.broken = False
    await asyncio.wait_for(rejoined.wait(), 5)
    assert not bad.ejected
    assert probes[-2:] == [("a", True), ("a", True)]  # success_threshold good probes in a row
    assert pool.available_count() == 2 and pokes
    await monitor.aclose()


async def test_failures_of_real_batches_count_and_a_success_resets_them() -> None:
    instance = _Flaky("a")
    pool = InstancePool([instance, _Flaky("b")])
    monitor = HealthMonitor(
        "m/1", pool, HealthCheck(interval_s=60), {"x": np.zeros((1, 1), np.float32)}, None, lambda: None
    )
    for _ in range(5):
        monitor.batch_failed(instance, ModelFailed("device error"))
        monitor.batch_failed(instance, ModelFailed("device error"))
        monitor.batch_ok(instance)
    assert not instance.ejected
    for _ in range(3):
        monitor.batch_failed(instance, ModelFailed("device error"))
    assert instance.ejected
    await monitor.aclose()


async def test_without_a_warm_up_a_sibling_s_finite_answer_makes_nan_a_failure() -> None:
    """No reference from a warm-up: the bad instance answers NaN from its very first probe, before
    any other has answered; once its healthy sibling answered finite, its NaN counts as failing."""
    bad, good = _Flaky("a"), _Flaky("b")
    bad.nan = True
    pool = InstancePool([bad, good])
    monitor = HealthMonitor(
        "m/1",
        pool,
        HealthCheck(interval_s=0.01, failure_threshold=3),
        {"x": np.zeros((1, 1), np.float32)},
        None,
        lambda: None,
    )
    ejected = asyncio.Event()
    bad.on_health_change = lambda instance, available: None if available else ejected.set()
    monitor.start()
    await asyncio.wait_for(ejected.wait(), 5)
    assert "non-finite" in (monitor.records[bad].last_error or "")
    assert not good.ejected
    await monitor.aclose()
