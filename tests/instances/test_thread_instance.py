"""ThreadInstance: batches merge and run on the instance's own thread and report once on the loop;
instances run on the CPUs their group names."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from tensorgate.backends.base import Backend, Device, LoadSpec
from tensorgate.config.model_config import InstanceGroup, ModelConfig
from tensorgate.errors import ModelLoadError
from tensorgate.instances.base import InstanceDied, ModelFailed
from tensorgate.instances.factory import check_cpus, placements
from tensorgate.instances.thread_instance import ThreadInstance
from tensorgate.types import Array, DataType, TensorSpec

SPEC = TensorSpec("x", DataType.FP32, (-1, 2))


class RecordingBackend(Backend):
    """Doubles its input; remembers which thread ran it and what it was given; fails on negatives."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.seen: list[Array] = []
        self.cpus: list[set[int]] = []

    def load(self, spec: LoadSpec) -> None:
        return None

    def inputs(self) -> tuple[TensorSpec, ...]:
        return (SPEC,)

    def outputs(self) -> tuple[TensorSpec, ...]:
        return (SPEC,)

    def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        self.threads.append(threading.current_thread())
        self.seen.append(np.array(inputs["x"]))
        self.cpus.append(os.sched_getaffinity(0))
        if (inputs["x"] < 0).any():
            raise ValueError("negative input")
        return {"x": inputs["x"] * 2}


def spec() -> LoadSpec:
    return LoadSpec("m", 1, Path("."), Path("."), ModelConfig(name="m"), Device())


async def run_batch(instance: ThreadInstance, parts: list[dict[str, Array]]) -> tuple[object, object, bool]:
    """``run_batch`` as a coroutine: (outputs, error, whether the report came on the loop's thread)."""
    loop = asyncio.get_running_loop()
    loop_thread = threading.current_thread()
    done: asyncio.Future[tuple[object, object, bool]] = loop.create_future()
    instance.run_batch(
        parts, lambda outputs, error: done.set_result((outputs, error, threading.current_thread() is loop_thread))
    )
    return await done


async def test_a_batch_is_merged_and_run_on_the_instance_thread_and_reported_on_the_loop() -> None:
    backend = RecordingBackend()
    instance = ThreadInstance("m_1_0", backend, spec())
    await instance.start()
    try:
        parts = [{"x": np.full((1, 2), 1.0, np.float32)}, {"x": np.full((2, 2), 2.0, np.float32)}]
        outputs, error, on_loop = await run_batch(instance, parts)
        assert error is None and on_loop
        assert isinstance(outputs, dict)
        np.testing.assert_array_equal(outputs["x"], np.array([[2, 2], [4, 4], [4, 4]], np.float32))
        np.testing.assert_array_equal(backend.seen[0], np.concatenate([p["x"] for p in parts]))
        assert backend.threads == [t for t in threading.enumerate() if t.name == "instance-m_1_0"]
    finally:
        await instance.aclose()


async def test_a_model_error_is_reported_as_model_failed_by_both_entry_points() -> None:
    instance = ThreadInstance("m_1_1", RecordingBackend(), spec())
    await instance.start()
    try:
        _, error, on_loop = await run_batch(instance, [{"x": np.full((1, 2), -1.0, np.float32)}])
        assert isinstance(error, ModelFailed) and "negative input" in str(error) and on_loop
        with pytest.raises(ModelFailed, match="negative input"):
            await instance.execute({"x": np.full((1, 2), -1.0, np.float32)})
        outputs, error, _ = await run_batch(instance, [{"x": np.ones((1, 2), np.float32)}])
        assert error is None and isinstance(outputs, dict)  # the instance keeps serving
    finally:
        await instance.aclose()


async def test_an_instance_with_cpus_runs_its_thread_there_and_the_loop_stays_free() -> None:
    allowed = os.sched_getaffinity(0)
    backend = RecordingBackend()
    instance = ThreadInstance("m_1_2", backend, spec(), frozenset({min(allowed)}))
    await instance.start()
    try:
        await instance.execute({"x": np.ones((1, 2), np.float32)})
        assert backend.cpus == [{min(allowed)}]
        assert os.sched_getaffinity(0) == allowed  # only the instance's own thread was pinned
    finally:
        await instance.aclose()


