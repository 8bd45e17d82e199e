"""Hang detection: a batch that runs past its instance's pace is hedged to another instance, the
first answer wins and is the only one returned, and an instance that does it twice in a row leaves
rotation. The scheduler, the pace and the health monitor are real; the instances are fakes in the
server's loop whose batches run when the test opens their gates, and the pace is given a history
of short batches, so a held batch turns suspect within milliseconds. The test waits on events only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

import numpy as np
from fake_instances import FakeInstance
from prometheus_client import CollectorRegistry

from tensorgate.clock import MonotonicClock
from tensorgate.config.model_config import HealthCheck
from tensorgate.instances.health import HealthMonitor
from tensorgate.instances.pool import InstancePool
from tensorgate.observability.metrics import Metrics
from tensorgate.scheduling.batch_policy import BatchSettings
from tensorgate.scheduling.pace import MIN_HISTORY, Pace
from tensorgate.scheduling.scheduler import QueueSettings, Scheduler
from tensorgate.types import Array, InferRequest

PACE_S = 0.002  # the history every instance is given: batches of 2 ms
FLOOR_S = 0.03  # a batch held past 30 ms is suspect


class Held(FakeInstance):
    """Answers x * 10 at once, or, while ``hold`` is set, when the test releases its batch."""

    def __init__(self, name: str) -> None:
        super().__init__(name, (-1, 1))
        self.hold = False
        self.release = asyncio.Event()
        self.started = asyncio.Event()  # set when a batch starts
        self.runs: list[list[float]] = []

    async def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        x = inputs["x"]
        self.runs.append(x[:, 0].tolist())
        self.started.set()
        if self.hold:
            await self.release.wait()
        return {"x": x * 10}


class Harness:
    def __init__(self, count: int) -> None:
        self.metrics = Metrics(CollectorRegistry(), process=False)
        self.instances = [Held(f"i{n}") for n in range(count)]
        self.pool = InstancePool(self.instances)
        self.scheduler = Scheduler(
            "m",
            1,
            self.pool,
            BatchSettings(8, True, 0.0),
            QueueSettings(priority_levels=1, max_queue_size=64),
            MonotonicClock(),
            self.metrics.for_version("m", 1),
        )
        self.health = HealthMonitor("m/1", self.pool, HealthCheck(failure_threshold=3), None, None, self.scheduler.poke)
        self.scheduler.health = self.health
        self.scheduler.pace = Pace(FLOOR_S, 5.0, 120.0)
        for instance in self.instances:
            for _ in range(MIN_HISTORY):
                self.scheduler.pace.observe(instance, 1, PACE_S)

    def submit(self, value: float) -> asyncio.Task[Array]:
        async def one() -> Array:
            request = InferRequest(model="m", inputs={"x": np.full((1, 1), value, np.float32)})
            return np.asarray((await self.scheduler.submit(request, 1, ((1,),))).outputs["x"])

        return asyncio.ensure_future(one())

    def sample(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, {"model": "m", "version": "1", **labels})
        return value or 0.0


class Suspicions(logging.Handler):
    """Hears the scheduler's warning for each suspect batch: the test waits on it, not on a clock."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.changed = asyncio.Event()
        logging.getLogger("tensorgate.scheduling.scheduler").addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        if "past its pace" in record.getMessage():
            self.count += 1
            self.changed.set()

    async def reach(self, count: int) -> None:
        while self.count < count:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), 5)

    def close(self) -> None:
        logging.getLogger("tensorgate.scheduling.scheduler").removeHandler(self)
        super().close()


async def _started(instance: Held) -> None:
    await asyncio.wait_for(instance.started.wait(), 5)
    instance.started.clear()


async def test_a_batch_past_its_pace_is_answered_by_another_instance_and_only_once() -> None:
    h = Harness(2)
    slow, well = h.instances
    slow.hold = True
    task = h.submit(7.0)  # round-robin starts with the slow one...
    await _started(slow)
    well.started.clear()
    assert (await asyncio.wait_for(task, 5)).tolist() == [[70.0]]  # ...and the well one answers it
    assert well.runs == [[7.0]]
    assert h.sample("tensorgate_hedged_batches_total") == 1
    assert h.sample("tensorgate_hedge_wins_total", side="hedge") == 1
    assert h.sample("tensorgate_instance_suspect", instance="i0") == 1  # busy with its batch still
    slow.release.set()  # the suspect batch ends: its answer is dropped, the request was answered
    await asyncio.wait_for(h.scheduler.drain(5), 6)
    assert h.sample("tensorgate_instance_suspect", instance="i0") == 0
    assert h.sample("tensorgate_hedge_wins_total", side="original") == 0
    assert h.sample("tensorgate_requests_total", outcome="success") == 1
    assert h.health.records[slow].in_rotation  # one suspect batch is not enough to take it out
    # Beaten by its copy, the held batch was the instance's fault: the pace does not learn it (had
    # it, the next hung batch of this size would not turn suspect for five times as long).
    assert h.scheduler.pace is not None and h.scheduler.pace.suspect_after(slow, 1) == FLOOR_S
    await h.scheduler.aclose()
    await h.health.aclose()


