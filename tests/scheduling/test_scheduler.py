"""The scheduler driver with fake instances: interleavings forced with events, never sleeps."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import numpy as np
import pytest
from fake_instances import FakeInstance, GatedInstance, TimedInstance
from prometheus_client import CollectorRegistry

from tensorgate.clock import ManualClock, MonotonicClock
from tensorgate.errors import DEADLINE_CANCEL, DeadlineExceeded, InternalError, InvalidInput, QueueFull, Unavailable
from tensorgate.instances.base import Instance, InstanceDied
from tensorgate.instances.pool import InstancePool
from tensorgate.observability.metrics import Metrics
from tensorgate.observability.tracing import NOOP_TRACER
from tensorgate.scheduling.batch_cost import MIN_SAMPLES
from tensorgate.scheduling.batch_policy import BatchSettings
from tensorgate.scheduling.scheduler import QueueSettings, Scheduler
from tensorgate.types import Array, InferRequest


def make(
    *instances: Instance, batching: bool = True, delay_s: float = 10.0, queue: QueueSettings | None = None
) -> Scheduler:
    metrics = Metrics(CollectorRegistry(), process=False).for_version("m", 1)
    return Scheduler(
        "m",
        1,
        InstancePool(instances),
        BatchSettings(8, batching, delay_s),
        queue or QueueSettings(),
        MonotonicClock(),
        metrics,
    )


def request(value: float, **kwargs: object) -> InferRequest:
    return InferRequest(model="m", inputs={"x": np.full((1, 2), value, np.float32)}, **kwargs)  # type: ignore[arg-type]


async def submit(scheduler: Scheduler, value: float, **kwargs: object) -> Array:
    response = await scheduler.submit(request(value, **kwargs), 1, ((2,),))
    return np.asarray(response.outputs["x"])


async def until(condition: Callable[[], bool], turns: int = 10_000) -> None:
    """Let the loop turn until ``condition`` holds; bounded, so a failing test fails, never hangs."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


async def test_a_lone_request_is_not_held_for_the_batch_window() -> None:
    instance = GatedInstance("a", gated=False)
    scheduler = make(instance, delay_s=3600.0)
    result = await asyncio.wait_for(submit(scheduler, 1.0), 5.0)
    assert result.tolist() == [[10.0, 10.0]]


async def test_requests_accumulate_while_busy_and_split_back_exactly() -> None:
    instance = GatedInstance("a")
    scheduler = make(instance, delay_s=0.0)
    first = asyncio.ensure_future(submit(scheduler, 0.0))
    await asyncio.wait_for(instance.started.wait(), 5.0)
    rest = [asyncio.ensure_future(submit(scheduler, float(v))) for v in range(1, 6)]
    await until(lambda: scheduler.queued == 5)
    instance.gate.set()
    results = await asyncio.wait_for(asyncio.gather(first, *rest), 5.0)
    for value, result in enumerate(results):
        assert result.tolist() == [[value * 10.0, value * 10.0]]
    assert [len(b) for b in instance.batches] == [1, 5]


async def test_the_next_batch_starts_before_the_finished_batch_wakes_its_callers() -> None:
    """A free instance must not wait behind response encoding: when a batch ends, the queued batch
    reaches the instance before the finished batch's callers resume."""
    instance = GatedInstance("a")
    scheduler = make(instance, delay_s=0.0)

    async def first_caller() -> int:
        await submit(scheduler, 0.0)
        return len(instance.batches)  # batches the instance had started when this caller resumed

    first = asyncio.ensure_future(first_caller())
    await asyncio.wait_for(instance.started.wait(), 5.0)
    rest = [asyncio.ensure_future(submit(scheduler, float(v))) for v in range(1, 4)]
    await until(lambda: scheduler.queued == 3)
    instance.gate.set()
    started_when_resumed = await asyncio.wait_for(first, 5.0)
    await asyncio.wait_for(asyncio.gather(*rest), 5.0)
    assert started_when_resumed == 2
    assert [len(b) for b in instance.batches] == [1, 3]


