"""The scheduler's deadline admission and the batches it forms across tenants and deadlines, with
fake instances: time from a manual clock, interleavings forced with events, never sleeps."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np
import pytest
from fake_instances import GatedInstance, TimedInstance
from prometheus_client import CollectorRegistry

from tensorgate.clock import Clock, ManualClock, MonotonicClock
from tensorgate.errors import WouldMissDeadline
from tensorgate.instances.pool import InstancePool
from tensorgate.observability.metrics import Metrics
from tensorgate.scheduling.batch_cost import MIN_SAMPLES
from tensorgate.scheduling.batch_policy import BatchSettings
from tensorgate.scheduling.scheduler import QueueSettings, Scheduler
from tensorgate.types import Array, InferRequest, Tenant


def make(
    instance: GatedInstance, batch: BatchSettings, queue: QueueSettings, clock: Clock
) -> tuple[Scheduler, Metrics]:
    metrics = Metrics(CollectorRegistry(), process=False)
    scheduler = Scheduler("m", 1, InstancePool([instance]), batch, queue, clock, metrics.for_version("m", 1))
    return scheduler, metrics


async def submit(scheduler: Scheduler, value: float, width: int = 2, **kwargs: object) -> Array:
    request = InferRequest(model="m", inputs={"x": np.full((1, width), value, np.float32)}, **kwargs)  # type: ignore[arg-type]
    response = await scheduler.submit(request, 1, ((width,),))
    return np.asarray(response.outputs["x"])


async def until(condition: Callable[[], bool], turns: int = 10_000) -> None:
    """Let the loop turn until ``condition`` holds; bounded, so a failing test fails, never hangs."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


def outcomes(metrics: Metrics, outcome: str) -> float:
    labels = {"model": "m", "version": "1", "outcome": outcome}
    return metrics.registry.get_sample_value("tensorgate_requests_total", labels) or 0.0


def firsts(batch: Array) -> list[float]:
    return [float(row[0]) for row in batch]


async def test_a_request_that_cannot_meet_its_deadline_is_refused_at_once_with_when_to_return() -> None:
    """One instance, 100 ms a request on the manual clock: behind one running and three queued,
    a request has 500 ms of work ahead of its own answer. With 250 ms left it is refused at
    admission (503, Retry-After the 250 ms it lacks), counted; with 600 ms left it is served."""
    clock = ManualClock()
    instance = TimedInstance("a", clock, 0.1)
    instance.gate.set()
    scheduler, metrics = make(instance, BatchSettings(0, False, 0.0), QueueSettings(deadline_admission=True), clock)
    for value in range(MIN_SAMPLES):  # the cost is measured from the model's own executions
        await asyncio.wait_for(submit(scheduler, float(value)), 5.0)
    assert scheduler.batch_cost is not None and scheduler.batch_cost.cost(1) == pytest.approx(0.1)
    instance.gate.clear()
    instance.started.clear()
    running = asyncio.ensure_future(submit(scheduler, 10.0))
    await asyncio.wait_for(instance.started.wait(), 5.0)
    queued = [asyncio.ensure_future(submit(scheduler, 11.0 + v)) for v in range(3)]
    await until(lambda: scheduler.queued == 3)
    failures = scheduler.stats.fail_count

    with pytest.raises(WouldMissDeadline, match="cannot finish within its deadline of 250 ms") as refused:
        await submit(scheduler, 20.0, timeout_s=0.25)
    assert refused.value.http_status == 503
    assert refused.value.retry_after_s == pytest.approx(0.25)
    assert outcomes(metrics, "deadline_refused") == 1 and outcomes(metrics, "timeout") == 0
    assert scheduler.stats.fail_count == failures + 1
    assert scheduler.queued == 3  # it took no place in the queue

    served = asyncio.ensure_future(submit(scheduler, 21.0, timeout_s=0.6))
    await until(lambda: scheduler.queued == 4)
    instance.gate.set()
    await asyncio.wait_for(asyncio.gather(running, *queued, served), 5.0)
    assert served.result().tolist() == [[210.0, 210.0]]
    assert all(20.0 not in batch for batch in instance.batches)
    assert outcomes(metrics, "deadline_refused") == 1


async def test_a_batch_takes_from_every_waiting_tenant_not_from_the_head_of_one_burst() -> None:
    instance = GatedInstance("a")
    scheduler, _ = make(instance, BatchSettings(4, True, 0.0), QueueSettings(), MonotonicClock())
    flood, steady = Tenant("flood"), Tenant("steady")
    blocker = asyncio.ensure_future(submit(scheduler, 0.0, tenant=flood))
    await asyncio.wait_for(instance.started.wait(), 5.0)
    burst = [asyncio.ensure_future(submit(scheduler, 1.0 + v, tenant=flood)) for v in range(6)]
    await until(lambda: scheduler.queued == 6)
    late = [asyncio.ensure_future(submit(scheduler, 100.0 + v, tenant=steady)) for v in range(2)]
    await until(lambda: scheduler.queued == 8)
    instance.gate.set()
    await asyncio.wait_for(asyncio.gather(blocker, *burst, *late), 5.0)
    batches = [firsts(batch) for batch in instance.batches]
    # Turn by turn: both of the steady tenant's requests ride in the first batch after the blocker.
    assert batches == [[0.0], [1.0, 100.0, 2.0, 101.0], [3.0, 4.0, 5.0, 6.0]]


async def test_with_deadline_order_a_batch_is_the_earliest_deadlines_of_one_shape() -> None:
    instance = GatedInstance("a")
    scheduler, _ = make(instance, BatchSettings(4, True, 0.0), QueueSettings(order="deadline"), MonotonicClock())
    blocker = asyncio.ensure_future(submit(scheduler, 0.0))
    await asyncio.wait_for(instance.started.wait(), 5.0)
    # Arriving latest deadline first; the value is the deadline in minutes.
    waiting = [asyncio.ensure_future(submit(scheduler, float(m), timeout_s=60.0 * m)) for m in (6, 5, 4, 3, 2, 1)]
    other_shape = asyncio.ensure_future(submit(scheduler, 7.0, width=3, timeout_s=420.0))
    await until(lambda: scheduler.queued == 7)
    instance.gate.set()
    await asyncio.wait_for(asyncio.gather(blocker, *waiting, other_shape), 5.0)
    batches = [firsts(batch) for batch in instance.batches]
    assert batches == [[0.0], [1.0, 2.0, 3.0, 4.0], [5.0, 6.0], [7.0]]
    assert [batch.shape[1] for batch in instance.batches] == [2, 2, 2, 3]
