"""The load drivers against an in-memory target: counting, warm-up, open-loop timing, errors."""

from __future__ import annotations

import asyncio

import pytest

from tensorgate.bench.arrivals import poisson_schedule
from tensorgate.bench.job import Job
from tensorgate.bench.parallel import share, split
from tensorgate.bench.runner import LoadSpec, run_load
from tensorgate.bench.targets.base import Endpoint, Outcome
from tensorgate.clock import ManualClock, MonotonicClock


class FakeTarget:
    """Answers at once; fails every ``fail_every``-th call; records the peak concurrency."""

    def __init__(self, fail_every: int = 0, hold: asyncio.Event | None = None) -> None:
        self.called = asyncio.Event()
        self.calls = 0
        self.inflight = 0
        self.peak = 0
        self._fail_every = fail_every
        self._hold = hold

    async def call(self, index: int) -> Outcome:
        self.calls += 1
        self.called.set()
        number = self.calls
        self.inflight += 1
        self.peak = max(self.peak, self.inflight)
        try:
            if self._hold is not None:
                await self._hold.wait()
            await asyncio.sleep(0)
        finally:
            self.inflight -= 1
        if self._fail_every and number % self._fail_every == 0:
            return Outcome("http 503")
        return Outcome(token_times=[])

    async def aclose(self) -> None:
        pass


def test_closed_loop_sends_exactly_n_counted_requests() -> None:
    target = FakeTarget(fail_every=10)
    result = asyncio.run(run_load(target, LoadSpec(concurrency=8, requests=500), MonotonicClock()))
    assert result.completed == 500 == target.calls
    assert result.errors == {"http 503": 50}
    assert result.successes == 450
    assert target.peak == 8


def test_warmup_requests_are_not_counted() -> None:
    target = FakeTarget()
    spec = LoadSpec(concurrency=2, requests=20, warmup_s=0.05)
    result = asyncio.run(run_load(target, spec, MonotonicClock()))
    assert result.completed == 20
    assert target.calls > 20


def test_duration_bounds_the_run() -> None:
    result = asyncio.run(run_load(FakeTarget(), LoadSpec(concurrency=2, duration_s=0.2), MonotonicClock()))
    assert result.completed > 0
    assert 0.19 <= result.elapsed_s < 5.0  # the end is bounded; the upper limit only guards a hang


class SteppedTarget:
    """One request at a time, each taking ``service_s`` of a manual clock; ``fail_calls`` fail."""

    def __init__(self, clock: ManualClock, service_s: float, fail_calls: frozenset[int] = frozenset()) -> None:
        self.clock = clock
        self.service_s = service_s
        self.fail_calls = fail_calls
        self.ends: list[float] = []

    async def call(self, index: int) -> Outcome:
        await asyncio.sleep(0)
        self.clock.advance(self.service_s)
        self.ends.append(self.clock.now())
        return Outcome("http 503") if len(self.ends) in self.fail_calls else Outcome(token_times=[])

    async def aclose(self) -> None:
        pass


def test_closed_loop_for_a_duration_counts_what_completes_inside_the_window() -> None:
    """Calls of 0.25 s from t=0; warm-up to 0.375, window to 1.375. Calls end at 0.25 (warm-up),
    0.5 (started in warm-up, ends inside: counts), 0.75, 1.0, 1.25, and 1.5 (started inside, ends
    after: cut off). Four in a window of exactly 1 s: the model's 4 calls/s, where counting by start
    over a window stretched to the last answer would give 4 / 1.125 s."""
    clock = ManualClock(start=1000.0)
    target = SteppedTarget(clock, 0.25)
    spec = LoadSpec(concurrency=1, duration_s=1.0, warmup_s=0.375)
    result = asyncio.run(run_load(target, spec, clock))
    assert target.ends == [1000.25, 1000.5, 1000.75, 1001.0, 1001.25, 1001.5]
    assert result.completed == result.successes == 4
    assert result.elapsed_s == 1.0
    assert result.throughput == 4.0
    assert result.latencies == [0.25] * 4


def test_a_failure_the_window_cuts_off_is_still_counted() -> None:
    clock = ManualClock(start=1000.0)
    target = SteppedTarget(clock, 0.25, fail_calls=frozenset({1, 6}))  # in warm-up; cut off by the end
    result = asyncio.run(run_load(target, LoadSpec(concurrency=1, duration_s=1.0, warmup_s=0.375), clock))
    assert result.successes == 4
    assert result.errors == {"http 503": 1}
    assert result.elapsed_s == 1.0


def test_with_a_request_budget_the_window_runs_to_the_last_answer() -> None:
    clock = ManualClock(start=1000.0)
    result = asyncio.run(run_load(SteppedTarget(clock, 0.25), LoadSpec(concurrency=1, requests=3), clock))
    assert result.completed == 3
    assert result.elapsed_s == 0.75


def test_open_loop_latency_counts_time_waiting_for_a_slot() -> None:
    """With one slot and a held target, later arrivals wait; their latency runs from the schedule."""

    rate, count, backlog = 2000.0, 20, 0.03
    last_due = poisson_schedule(rate, 1.0, seed=1)[count - 1]
    clock = MonotonicClock()

    async def scenario() -> tuple[list[float], int]:
        hold = asyncio.Event()
        target = FakeTarget(hold=hold)
        spec = LoadSpec(rate=rate, requests=count, max_inflight=1, seed=1)
        run = asyncio.create_task(run_load(target, spec, clock))
        await asyncio.wait_for(target.called.wait(), 5.0)
        # The run started before the first call: after this wait every request is due and queued
        # behind the held one (the wait is the scenario itself, not a guard against a race).
        await asyncio.sleep(last_due + backlog)
        hold.set()
        result = await run
        return result.latencies, target.peak

    latencies, peak = asyncio.run(scenario())
    assert len(latencies) == count and peak == 1
    # Every request waited behind the held one at least ``backlog`` past its due time.
    assert min(latencies) >= backlog - 0.002  # the event loop may wake up to 1 ms early


def test_timeouts_are_counted() -> None:
    async def scenario() -> dict[str, int]:
        target = FakeTarget(hold=asyncio.Event())
        result = await run_load(target, LoadSpec(concurrency=3, requests=3, timeout_s=0.01), MonotonicClock())
        return result.errors

    assert asyncio.run(scenario()) == {"timeout": 3}


def test_spec_validation() -> None:
    with pytest.raises(ValueError):
        LoadSpec(concurrency=1, rate=1.0, requests=1)
    with pytest.raises(ValueError):
        LoadSpec(concurrency=1)
    with pytest.raises(ValueError):
        LoadSpec(concurrency=0, requests=1)


def test_split_over_processes() -> None:
    assert [share(10, 3, i) for i in range(3)] == [4, 3, 3]
    job = Job("v2-json", Endpoint("127.0.0.1", 1, ""), "mlp", None, LoadSpec(concurrency=5, requests=9, seed=4))
    parts = split(job, 2)
    assert [p.spec.concurrency for p in parts] == [3, 2]
    assert [p.spec.requests for p in parts] == [5, 4]
    assert [p.spec.seed for p in parts] == [4, 5]
    rate_job = Job("v2-json", job.endpoint, "mlp", None, LoadSpec(rate=100.0, duration_s=1.0))
    assert [p.spec.rate for p in split(rate_job, 4)] == [25.0] * 4
    assert len(split(Job("v2-json", job.endpoint, "mlp", None, LoadSpec(concurrency=1, requests=5)), 3)) == 1