def test_cpu_sets_wrap_around_the_instances_and_must_be_available() -> None:
    group = InstanceGroup(count=3, cpus=[[0], [1]])
    assert [p.cpus for p in placements([group])] == [frozenset({0}), frozenset({1}), frozenset({0})]
    assert [p.cpus for p in placements([InstanceGroup(count=2)])] == [None, None]
    # Each group's sets wrap around that group's own instances, whatever came before it.
    two_groups = placements([InstanceGroup(count=1, cpus=[[3]]), InstanceGroup(count=2, cpus=[[0], [1]])])
    assert [p.cpus for p in two_groups] == [frozenset({3}), frozenset({0}), frozenset({1})]
    with pytest.raises(ModelLoadError, match=r"cpus \[100000\] are not available to this server"):
        check_cpus(frozenset({100_000}))
    with pytest.raises(ValueError, match="at least one CPU"):
        InstanceGroup(cpus=[[]])


class StuckBackend(RecordingBackend):
    """Blocks in execute until the test lets it go: a model that hangs."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        self.release.wait(30)
        return super().execute(inputs)


async def test_a_batch_that_hangs_fails_as_dead_and_the_instance_leaves_rotation_until_it_returns() -> None:
    backend = StuckBackend()
    instance = ThreadInstance("m_1_3", backend, spec(), hung_after_s=0.05)
    health: list[bool] = []
    rejoined = asyncio.Event()

    def changed(_: object, healthy: bool) -> None:
        health.append(healthy)
        if healthy:
            rejoined.set()

    instance.on_health_change = changed
    await instance.start()
    reports: list[object] = []
    try:
        loop = asyncio.get_running_loop()
        first: asyncio.Future[object] = loop.create_future()

        def report(outputs: object, error: object) -> None:
            reports.append(error if error is not None else outputs)
            if not first.done():
                first.set_result(error)

        instance.run_batch([{"x": np.ones((1, 2), np.float32)}], report)
        error = await asyncio.wait_for(first, 5.0)
        assert isinstance(error, InstanceDied) and "ran one batch past 0.05 s" in str(error)
        assert not instance.healthy and health == [False]  # out of rotation: the scheduler retries elsewhere
        backend.release.set()  # the model returns at last: its late result is dropped, the instance rejoins
        await asyncio.wait_for(rejoined.wait(), 5.0)
        assert instance.healthy and health == [False, True]
        assert len(reports) == 1
        outputs, error, _ = await run_batch(instance, [{"x": np.ones((1, 2), np.float32)}])
        assert error is None and isinstance(outputs, dict)
    finally:
        backend.release.set()
        await instance.aclose()


async def test_closing_an_instance_stuck_in_a_batch_does_not_wait_for_it() -> None:
    backend = StuckBackend()
    instance = ThreadInstance("m_1_4", backend, spec(), hung_after_s=0.05)
    await instance.start()
    failed: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    instance.run_batch([{"x": np.ones((1, 2), np.float32)}], lambda _, error: failed.set_result(error))
    try:
        assert isinstance(await asyncio.wait_for(failed, 5.0), InstanceDied)
        health: list[bool] = []
        instance.on_health_change = lambda _, healthy: health.append(healthy)
        await asyncio.wait_for(instance.aclose(), 5.0)  # returns although the model never does
        assert not instance.healthy
        [thread] = [t for t in threading.enumerate() if t.name == "instance-m_1_4"]
        backend.release.set()  # the model returns after the unload: that must not revive the instance
        await asyncio.to_thread(thread.join, 10)  # it reports back, then takes the stop and ends
        await asyncio.sleep(0)  # the report it sent the loop runs
        assert not thread.is_alive() and backend.seen
        assert health == [] and not instance.healthy
    finally:
        backend.release.set()
