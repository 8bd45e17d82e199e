"""The step scheduler: which sequences compute which tokens in the next model step.

A pure state machine in the manner of vLLM's v1 scheduler: no I/O, no clock (``now`` is an
argument), no torch. Each step it

1. gives every running sequence its next tokens (one for a decode, a chunk for a prefill), in
   priority order, within ``max_num_batched_tokens``; when the KV cache cannot grow it preempts
   the lowest-priority, latest-arrived running sequence (its cache is dropped and recomputed later);
2. then, if nothing was preempted, admits waiting sequences in priority order while the running
   set stays within ``max_num_seqs``, the token budget lasts and the whole prompt's cache fits.

Prefill is chunked: a long prompt takes what is left of the token budget after the decodes, so it
never stalls them. The driver runs the plan, then reports the sampled tokens through :meth:`update`.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from tensorgate.errors import InvalidInput, QueueFull
from tensorgate.generation import FinishReason, ScheduledChunk, StepPlan
from tensorgate.scheduling.continuous.kv_budget import KVBudget
from tensorgate.scheduling.continuous.sequence import SeqStatus, Sequence

RETRY_AFTER_S = 1.0
# Scheduling order: higher priority (lower number) first, then earlier arrival.
_ORDER = operator.attrgetter("priority", "arrival", "seq_id")


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    max_waiting: int = 1024
    priority_levels: int = 1
    eos_token_id: int | None = None


class SeqUpdate(NamedTuple):
    """What one step did to one sequence: a new token, and whether it is finished."""

    seq: Sequence
    token_id: int | None
    finished: bool


class StepScheduler:
    def __init__(self, settings: SchedulerSettings, kv: KVBudget) -> None:
        self.settings = settings
        self.kv = kv
        self._waiting: list[deque[Sequence]] = [deque() for _ in range(settings.priority_levels)]
        self._num_waiting = 0
        self._running: list[Sequence] = []
        self._by_id: dict[int, Sequence] = {}
        self._to_free: list[int] = []
        self._unsorted = False  # the running list needs sorting into scheduling order
        self.preemptions = 0

    # -- queries ---------------------------------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        return self._num_waiting

    @property
    def num_running(self) -> int:
        return len(self._running)

    def has_work(self) -> bool:
        return bool(self._num_waiting or self._running or self._to_free)

    def get(self, seq_id: int) -> Sequence | None:
        return self._by_id.get(seq_id)

    def running(self) -> tuple[Sequence, ...]:
        return tuple(self._running)

    def waiting(self) -> Iterator[Sequence]:
        for level in self._waiting:
            yield from level

    def next_deadline(self) -> float | None:
        deadlines = [s.deadline for s in self.waiting() if s.deadline is not None]
        return min(deadlines) if deadlines else None

    # -- admission and removal -------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence, or raise at once: InvalidInput when it can never run, QueueFull when full."""
        s = self.settings
        if not 1 <= seq.priority <= s.priority_levels:
            raise InvalidInput(f"priority {seq.priority} is outside 1..{s.priority_levels}")
        if not seq.prompt_ids:
            raise InvalidInput("the prompt is empty")
        prompt = len(seq.prompt_ids)
        if prompt + seq.params.max_tokens > s.max_model_len:
            raise InvalidInput(
                f"the prompt ({prompt} tokens) plus max_tokens ({seq.params.max_tokens}) exceeds "
                f"the model's context length of {s.max_model_len} tokens"
            )
        if self.kv.blocks_for(prompt + 1) > self.kv.total_blocks:
            raise InvalidInput(
                f"the prompt ({prompt} tokens) does not fit the KV cache ({self.kv.capacity_tokens} tokens)"
            )
        if self._num_waiting >= s.max_waiting:
            raise QueueFull(
                f"the generation queue is full ({s.max_waiting} requests waiting); retry later",
                retry_after_s=RETRY_AFTER_S,
            )
        if seq.seq_id in self._by_id:
            raise ValueError(f"sequence {seq.seq_id} is already scheduled")
        seq.status = SeqStatus.WAITING
        self._waiting[seq.priority - 1].append(seq)
        self._num_waiting += 1
        self._by_id[seq.seq_id] = seq

    def finish(self, seq_id: int, reason: FinishReason) -> Sequence | None:
        """End a sequence now (cancelled, stop string): it leaves the queue, or frees its cache next step."""
        seq = self._by_id.get(seq_id)
        if seq is None:
            return None
        if seq.status is SeqStatus.WAITING:
            self._waiting[seq.priority - 1].remove(seq)
            self._num_waiting -= 1
        elif seq.status is SeqStatus.RUNNING:
            self._running.remove(seq)
        self._end(seq, reason)
        return seq

    def _end(self, seq: Sequence, reason: FinishReason) -> None:
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        if seq.blocks or seq.num_computed or seq.output_ids or seq.preemptions:
            self._to_free.append(seq.seq_id)  # the runner holds a cache or a sampler for it
        self.kv.release(seq.blocks)
        seq.blocks = 0
        seq.num_computed = 0
        del self._by_id[seq.seq_id]

    def expire(self, now: float) -> list[Sequence]:
        """Remove and return waiting sequences whose deadline has passed."""
        expired = [s for s in self.waiting() if s.deadline is not None and s.deadline <= now]
        for seq in expired:
            self.finish(seq.seq_id, FinishReason.EXPIRED)
        return expired

    def _preempt(self, seq: Sequence) -> None:
        self._running.remove(seq)
        self.kv.release(seq.blocks)
        seq.blocks = 0
        seq.num_computed = 0
        seq.preemptions += 1
        seq.status = SeqStatus.WAITING
        self._to_free.append(seq.seq_id)
        self._waiting[seq.priority - 1].appendleft(seq)  # first in line to come back
        self._num_waiting += 1
        self.preemptions += 1

    # -- the step --------------------------------------------------------------------------------

    def schedule(self, now: float) -> tuple[StepPlan, list[Sequence]]:
        """The next step, and the sequences that ended before it (expired, or out of cache)."""
        ended = self.expire(now)
        budget = self.settings.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        preempted: list[int] = []
        running = self._running
        if self._unsorted:
            running.sort(key=_ORDER)
            self._unsorted = False
        kv = self.kv
        block_size = kv.block_size
        index = 0
        while index < len(running) and budget > 0:
            seq = running[index]
            start = seq.num_computed
            prompt = len(seq.prompt_ids)
            total = prompt + len(seq.output_ids)
            count = total - start
            if count == 1 and start >= prompt and start < seq.blocks * block_size:
                # The common decode (its last sampled token, no new cache block), inlined: this
                # loop runs for every running sequence every step (~3 us each through the general path).
                chunks.append(ScheduledChunk(seq.seq_id, start, (seq.output_ids[-1],), True, seq.params))
                budget -= 1
                index += 1
                continue
            count = min(count, budget)
            if kv.blocks_for(start + count) <= seq.blocks:  # no new block
                chunks.append(self._chunk(seq, count))
                budget -= count
                index += 1
                continue
            while not kv.can_grow(seq.blocks, seq.num_computed + count):
                victim = max(self._running, key=_ORDER)
                if victim is seq and len(self._running) == 1:
                    # Alone and still out of cache: it can never finish; end it at its length limit.
                    self._running.remove(seq)
                    self._end(seq, FinishReason.LENGTH)
                    ended.append(seq)
                    break
                self._preempt(victim)
                preempted.append(victim.seq_id)
                if victim is seq:
                    break
            else:
                seq.blocks = self.kv.grow(seq.blocks, seq.num_computed + count)
                chunks.append(self._chunk(seq, count))
                budget -= count
                index += 1
        if not preempted:
            budget = self._admit(chunks, budget)
        freed = tuple(self._to_free)
        self._to_free.clear()
        return StepPlan(tuple(chunks), freed, tuple(preempted)), ended

    def _admit(self, chunks: list[ScheduledChunk], budget: int) -> int:
        for level in self._waiting:
            while level and budget > 0 and len(self._running) < self.settings.max_num_seqs:
                seq = level[0]
                # Admit only when the whole prompt (plus the first sampled token) fits now.
                if self.kv.blocks_for(seq.total_len + 1) > self.kv.free_blocks:
                    return budget
                level.popleft()
                self._num_waiting -= 1
                count = min(seq.remaining, budget)
                seq.blocks = self.kv.grow(seq.blocks, seq.num_computed + count)
                seq.status = SeqStatus.RUNNING
                self._running.append(seq)
                self._unsorted = True
                chunks.append(self._chunk(seq, count))
                budget -= count
        return budget

    @staticmethod
    def _chunk(seq: Sequence, count: int) -> ScheduledChunk:
        start = seq.num_computed
        return ScheduledChunk(
            seq.seq_id, start, seq.token_ids(start, count), start + count == seq.total_len, seq.params
        )

    def update(self, plan: StepPlan, sampled: Mapping[int, int]) -> list[SeqUpdate]:
        """Record a finished step: advance each chunk, append sampled tokens, apply stop conditions.

        Sequences finished or preempted while the step ran are skipped; their results are dropped.
        """
        updates: list[SeqUpdate] = []
        eos = self.settings.eos_token_id
        max_len = self.settings.max_model_len
        by_id = self._by_id
        running = SeqStatus.RUNNING
        for chunk in plan.chunks:
            seq = by_id.get(chunk.seq_id)
            if seq is None or seq.status is not running or seq.num_computed != chunk.start:
                continue
            seq.num_computed += len(chunk.token_ids)
            if not chunk.sample:
                continue
            token = sampled[chunk.seq_id]
            outputs = seq.output_ids
            outputs.append(token)
            params = seq.params
            reason: FinishReason | None = None
            if (token == eos and not params.ignore_eos) or token in params.stop_token_ids:
                reason = FinishReason.STOP
            elif len(outputs) >= params.max_tokens or len(seq.prompt_ids) + len(outputs) >= max_len:
                reason = FinishReason.LENGTH
            if reason is not None:
                self._running.remove(seq)
                self._end(seq, reason)
            updates.append(SeqUpdate(seq, token, reason is not None))
        return updates
