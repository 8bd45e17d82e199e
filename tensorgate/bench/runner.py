"""Closed-loop and open-loop drivers: when requests are sent, and which ones count.

Closed loop (``-c N``): N workers each send a request, wait for the answer, and send the next;
throughput is whatever the server sustains at that concurrency. Open loop (``--rate R``):
requests are due at Poisson arrival times whether or not earlier ones have answered, and
latency is measured from the *due* time, so a server that falls behind is charged for the
queueing it causes (no coordinated omission). The run stops at ``-z`` seconds or after ``-n``
counted requests. A closed loop that runs for a duration counts what completes between the end of
warm-up and the end of the run, as perf_analyzer does (see ``Recorder``); otherwise the requests
that start after warm-up count, every one of them waited for (an open loop's backlog included).
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from typing import Any

from tensorgate.bench.arrivals import poisson_offsets
from tensorgate.bench.http_client import ConnectionLost
from tensorgate.bench.progress import Progress
from tensorgate.bench.results import Recorder, RunResult
from tensorgate.bench.targets.base import Outcome, Target
from tensorgate.clock import Clock

DEFAULT_MAX_INFLIGHT = 4096


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """One run's load: exactly one of ``concurrency``/``rate``, and ``duration_s`` and/or ``requests``."""

    concurrency: int | None = None
    rate: float | None = None
    duration_s: float | None = None
    requests: int | None = None
    warmup_s: float = 0.0
    timeout_s: float = 30.0
    seed: int = 0
    max_inflight: int = DEFAULT_MAX_INFLIGHT

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("give exactly one of a concurrency (closed loop) or a rate (open loop)")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.duration_s is None and self.requests is None:
            raise ValueError("give a duration or a number of requests")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError("duration must be positive")
        if self.requests is not None and self.requests < 1:
            raise ValueError("the number of requests must be at least 1")


class _Run:
    """The state one run's tasks share; built and discarded by :func:`run_load`."""

    def __init__(self, target: Target, spec: LoadSpec, clock: Clock) -> None:
        self.target = target
        self.spec = spec
        self.clock = clock
        self.started = clock.now()
        self.window_start = self.started + spec.warmup_s
        self.stop_at = None if spec.duration_s is None else self.window_start + spec.duration_s
        by_completion = spec.concurrency is not None and spec.requests is None
        self.recorder = Recorder(self.window_start, self.stop_at if by_completion else None)
        self.counted_budget = spec.requests
        self.indices = itertools.count()
        self.inflight: dict[asyncio.Task[Any], float] = {}  # call -> when it times out
        self.expired: set[asyncio.Task[Any]] = set()

    def take(self, now: float) -> bool | None:
        """Whether a request starting ``now`` counts; None when the run is over and none may start."""
        if self.stop_at is not None and now >= self.stop_at:
            return None
        if now < self.window_start:
            return False
        if self.counted_budget is not None:
            if self.counted_budget == 0:
                return None
            self.counted_budget -= 1
        return True

    async def one(self, due: float, counted: bool) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.inflight[task] = self.clock.now() + self.spec.timeout_s
        try:
            outcome = await self.target.call(next(self.indices))
        except asyncio.CancelledError:
            if task not in self.expired:
                raise
            self.expired.discard(task)
            task.uncancel()
            outcome = Outcome("timeout")
        except (OSError, ConnectionLost):
            outcome = Outcome("connection error")
        finally:
            del self.inflight[task]
        self.recorder.add(due, self.clock.now(), outcome, counted)

    async def watchdog(self) -> None:
        """Cancel calls past their timeout.

        One periodic sweep instead of ``asyncio.timeout`` around every call: a per-call timer
        cost ~20 us of client CPU per request (profiled), a third of the whole client's cost.
        A timeout fires up to a quarter of itself late, which is fine for a safety net.
        """
        period = min(max(self.spec.timeout_s / 4, 0.001), 1.0)
        while True:
            await asyncio.sleep(period)
            now = self.clock.now()
            for task, deadline in list(self.inflight.items()):
                if deadline <= now and task not in self.expired:
                    self.expired.add(task)
                    task.cancel()

    async def closed_worker(self) -> None:
        while True:
            now = self.clock.now()
            counted = self.take(now)
            if counted is None:
                return
            await self.one(now, counted)

    async def open_loop(self) -> None:
        assert self.spec.rate is not None
        gate = asyncio.Semaphore(self.spec.max_inflight)
        pending: set[asyncio.Task[None]] = set()

        async def fire(due: float, counted: bool) -> None:
            async with gate:  # waiting here is charged to the request: latency runs from ``due``
                await self.one(due, counted)

        for sent, offset in enumerate(poisson_offsets(self.spec.rate, self.spec.seed)):
            due = self.started + offset
            delay = due - self.clock.now()
            if delay > 0:
                await asyncio.sleep(delay)
            elif sent % 64 == 0:
                # Behind schedule: keep firing, but let answers in now and then, or a rate the
                # loop cannot keep up with would starve every response until the schedule ends.
                await asyncio.sleep(0)
            counted = self.take(due)
            if counted is None:
                break
            task = asyncio.create_task(fire(due, counted))
            pending.add(task)
            task.add_done_callback(pending.discard)
        if pending:
            await asyncio.gather(*pending)


async def run_load(target: Target, spec: LoadSpec, clock: Clock, progress: Progress | None = None) -> RunResult:
    """Drive ``target`` with ``spec``'s load and return the counted requests."""
    run = _Run(target, spec, clock)
    reporter = None if progress is None else asyncio.create_task(progress.run(run.recorder.result, run.started))
    watchdog = asyncio.create_task(run.watchdog())
    try:
        if spec.concurrency is not None:
            await asyncio.gather(*(run.closed_worker() for _ in range(spec.concurrency)))
        else:
            await run.open_loop()
    finally:
        for helper in (reporter, watchdog):
            if helper is not None:
                helper.cancel()
                await asyncio.gather(helper, return_exceptions=True)
    return run.recorder.finish()