async def test_the_suspect_batch_answering_first_wins_and_its_queued_copy_is_dropped() -> None:
    """Both instances hold their batches: both turn suspect and both copies wait in the queue. The
    first to end answers its own request (the original wins) and its copy leaves the queue unrun;
    freed, it takes the other batch's copy and answers that one first (the hedge wins)."""
    h = Harness(2)
    first_instance, second_instance = h.instances
    suspicions = Suspicions()
    first_instance.hold = second_instance.hold = True
    first = h.submit(1.0)
    await _started(first_instance)
    second = h.submit(2.0)
    await _started(second_instance)
    await suspicions.reach(2)
    suspicions.close()
    assert h.sample("tensorgate_hedged_batches_total") == 2
    assert h.scheduler.queued == 2  # the two copies: no instance is free
    first_instance.release.set()
    assert (await asyncio.wait_for(first, 5)).tolist() == [[10.0]]
    assert (await asyncio.wait_for(second, 5)).tolist() == [[20.0]]  # its copy, on the freed instance
    assert h.scheduler.queued == 0
    assert first_instance.runs == [[1.0], [2.0]] and second_instance.runs == [[2.0]]  # the first copy never ran
    assert h.sample("tensorgate_hedge_wins_total", side="original") == 1
    assert h.sample("tensorgate_hedge_wins_total", side="hedge") == 1
    second_instance.release.set()  # its late answer is dropped
    await asyncio.wait_for(h.scheduler.drain(5), 6)
    assert h.sample("tensorgate_requests_total", outcome="success") == 2
    # The suspect batch that answered first was the model's own pace: learned, it lifts the limit.
    assert h.scheduler.pace is not None and h.scheduler.pace.suspect_after(first_instance, 1) > FLOOR_S
    await h.scheduler.aclose()
    await h.health.aclose()


async def test_two_suspect_batches_in_a_row_take_the_instance_out() -> None:
    h = Harness(2)
    slow, well = h.instances
    slow.hold = True
    for value in (1.0, 2.0):
        h.pool._next = 0  # the next batch goes to the slow instance (round-robin starts there)
        task = h.submit(value)
        await _started(slow)
        assert (await asyncio.wait_for(task, 5)).tolist() == [[value * 10]]
        if value == 1.0:
            slow.release.set()  # the first suspect batch ends late; the instance takes work again
            await h.scheduler.drain(5)  # its late answer is dropped; the instance takes work again
            slow.release.clear()
    assert not h.health.records[slow].in_rotation and slow.ejected
    assert "2 batches in a row ran past its pace" in h.health.records[slow].last_error
    assert h.sample("tensorgate_suspect_batches_total", instance="i0") == 2
    assert h.sample("tensorgate_hedge_wins_total", side="hedge") == 2
    assert h.health.records[well].in_rotation
    slow.release.set()
    await h.scheduler.aclose()
    await h.health.aclose()


async def test_a_batch_at_its_pace_ends_a_run_of_suspect_ones() -> None:
    h = Harness(2)
    slow, _ = h.instances
    for hold in (True, False, True):
        slow.hold = hold
        slow.release.clear()
        h.pool._next = 0
        task = h.submit(1.0)
        await _started(slow)
        await asyncio.wait_for(task, 5)
        slow.release.set()
        await h.scheduler.drain(5)
    assert h.sample("tensorgate_suspect_batches_total", instance="i0") == 2
    assert h.health.records[slow].in_rotation  # two suspect batches, but not in a row
    await h.scheduler.aclose()
    await h.health.aclose()


async def test_with_no_history_only_the_hard_cap_applies() -> None:
    h = Harness(2)
    h.scheduler.pace = Pace(FLOOR_S, 5.0, 120.0)  # no batch seen yet
    slow, well = h.instances
    slow.hold = True
    task = h.submit(3.0)
    await _started(slow)
    done, _ = await asyncio.wait({task}, timeout=FLOOR_S * 10)  # a bounded look: nothing may happen
    assert not done and well.runs == [] and h.sample("tensorgate_hedged_batches_total") == 0
    slow.release.set()
    assert (await asyncio.wait_for(task, 5)).tolist() == [[30.0]]
    await h.scheduler.aclose()
    await h.health.aclose()
