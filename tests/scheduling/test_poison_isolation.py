"""A request the model refuses fails alone: the scheduler splits a batch the model raised on until
the request is found, answers every other request of the batch, and charges no instance for it.

The instances are fakes in the server's loop; the scheduler and the health monitor are real (its
probes never start: only what batches report moves an instance's health).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import numpy as np
import pytest
from fake_instances import FakeInstance
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from tensorgate.clock import MonotonicClock
from tensorgate.config.model_config import HealthCheck
from tensorgate.errors import InternalError
from tensorgate.instances.base import ModelFailed
from tensorgate.instances.health import HealthMonitor
from tensorgate.instances.pool import InstancePool
from tensorgate.observability.metrics import Metrics
from tensorgate.scheduling.batch_policy import BatchSettings
from tensorgate.scheduling.scheduler import QueueSettings, Scheduler
from tensorgate.types import Array, InferRequest

POISON = -1.0  # the value the model refuses, on every instance


REFUSED = "the model refuses -1"  # its message for the client (tensorgate.ModelError)
DEVICE_ERROR = "RuntimeError: device error: the accelerator stopped answering"  # for the server log only
ANSWER = "model 'm' failed to execute the request"


class Picky(FakeInstance):
    """Refuses any batch holding POISON (the input's fault); while ``broken``, refuses every batch
    (a device error). Records the rows of every batch it ran."""

    def __init__(self, name: str, *, broken: bool = False) -> None:
        super().__init__(name, (-1, 1))
        self.broken = broken
        self.batches: list[list[float]] = []

    async def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        x = inputs["x"]
        self.batches.append(x[:, 0].tolist())
        await asyncio.sleep(0)
        if self.broken:
            raise ModelFailed(DEVICE_ERROR)  # no public message
        if bool((x == POISON).any()):
            raise ModelFailed(f"ModelError: {REFUSED}", public=REFUSED)
        return {"x": x * 10}


async def _serve(instances: list[Picky], values: list[float]) -> tuple[list[Array | BaseException], HealthMonitor]:
    """Submit one request per value at once (they make one batch), and wait for every answer."""
    metrics = Metrics(CollectorRegistry(), process=False)
    pool = InstancePool(instances)
    scheduler = Scheduler(
        "m",
        1,
        pool,
        BatchSettings(64, True, 10.0),
        QueueSettings(priority_levels=1, max_queue_size=64),
        MonotonicClock(),
        metrics.for_version("m", 1),
    )
    health = HealthMonitor("m/1", pool, HealthCheck(failure_threshold=1000), None, None, scheduler.poke)
    scheduler.health = health

    async def one(value: float) -> Array:
        request = InferRequest(model="m", inputs={"x": np.full((1, 1), value, np.float32)})
        return np.asarray((await scheduler.submit(request, 1, ((1,),))).outputs["x"])

    tasks = [asyncio.ensure_future(one(v)) for v in values]
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
    await scheduler.aclose()
    return results, health


def _charges(health: HealthMonitor) -> dict[str, int]:
    """Failures each instance was charged (none is ever answered after, so none is reset)."""
    return {instance.name: record.failures for instance, record in health.records.items()}


def _clean_batches(instance: Picky) -> int:
    """The batches it ran that held no request the model refuses."""
    return sum(1 for batch in instance.batches if POISON not in batch)


@settings(max_examples=80, deadline=None)
@given(
    size=st.integers(1, 24),
    poison=st.sets(st.integers(0, 23), max_size=3),
    instances=st.integers(1, 3),
    broken=st.booleans(),
)
def test_only_the_requests_the_model_refuses_fail_and_only_a_broken_instance_is_charged(
    size: int, poison: set[int], instances: int, broken: bool
) -> None:
    """Whatever the batch and wherever its poisoned requests sit, they alone fail, with the model's
    message; every other request gets its own answer. A broken instance (one of two or three) is
    charged exactly its failed batches that held only requests answered elsewhere; a well one, and
    any instance for a batch that held a refused request, nothing."""
    broken = broken and instances > 1
    poisoned = {p for p in poison if p < size}
    values = [POISON if index in poisoned else float(index) for index in range(size)]
    pool = [Picky(f"i{n}", broken=broken and n == 0) for n in range(instances)]
    results, health = asyncio.run(_serve(pool, values))
    for index, result in enumerate(results):
        if index in poisoned:
            assert isinstance(result, InternalError), result
            # The model's own message, from the last instance it raised on; with a broken one in
            # the pool that may have been the broken one, whose error is not the client's to read.
            answers = {f"{ANSWER}: {REFUSED}", ANSWER} if broken else {f"{ANSWER}: {REFUSED}"}
            assert str(result) in answers
        else:
            assert isinstance(result, np.ndarray), result
            assert result.tolist() == [[values[index] * 10]]
    expected = {i.name: _clean_batches(i) if i.broken else 0 for i in pool}
    assert _charges(health) == expected
    # Halving bounds the work: each request runs in at most one batch per level of the splits (and
    # each poisoned one alone once more), so no request runs more than about 2 log2(N) + 3 times.
    depth = size.bit_length()
    runs = [sum(batch.count(value) for i in pool for batch in i.batches) for value in values if value != POISON]
    assert max(runs, default=0) <= depth + 2
    assert sum(len(i.batches) for i in pool) <= 1 + (len(poisoned) + broken) * (2 * depth + 3)


@pytest.mark.parametrize("size", [1, 2, 8, 13])
def test_a_batch_a_broken_instance_raised_on_is_answered_elsewhere_and_charges_it(size: int) -> None:
    broken, well = Picky("broken", broken=True), Picky("well")
    results, health = asyncio.run(_serve([broken, well], [float(i) for i in range(size)]))
    assert all(isinstance(r, np.ndarray) for r in results), results
    assert _charges(health) == {"broken": 1, "well": 0}
    assert broken.batches == [[float(i) for i in range(size)]]  # it took the first batch whole, and raised
    assert sorted(v for batch in well.batches for v in batch) == [float(i) for i in range(size)]


def test_a_broken_instance_s_batch_that_held_a_refused_request_is_not_held_against_it() -> None:
    broken, well = Picky("broken", broken=True), Picky("well")
    results, health = asyncio.run(_serve([broken, well], [0.0, POISON, 2.0, 3.0]))
    assert [isinstance(r, InternalError) for r in results] == [False, True, False, False]
    assert broken.batches[0] == [0.0, POISON, 2.0, 3.0]
    # Charged only for the batches of requests later answered (here: 0.0, alone, after its half
    # with the poisoned request failed on the well instance too).
    assert _charges(health) == {"broken": _clean_batches(broken), "well": 0}
    assert _clean_batches(broken) < len(broken.batches)
