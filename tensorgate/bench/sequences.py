"""``--sequences N``: N concurrent sequences (utterances) at real-time pace, each chunk timed.

Each of N *slots* stands for a speaker: it sends a sequence of ``chunks`` requests, one every
``interval_s`` (chunk ``k`` is due ``k * interval_s`` after the sequence's first), with Triton's
parameters (``sequence_id``; ``sequence_start`` on the first chunk, ``sequence_end`` on the last).
The slots' first chunks are spread evenly over one interval, so chunks arrive at a steady
``N / interval_s`` per second, as from independent speakers, rather than in bursts.

A chunk is sent when it is due, or, when the slot's previous chunk is not answered yet, as soon as
that answer comes: the chunks of a sequence must reach the server in order and one at a time on
every protocol. Latency runs from the chunk's *due* time to its answer, so a server that falls
behind real time is charged for the backlog it causes (no coordinated omission): a chunk sent late
because the one before it was slow counts its wait.

Without a duration each slot runs one sequence. With ``duration_s`` the slots start sequence after
sequence, back to back, until the window ends; the chunks due inside the window (after warm-up)
count, and the sequences in progress at its end run to their last chunk, uncounted, so every
sequence the server saw is ended. A failed chunk ends its sequence: the sequence's remaining chunks
are counted as errors (``skipped``), not sent.

Sequence ids are ``first_id + slot + n * total_slots`` for a slot's ``n``-th sequence: distinct
within a run, and across the client processes of ``--processes`` (each drives its own slots).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from tensorgate.bench.http_client import ConnectionLost
from tensorgate.bench.progress import Progress
from tensorgate.bench.results import Recorder, RunResult
from tensorgate.bench.targets.base import Outcome
from tensorgate.bench.targets.sequences import SequenceTarget
from tensorgate.clock import Clock

SKIPPED = "skipped (an earlier chunk of its sequence failed)"


@dataclass(frozen=True, slots=True)
class SequenceSpec:
    """One run of sequences. ``slots`` is this client's share; ``first_slot`` and ``total_slots``
    place it among every client process's slots (phases and ids)."""

    slots: int
    chunks: int
    interval_s: float
    duration_s: float | None = None
    warmup_s: float = 0.0
    timeout_s: float = 30.0
    first_id: int = 1
    first_slot: int = 0
    total_slots: int | None = None

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError("--sequences must be at least 1")
        if self.chunks < 1:
            raise ValueError("--chunks-per-sequence must be at least 1")
        if not self.interval_s > 0:
            raise ValueError("--chunk-interval-ms must be positive")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError("duration must be positive")
        if self.first_id < 1:
            raise ValueError("sequence ids start at 1 (0 means no sequence)")

    @property
    def all_slots(self) -> int:
        return self.total_slots if self.total_slots is not None else self.first_slot + self.slots

    @property
    def chunks_per_s(self) -> float:
        """The chunk rate every client process together offers."""
        return self.all_slots / self.interval_s

    def phase_s(self, slot: int) -> float:
        """When (global) ``slot``'s first chunk is due, from the run's start."""
        return slot * self.interval_s / self.all_slots

    def sequence_id(self, slot: int, number: int) -> int:
        return self.first_id + slot + number * self.all_slots


class _SequenceRun:
    def __init__(self, target: SequenceTarget, spec: SequenceSpec, clock: Clock) -> None:
        self.target = target
        self.spec = spec
        self.clock = clock
        self.started = clock.now()
        self.window_start = self.started + spec.warmup_s
        self.window_end = None if spec.duration_s is None else self.window_start + spec.duration_s
        self.recorder = Recorder(self.window_start)

    def counts(self, due: float) -> bool:
        return due >= self.window_start and (self.window_end is None or due < self.window_end)

    async def slot(self, local: int) -> None:
        spec = self.spec
        slot = spec.first_slot + local
        length_s = spec.chunks * spec.interval_s
        number = 0
        while True:
            begin = self.started + spec.phase_s(slot) + number * length_s
            if number and (self.window_end is None or begin >= self.window_end):
                return
            await self.sequence(local, spec.sequence_id(slot, number), begin)
            number += 1

    async def sequence(self, local: int, sequence_id: int, begin: float) -> None:
        spec, clock = self.spec, self.clock
        last = spec.chunks - 1
        for index in range(spec.chunks):
            due = begin + index * spec.interval_s
            delay = due - clock.now()
            if delay > 0:
                await asyncio.sleep(delay)
            outcome = await self.chunk(local, index, sequence_id, index == 0, index == last)
            self.recorder.add(due, clock.now(), outcome, self.counts(due))
            if outcome.error is not None:
                now = clock.now()
                for later in range(index + 1, spec.chunks):
                    skipped_due = begin + later * spec.interval_s
                    self.recorder.add(skipped_due, now, Outcome(SKIPPED), self.counts(skipped_due))
                self.recorder.result.sequences_failed += 1
                return
        self.recorder.result.sequences += 1

    async def chunk(self, local: int, index: int, sequence_id: int, start: bool, end: bool) -> Outcome:
        try:
            async with asyncio.timeout(self.spec.timeout_s):
                return await self.target.send(local, local + index, sequence_id, start, end)
        except TimeoutError:
            return Outcome("timeout")
        except (OSError, ConnectionLost):
            return Outcome("connection error")


async def run_sequences(
    target: SequenceTarget, spec: SequenceSpec, clock: Clock, progress: Progress | None = None
) -> RunResult:
    """Open the slots' connections, then drive ``spec``'s sequences and time every chunk (latencies
    are the chunks'; ``sequences`` counts the sequences sent to their end)."""
    try:
        async with asyncio.timeout(spec.timeout_s):
            await target.open(spec.slots)
    except TimeoutError:
        raise RuntimeError(f"could not connect {spec.slots} sequences within {spec.timeout_s:g} s") from None
    run = _SequenceRun(target, spec, clock)
    reporter = None if progress is None else asyncio.create_task(progress.run(run.recorder.result, run.started))
    try:
        await asyncio.gather(*(run.slot(local) for local in range(spec.slots)))
    finally:
        if reporter is not None:
            reporter.cancel()
            await asyncio.gather(reporter, return_exceptions=True)
    result = run.recorder.finish()
    if run.window_end is not None:
        result.elapsed_s = run.window_end - run.window_start
    return result