async def test_no_batch_is_held_open_on_a_model_where_waiting_cannot_pay() -> None:
    """Two instances, one busy, a one-hour window: once the model's executions show cost in
    proportion to rows, a request for the idle instance goes at once instead of waiting."""
    busy, idle = GatedInstance("busy"), GatedInstance("idle", gated=False)
    scheduler = make(busy, idle, delay_s=3600.0)
    assert scheduler.batch_cost is not None
    blocker = asyncio.ensure_future(submit(scheduler, 0.0))
    await asyncio.wait_for(busy.started.wait(), 5.0)
    for i in range(MIN_SAMPLES):  # as measured on a convolution net on CPU: 20 ms per row
        for rows in (1, 2, 4):
            scheduler.batch_cost.observe(rows, 0.02 * rows, 1000.0 + i)
    assert scheduler.batch_cost.hold_below_rows < 1
    result = await asyncio.wait_for(submit(scheduler, 2.0), 5.0)
    assert result.tolist() == [[20.0, 20.0]] and len(idle.batches) == 1
    busy.gate.set()
    await asyncio.wait_for(blocker, 5.0)


async def test_an_instance_that_cannot_start_a_batch_fails_it_and_stays_usable() -> None:
    class Refusing(GatedInstance):
        def run_batch(self, parts, on_done):  # type: ignore[no-untyped-def]
            if np.asarray(parts[0]["x"])[0, 0] < 0:
                raise RuntimeError("cannot start")
            super().run_batch(parts, on_done)

    instance = Refusing("a", gated=False)
    scheduler = make(instance, batching=False)
    with pytest.raises(InternalError):
        await asyncio.wait_for(submit(scheduler, -1.0), 5.0)
    assert (await asyncio.wait_for(submit(scheduler, 1.0), 5.0)).tolist() == [[10.0, 10.0]]
    assert scheduler.running == 0


async def test_a_full_queue_rejects_at_once() -> None:
    instance = GatedInstance("a")
    scheduler = make(instance, batching=False, queue=QueueSettings(max_queue_size=2))
    running = asyncio.ensure_future(submit(scheduler, 0.0))
    await asyncio.wait_for(instance.started.wait(), 5.0)
    queued = [asyncio.ensure_future(submit(scheduler, 1.0)) for _ in range(2)]
    await until(lambda: scheduler.queued == 2)
    with pytest.raises(QueueFull):
        await asyncio.wait_for(submit(scheduler, 2.0), 1.0)
    assert scheduler.stats.fail_count == 1  # a rejection is a failure in the statistics too, as Triton's
    instance.gate.set()
    await asyncio.wait_for(asyncio.gather(running, *queued), 5.0)
    assert (scheduler.stats.success_count, scheduler.stats.fail_count) == (3, 1)


async def test_requests_of_one_loop_turn_are_not_refused_while_an_instance_is_idle() -> None:
    # Arrivals in one turn wait for its end to be dispatched together; a queue of one must still
    # take two when an idle instance will run the first.
    instance = GatedInstance("a")
    scheduler = make(instance, batching=False, queue=QueueSettings(max_queue_size=1))
    first = asyncio.ensure_future(submit(scheduler, 0.0))
    second = asyncio.ensure_future(submit(scheduler, 1.0))
    await asyncio.wait_for(instance.started.wait(), 5.0)
    assert not first.done() and not second.done()
    with pytest.raises(QueueFull):  # one running, one waiting: now the queue is full
        await asyncio.wait_for(submit(scheduler, 2.0), 1.0)
    instance.gate.set()
    assert [r.tolist() for r in await asyncio.wait_for(asyncio.gather(first, second), 5.0)] == [
        [[0.0, 0.0]],
        [[10.0, 10.0]],
    ]


