"""The contract between the step scheduler and a generative runner: what one step computes.

No torch here: the pure scheduler builds these, the runner (``llm_backend``) executes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick each next token and when to stop. ``temperature == 0`` means greedy."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # how many alternatives to report besides the chosen token

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1


class ScheduledChunk(NamedTuple):
    """Compute ``token_ids`` at positions ``start..`` of one sequence; sample after them if ``sample``.

    A named tuple, as :class:`Sampled`: one is made per running sequence per step, and a frozen
    dataclass's ``__init__`` cost several times a tuple's (profiled: the largest part of
    scheduling a step of 100 sequences).
    """

    seq_id: int
    start: int
    token_ids: tuple[int, ...]
    sample: bool
    params: SamplingParams


@dataclass(frozen=True, slots=True)
class StepPlan:
    chunks: tuple[ScheduledChunk, ...]
    freed: tuple[int, ...]  # sequences whose cache the runner drops before this step
    preempted: tuple[int, ...] = ()  # among ``freed``: coming back later, so their sampler state is kept

    @property
    def num_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.chunks)

    @property
    def empty(self) -> bool:
        return not self.chunks and not self.freed


class Sampled(NamedTuple):
    """The token a step picked for one sequence, its log-probability and the top alternatives."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
