"""``--processes N``: one client spread over N processes, for loads one Python core cannot generate.

Each child gets an equal share of the concurrency, rate and request count, and its own seed;
all children wait at a barrier after encoding their requests so their windows line up, and
send back raw latencies, which merge exactly (see ``results``). Children are spawned, not
forked, so none inherits the parent's event loop or sockets.
"""

from __future__ import annotations

import multiprocessing
import queue
from dataclasses import replace
from typing import Any

from tensorgate.bench.job import Job, run_async, run_job
from tensorgate.bench.results import RunResult, merge
from tensorgate.bench.sequences import SequenceSpec
from tensorgate.clock import MonotonicClock
from tensorgate.memory import tune_malloc

_START_TIMEOUT_S = 120.0


def share(total: int, parts: int, index: int) -> int:
    """``index``'s share when ``total`` is split as evenly as possible into ``parts``."""
    return total // parts + (1 if index < total % parts else 0)


def split(job: Job, processes: int) -> list[Job]:
    """The per-process jobs; processes that would get no work are left out."""
    spec = job.spec
    jobs = []
    if isinstance(spec, SequenceSpec):  # each process drives its own slots (phases and ids apart)
        first = spec.first_slot
        for i in range(processes):
            slots = share(spec.slots, processes, i)
            if slots:
                jobs.append(replace(job, spec=replace(spec, slots=slots, first_slot=first, total_slots=spec.all_slots)))
            first += slots
        return jobs
    for i in range(processes):
        concurrency = None if spec.concurrency is None else share(spec.concurrency, processes, i)
        requests = None if spec.requests is None else share(spec.requests, processes, i)
        if concurrency == 0 or requests == 0:
            continue
        rate = None if spec.rate is None else spec.rate / processes
        part = replace(spec, concurrency=concurrency, rate=rate, requests=requests, seed=spec.seed + i)
        jobs.append(replace(job, spec=part))
    return jobs


def _child(job: Job, barrier: Any, results: Any) -> None:
    tune_malloc()  # a spawned child starts with glibc's defaults again
    try:
        clock = MonotonicClock()
        result = run_async(lambda: run_job(job, clock, before=lambda: barrier.wait(_START_TIMEOUT_S)))
        results.put(result)
    except BaseException as exc:
        results.put(f"{type(exc).__name__}: {exc}")
        raise


def run_processes(job: Job, processes: int) -> RunResult:
    """Run ``job`` split over ``processes`` spawned client processes and merge their results."""
    jobs = split(job, processes)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(jobs))
    results = ctx.Queue()
    children = [ctx.Process(target=_child, args=(j, barrier, results), daemon=True) for j in jobs]
    for child in children:
        child.start()
    collected: list[RunResult] = []
    try:
        while len(collected) < len(children):
            try:
                item = results.get(timeout=1.0)
            except queue.Empty:
                if any(c.exitcode not in (None, 0) for c in children):
                    raise RuntimeError("a client process died before reporting") from None
                continue
            if isinstance(item, str):
                raise RuntimeError(f"a client process failed: {item}")
            collected.append(item)
    finally:
        for child in children:
            child.join(5.0)
            if child.is_alive():
                child.terminate()
                child.join()
    return merge(collected)