async def test_statistics_count_a_batch_s_compute_time_for_each_of_its_requests() -> None:
    """Triton's compute_infer ns / count is a request's time in the model: a request that shared a
    0.5 s batch with two others spent 0.5 s computing, not a third of it."""
    clock = ManualClock()
    instance = TimedInstance("a", clock, 0.5)
    metrics = Metrics(CollectorRegistry(), process=False).for_version("m", 1)
    scheduler = Scheduler(
        "m", 1, InstancePool([instance]), BatchSettings(8, True, 0.0), QueueSettings(), clock, metrics
    )
    first = asyncio.ensure_future(submit(scheduler, 0.0))
    await asyncio.wait_for(instance.started.wait(), 5.0)
    rest = [asyncio.ensure_future(submit(scheduler, float(v))) for v in (1, 2, 3)]
    await until(lambda: scheduler.queued == 3)
    instance.gate.set()
    await asyncio.wait_for(asyncio.gather(first, *rest), 5.0)
    assert [len(b) for b in instance.batches] == [1, 3]
    stats = scheduler.stats
    assert (stats.execution_count, stats.inference_count, stats.compute_count) == (2, 4, 4)
    assert stats.compute_ns == 4 * 500_000_000
    assert stats.batch_stats == {1: [1, 500_000_000], 3: [1, 500_000_000]}


async def test_an_expired_request_never_reaches_the_model() -> None:
    instance = GatedInstance("a")
    scheduler = make(instance, batching=False)
    running = asyncio.ensure_future(submit(scheduler, 0.0))
    await asyncio.wait_for(instance.started.wait(), 5.0)
    with pytest.raises(DeadlineExceeded):
        await asyncio.wait_for(submit(scheduler, 7.0, timeout_s=0.01), 5.0)
    instance.gate.set()
    await asyncio.wait_for(running, 5.0)
    assert all(7.0 not in batch for batch in instance.batches)
    assert scheduler.queued == 0


async def test_a_cancelled_request_leaves_the_queue() -> None:
    instance = GatedInstance("a")
    scheduler = make(instance, batching=False)
    running = asyncio.ensure_future(submit(scheduler, 0.0))
    await asyncio.wait_for(instance.started.wait(), 5.0)
    doomed = asyncio.ensure_future(submit(scheduler, 9.0))
    await until(lambda: scheduler.queued == 1)
    assert scheduler.queued == 1
    doomed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await doomed
    assert scheduler.queued == 0
    instance.gate.set()
    await asyncio.wait_for(running, 5.0)
    assert all(9.0 not in batch for batch in instance.batches)


async def test_a_cancellation_at_the_clients_deadline_counts_as_a_timeout() -> None:
    # The protocol's timer (gRPC's grpc-timeout) can fire a moment before the request's own deadline,
    # computed later from the time remaining; its cancellation says why.
    instance = GatedInstance("a")
    scheduler, metrics = make_counted(instance, batching=False)
    running = asyncio.ensure_future(submit(scheduler, 0.0))
    await asyncio.wait_for(instance.started.wait(), 5.0)
    expired = asyncio.ensure_future(submit(scheduler, 1.0, timeout_s=30.0))
    left = asyncio.ensure_future(submit(scheduler, 2.0))
    await until(lambda: scheduler.queued == 2)
    expired.cancel(DEADLINE_CANCEL)
    left.cancel()
    for task in (expired, left):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert _sample(metrics, "tensorgate_requests_total", outcome="timeout") == 1
    assert _sample(metrics, "tensorgate_requests_total", outcome="cancelled") == 1
    instance.gate.set()
    await asyncio.wait_for(running, 5.0)


async def test_higher_priority_is_dispatched_first() -> None:
    instance = GatedInstance("a")
    scheduler = make(instance, batching=False, queue=QueueSettings(priority_levels=2))
    blocker = asyncio.ensure_future(submit(scheduler, 0.0))
    await asyncio.wait_for(instance.started.wait(), 5.0)
    low = asyncio.ensure_future(submit(scheduler, 2.0, priority=2))
    high = asyncio.ensure_future(submit(scheduler, 1.0, priority=1))
    await until(lambda: scheduler.queued == 2)
    instance.gate.set()
    await asyncio.wait_for(asyncio.gather(blocker, low, high), 5.0)
    assert [float(b[0, 0]) for b in instance.batches] == [0.0, 1.0, 2.0]


