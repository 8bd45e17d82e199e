"""The real scheduler driver under random traffic: every admitted request ends exactly once.

Hypothesis drives submits (with priorities, shapes and deadlines), cancellations, batch
completions and instance deaths against the scheduler and fake instances that run a batch only
when the test lets them. At the end every task must have finished with its own answer or one typed
error, nothing may be left queued or running, and the outcome counters must add up to the admitted
requests: a request answered twice, or never, breaks one of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import numpy as np
from fake_instances import FakeInstance
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from tensorgate.clock import MonotonicClock
from tensorgate.errors import DeadlineExceeded, InternalError, InvalidInput, QueueFull, Unavailable
from tensorgate.instances.base import InstanceDied
from tensorgate.instances.pool import InstancePool
from tensorgate.observability.metrics import OUTCOMES, Metrics
from tensorgate.scheduling.batch_policy import BatchSettings
from tensorgate.scheduling.scheduler import QueueSettings, Scheduler
from tensorgate.types import Array, InferRequest

MAX_ROWS = 4


class StepInstance(FakeInstance):
    """Runs one batch per ``step()``; a ``kill()`` fails its running batch as dead, and it comes back."""

    def __init__(self, name: str) -> None:
        super().__init__(name, (-1, -1))
        self.turns: asyncio.Queue[bool] = asyncio.Queue()  # True: finish the batch, False: die
        self.rows_seen: list[int] = []

    async def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        self.rows_seen.append(len(inputs["x"]))
        if not await self.turns.get():
            raise InstanceDied("killed by the test")
        return {"x": inputs["x"] * 10}


Event = tuple[str, int, int, int, float | None]  # kind, priority, rows, width, timeout


events = st.lists(
    st.tuples(
        st.sampled_from(["submit", "submit", "submit", "finish", "kill", "cancel", "turn"]),
        st.integers(0, 3),  # priority (0: the default; 3: out of range)
        st.integers(1, 3),  # rows
        st.sampled_from([2, 2, 3]),  # width: only equal widths may share a batch
        st.one_of(st.none(), st.none(), st.floats(0.0005, 0.01)),  # timeout in seconds
    ),
    max_size=40,
)


async def _run(script: list[Event], instances: int, batching: bool) -> None:
    metrics = Metrics(CollectorRegistry(), process=False)
    pool = [StepInstance(f"i{n}") for n in range(instances)]
    scheduler = Scheduler(
        "m",
        1,
        InstancePool(pool),
        BatchSettings(MAX_ROWS, batching, 0.001),
        QueueSettings(priority_levels=2, max_queue_size=8),
        MonotonicClock(),
        metrics.for_version("m", 1),
    )
    tasks: list[tuple[asyncio.Task[Array], float]] = []

    async def one(value: float, rows: int, width: int, priority: int, timeout_s: float | None) -> Array:
        request = InferRequest(
            model="m", inputs={"x": np.full((rows, width), value, np.float32)}, priority=priority, timeout_s=timeout_s
        )
        response = await scheduler.submit(request, rows, ((width,),))
        return np.asarray(response.outputs["x"])

    for index, (kind, priority, rows, width, timeout) in enumerate(script):
        if kind == "submit":
            task = asyncio.ensure_future(one(float(index), rows, width, priority, timeout))
            tasks.append((task, float(index)))
        elif kind in ("finish", "kill"):
            pool[index % instances].turns.put_nowait(kind == "finish")
        elif kind == "cancel" and tasks:
            tasks[index % len(tasks)][0].cancel()
        await asyncio.sleep(0)
    # Let every instance finish whatever comes, until nothing is queued or running.
    for _ in range(2000):
        if all(t.done() for t, _ in tasks) and scheduler.queued == 0 and scheduler.running == 0:
            break
        for instance in pool:
            if instance.turns.empty():
                instance.turns.put_nowait(True)
        await asyncio.sleep(0.0005)
    expected = (DeadlineExceeded, QueueFull, InternalError, InvalidInput, Unavailable)
    for task, value in tasks:
        assert task.done(), "a request never ended"
        if task.cancelled():
            continue
        error = task.exception()
        if error is None:
            result = task.result()
            assert np.all(result == value * 10), "an answer was crossed with another request's"
        else:
            assert isinstance(error, expected), repr(error)
    assert scheduler.queued == 0 and scheduler.running == 0
    assert all(rows <= MAX_ROWS or not batching for i in pool for rows in i.rows_seen)
    sample = metrics.registry.get_sample_value
    labels = {"model": "m", "version": "1"}
    ended = sum(sample("tensorgate_requests_total", {**labels, "outcome": o}) or 0 for o in OUTCOMES)
    assert ended == len(tasks), "every request is counted once, however it ended"
    for level in ("1", "2"):
        assert sample("tensorgate_inflight_requests", {**labels, "priority": level}) == 0
        assert sample("tensorgate_queue_depth", {**labels, "priority": level}) == 0


@settings(max_examples=60, deadline=None)
@given(events, st.integers(1, 3), st.booleans())
def test_every_request_ends_exactly_once(script: list[Event], instances: int, batching: bool) -> None:
    asyncio.run(asyncio.wait_for(_run(script, instances, batching), 30.0))
