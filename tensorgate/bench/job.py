"""One run as inert, picklable data, and the call that executes it on a fresh event loop.

A :class:`Job` holds everything a client process needs (what to send, where, how hard), so
``--processes N`` can hand each child its share without the child talking to the server
before the run starts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tensorgate.bench.inputs import RequestTensors
from tensorgate.bench.progress import Progress
from tensorgate.bench.results import RunResult
from tensorgate.bench.runner import LoadSpec, run_load
from tensorgate.bench.sequences import SequenceSpec, run_sequences
from tensorgate.bench.targets.base import Endpoint
from tensorgate.bench.targets.factory import build_target
from tensorgate.bench.targets.sequences import build_sequence_target
from tensorgate.clock import Clock, MonotonicClock

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Job:
    protocol: str
    endpoint: Endpoint
    model: str
    version: str | None
    spec: LoadSpec | SequenceSpec  # requests (closed or open loop), or sequences at real-time pace
    tensors: list[RequestTensors] = field(default_factory=list)
    documents: list[dict[str, Any]] = field(default_factory=list)


async def run_job(
    job: Job, clock: Clock, progress: Progress | None = None, before: Callable[[], None] | None = None
) -> RunResult:
    """Encode the requests, then (after ``before``, a start barrier for client processes) run the load."""
    if isinstance(job.spec, SequenceSpec):
        sequences = build_sequence_target(job.protocol, job.endpoint, job.model, job.version, job.tensors)
        try:
            if before is not None:
                await asyncio.to_thread(before)
            return await run_sequences(sequences, job.spec, clock, progress)
        finally:
            await sequences.aclose()
    target = build_target(job.protocol, job.endpoint, job.model, job.version, job.tensors, job.documents, clock)
    try:
        if before is not None:
            await asyncio.to_thread(before)
        return await run_load(target, job.spec, clock, progress)
    finally:
        await target.aclose()


def run_async(factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run on uvloop when it is installed: its event loop costs less per request than asyncio's."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is absent on Windows
        return asyncio.run(factory())
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(factory())


def execute(job: Job, progress: Progress | None = None) -> RunResult:
    """Run ``job`` in this process, on the real monotonic clock."""
    clock = MonotonicClock()
    return run_async(lambda: run_job(job, clock, progress))
