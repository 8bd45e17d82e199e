"""One generation request as the step scheduler sees it: tokens, sampling settings, progress.

Pure data: no torch, no asyncio. The scheduler owns the mutable :class:`Sequence` records.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from tensorgate.generation import FinishReason, SamplingParams


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False, slots=True)
class Sequence:
    """A request's state. ``eq=False``: identity decides membership in the queues."""

    seq_id: int
    prompt_ids: list[int]
    params: SamplingParams
    priority: int  # 1 is the highest
    arrival: float
    deadline: float | None = None
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose keys and values are in the cache
    blocks: int = 0  # cache blocks this sequence holds
    status: SeqStatus = SeqStatus.WAITING
    finish_reason: FinishReason | None = None
    preemptions: int = 0
    # The caller reads only the whole answer: its tokens reach the event loop when it finishes
    # (and its first, for time to first token), not one by one.
    quiet: bool = False

    @property
    def total_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def remaining(self) -> int:
        """Tokens still to compute before the next token can be sampled."""
        return self.total_len - self.num_computed

    def token_ids(self, start: int, count: int) -> tuple[int, ...]:
        prompt = len(self.prompt_ids)
        if start + count <= prompt:
            return tuple(self.prompt_ids[start : start + count])
        if start >= prompt:  # a decode: only generated tokens (no copy of the whole sequence)
            return tuple(self.output_ids[start - prompt : start - prompt + count])
        merged = self.prompt_ids + self.output_ids
        return tuple(merged[start : start + count])

    @property
    def order(self) -> tuple[int, float, int]:
        """Scheduling order: higher priority first, then earlier arrival."""
        return (self.priority, self.arrival, self.seq_id)