async def test_a_batch_on_a_dying_instance_is_retried_once_elsewhere() -> None:
    dying = GatedInstance("dying", die=True)
    healthy = GatedInstance("healthy", gated=False)
    scheduler = make(dying, healthy, batching=False)
    # Occupy the healthy instance's turn so the first request goes to the dying one.
    result = await asyncio.wait_for(asyncio.gather(submit(scheduler, 3.0), _open_later(dying)), 5.0)
    assert result[0].tolist() == [[30.0, 30.0]]
    assert len(dying.batches) == 1 and len(healthy.batches) == 1


async def _open_later(instance: GatedInstance) -> None:
    await instance.started.wait()
    instance.gate.set()


async def test_a_batch_that_dies_twice_fails_with_a_clear_error() -> None:
    first = GatedInstance("first", die=True, gated=False)
    second = GatedInstance("second", die=True, gated=False)
    scheduler = make(first, second, batching=False)
    with pytest.raises(InternalError, match="instance died"):
        await asyncio.wait_for(submit(scheduler, 1.0), 5.0)


def _sample(scheduler_metrics: Metrics, name: str, **labels: str) -> float:
    value = scheduler_metrics.registry.get_sample_value(name, {"model": "m", "version": "1", **labels})
    return 0.0 if value is None else value


def make_counted(
    *instances: Instance, batching: bool = True, queue: QueueSettings | None = None
) -> tuple[Scheduler, Metrics]:
    metrics = Metrics(CollectorRegistry(), process=False)
    scheduler = Scheduler(
        "m",
        1,
        InstancePool(instances),
        BatchSettings(8, batching, 0.0),
        queue or QueueSettings(),
        MonotonicClock(),
        metrics.for_version("m", 1),
    )
    return scheduler, metrics


class DiesButLooksHealthy(GatedInstance):
    """Fails its batch as dead yet still reports healthy: a hung worker the instance is killing."""

    async def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        self.batches.append(np.array(inputs["x"]))
        self.started.set()
        await self.gate.wait()
        raise InstanceDied("killed as hung")


async def test_a_retry_avoids_the_instance_it_failed_on() -> None:
    flaky, steady = DiesButLooksHealthy("flaky"), GatedInstance("steady", gated=False)
    scheduler, metrics = make_counted(flaky, steady, batching=False)
    first = asyncio.ensure_future(submit(scheduler, 1.0))  # round-robin: to the flaky instance
    await asyncio.wait_for(flaky.started.wait(), 5.0)
    assert (await asyncio.wait_for(submit(scheduler, 2.0), 5.0)).tolist() == [[20.0, 20.0]]  # to steady
    flaky.gate.set()  # round-robin would now pick the flaky instance again for the retry
    assert (await asyncio.wait_for(first, 5.0)).tolist() == [[10.0, 10.0]]
    assert len(flaky.batches) == 1 and len(steady.batches) == 2
    assert _sample(metrics, "tensorgate_request_retries_total") == 1


async def test_a_retry_waits_for_a_busy_instance_rather_than_the_one_it_failed_on() -> None:
    flaky, steady = DiesButLooksHealthy("flaky"), GatedInstance("steady")
    scheduler, _ = make_counted(flaky, steady, batching=False)
    first = asyncio.ensure_future(submit(scheduler, 1.0))  # to the flaky instance
    await asyncio.wait_for(flaky.started.wait(), 5.0)
    second = asyncio.ensure_future(submit(scheduler, 2.0))  # to steady, which holds it
    await asyncio.wait_for(steady.started.wait(), 5.0)
    flaky.gate.set()  # the first batch fails; the only idle instance is the one it failed on
    await until(lambda: scheduler.queued > 0)  # the failure reaches the scheduler a loop turn or two later
    assert scheduler.queued == 1 and not first.done()  # waiting, not sent back to flaky
    steady.gate.set()
    assert (await asyncio.wait_for(second, 5.0)).tolist() == [[20.0, 20.0]]
    assert (await asyncio.wait_for(first, 5.0)).tolist() == [[10.0, 10.0]]
    assert len(flaky.batches) == 1 and len(steady.batches) == 2


async def test_queued_requests_wait_for_a_restart_and_are_answered_when_it_fails() -> None:
    only = GatedInstance("only", die=True)
    scheduler, metrics = make_counted(only, batching=False)
    running = asyncio.ensure_future(submit(scheduler, 1.0))
    await asyncio.wait_for(only.started.wait(), 5.0)
    queued = [asyncio.ensure_future(submit(scheduler, 2.0)), asyncio.ensure_future(submit(scheduler, 3.0))]
    await until(lambda: scheduler.queued == 2)
    only.gate.set()  # the instance dies: its batch goes back to the head of the queue
    await until(lambda: not scheduler.running)  # the batch's end reaches the scheduler a turn or two later
    assert scheduler.queued == 3 and not any(t.done() for t in [running, *queued])  # waiting for a restart
    scheduler.fail_stranded()  # the restart failed: nothing healthy is left
    for task in [running, *queued]:
        with pytest.raises(Unavailable, match="no healthy instance"):
            await asyncio.wait_for(task, 5.0)
    assert scheduler.queued == 0
    assert _sample(metrics, "tensorgate_requests_total", outcome="unavailable") == 3
    assert _sample(metrics, "tensorgate_inflight_requests", priority="1") == 0


async def test_in_flight_requests_are_counted_per_priority_and_bad_priorities_as_invalid() -> None:
    instance = GatedInstance("a")
    scheduler, metrics = make_counted(instance, batching=False, queue=QueueSettings(priority_levels=3))
    tasks = [asyncio.ensure_future(submit(scheduler, float(v), priority=p)) for v, p in [(1, 3), (2, 1), (3, 3)]]
    await asyncio.wait_for(instance.started.wait(), 5.0)
    levels = {p: _sample(metrics, "tensorgate_inflight_requests", priority=p) for p in "123"}
    assert levels == {"1": 1, "2": 0, "3": 2}
    with pytest.raises(InvalidInput, match=r"priority 4 is outside 1\.\.3"):
        await submit(scheduler, 9.0, priority=4)
    assert _sample(metrics, "tensorgate_requests_total", outcome="invalid") == 1
    assert scheduler.stats.fail_count == 1
    instance.gate.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 5.0)
    assert all(_sample(metrics, "tensorgate_inflight_requests", priority=p) == 0 for p in "123")
    assert _sample(metrics, "tensorgate_requests_total", outcome="success") == 3


async def test_a_default_timeout_bounds_requests_that_set_none() -> None:
    instance = GatedInstance("a")
    scheduler, metrics = make_counted(instance, batching=False, queue=QueueSettings(default_timeout_s=0.02))
    running = asyncio.ensure_future(submit(scheduler, 0.0, timeout_s=30.0))  # its own timeout wins
    await asyncio.wait_for(instance.started.wait(), 5.0)
    with pytest.raises(DeadlineExceeded, match="exceeded its deadline of 20 ms"):
        await asyncio.wait_for(submit(scheduler, 5.0), 5.0)  # sets none: the model's default applies
    assert _sample(metrics, "tensorgate_requests_total", outcome="timeout") == 1
    instance.gate.set()
    assert (await asyncio.wait_for(running, 5.0)).tolist() == [[0.0, 0.0]]
    assert all(5.0 not in batch for batch in instance.batches)


async def test_unloading_does_not_wait_past_its_timeout_for_a_stuck_batch() -> None:
    instance = GatedInstance("a")  # its gate never opens: a batch stuck in its model
    scheduler = make(instance, batching=False)
    stuck = asyncio.ensure_future(submit(scheduler, 1.0))
    await asyncio.wait_for(instance.started.wait(), 5.0)
    queued = asyncio.ensure_future(submit(scheduler, 2.0))
    await until(lambda: scheduler.queued == 1)
    await asyncio.wait_for(scheduler.aclose(timeout_s=0.05), 5.0)
    with pytest.raises(Unavailable, match="unloading"):
        await queued
    assert not stuck.done()
    instance.gate.set()
    assert (await asyncio.wait_for(stuck, 5.0)).tolist() == [[10.0, 10.0]]


class DoublingInstance(FakeInstance):
    """A faulty model: answers twice the rows it was given."""

    async def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        return {"x": np.concatenate([inputs["x"], inputs["x"]])}


async def test_a_lone_request_never_gets_rows_it_did_not_send() -> None:
    """Alone or batched, the same wrong answer fails the same way: a request's answer cannot depend
    on whether it happened to share a batch."""
    scheduler = make(DoublingInstance("a"))
    with pytest.raises(InternalError, match="returned 2 rows of output 'x' for a batch of 1"):
        await asyncio.wait_for(submit(scheduler, 1.0), 5.0)


async def test_a_model_without_a_batch_axis_answers_whole() -> None:
    metrics = Metrics(CollectorRegistry(), process=False).for_version("m", 1)
    pool = InstancePool([DoublingInstance("a")])
    scheduler = Scheduler("m", 1, pool, BatchSettings(0, False, 0.0), QueueSettings(), MonotonicClock(), metrics)
    assert (await asyncio.wait_for(submit(scheduler, 3.0), 5.0)).tolist() == [[3.0, 3.0], [3.0, 3.0]]


class FailingTracer:
    """A tracer whose batch span raises once: a fault after the batch left the queue."""

    enabled = True  # the scheduler only asks a tracer that is on for batch spans
    sampled_only = False

    def __init__(self) -> None:
        self.failures = 1

    def batch(self, requests: object, rows: int) -> object:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("tracer bug")
        return NOOP_TRACER.batch((), rows)


async def test_a_fault_while_dispatching_answers_the_batch_and_frees_the_instance() -> None:
    metrics = Metrics(CollectorRegistry(), process=False).for_version("m", 1)
    instance = GatedInstance("a", gated=False)
    tracer = FailingTracer()
    scheduler = Scheduler(
        "m",
        1,
        InstancePool([instance]),
        BatchSettings(8, True, 0.0),
        QueueSettings(),
        MonotonicClock(),
        metrics,
        tracer,  # type: ignore[arg-type]
    )
    with pytest.raises(InternalError, match="scheduler failed"):
        await asyncio.wait_for(submit(scheduler, 1.0), 5.0)
    assert (await asyncio.wait_for(submit(scheduler, 2.0), 5.0)).tolist() == [[20.0, 20.0]]
    assert scheduler.running == 0


class Rejoining(FakeInstance):
    """Runs one batch per opening of its gate; can die once, as a killed worker, and rejoin."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.gate = asyncio.Event()
        self.started = asyncio.Event()
        self.die_next = False
        self.batches: list[list[float]] = []

    async def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        self.batches.append(inputs["x"][:, 0].tolist())
        self.started.set()
        await self.gate.wait()
        self.gate.clear()
        if self.die_next:
            self.die_next = False
            self.alive = False
            raise InstanceDied("worker killed")
        return {"x": inputs["x"] * 10}


async def test_a_retry_behind_a_higher_priority_request_still_avoids_its_failed_instance() -> None:
    a, b = Rejoining("a"), Rejoining("b")
    scheduler = make(a, b, delay_s=3600.0, queue=QueueSettings(priority_levels=2))
    assert scheduler.batch_cost is not None
    retried = asyncio.ensure_future(submit(scheduler, 1.0, priority=2))  # to a, at once
    await asyncio.wait_for(a.started.wait(), 5.0)
    blocker = asyncio.ensure_future(
        scheduler.submit(InferRequest(model="m", inputs={"x": np.full((8, 2), 2.0, np.float32)}), 8, ((2,),))
    )
    await asyncio.wait_for(b.started.wait(), 5.0)  # a full batch keeps b busy
    a.die_next = True
    a.gate.set()  # a dies running the request: it is requeued, to wait for company while b is busy
    await until(lambda: scheduler.queued == 1)
    a.alive = True
    scheduler.poke()  # a restarted and rejoined
    urgent = asyncio.ensure_future(submit(scheduler, 3.0, priority=1))  # heads the batch from now on
    await until(lambda: scheduler.queued == 2)
    b.gate.set()  # b frees up: both idle, and the retry must not go back to a
    await until(lambda: len(a.batches) + len(b.batches) == 3)
    assert b.batches[1] == [3.0, 1.0]
    assert a.batches == [[1.0]]
    b.gate.set()
    await asyncio.wait_for(asyncio.gather(retried, blocker, urgent), 5.0)
