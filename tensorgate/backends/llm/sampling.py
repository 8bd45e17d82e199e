"""Picking each sequence's next token from a step's logits: greedy, or drawn with temperature,
top-k and top-p, from a generator per seeded sequence so that a seed reproduces its text."""

from __future__ import annotations

import math

import torch

from tensorgate.generation import Sampled, SamplingParams, ScheduledChunk


class Sampler:
    """The sampling state of a runner's sequences: one random generator per seeded sequence."""

    def __init__(self, device: str) -> None:
        self._device = device
        self._generators: dict[int, torch.Generator] = {}

    def forget(self, seq_id: int) -> None:
        self._generators.pop(seq_id, None)

    def reset(self) -> None:
        self._generators.clear()

    def sample(self, logits: torch.Tensor, chunks: list[ScheduledChunk]) -> dict[int, Sampled]:
        """Row ``i`` of ``logits`` (float) picks the next token of ``chunks[i]``'s sequence."""
        logprobs = torch.log_softmax(logits, dim=-1)
        greedy = torch.argmax(logits, dim=-1)
        chosen: list[int] = greedy.tolist()
        drawn = False
        for i, chunk in enumerate(chunks):
            if not chunk.params.greedy:
                chosen[i] = draw(logits[i], chunk.params, self._generator(chunk.seq_id, chunk.params.seed))
                drawn = True
        index = torch.tensor(chosen, device=logits.device) if drawn else greedy
        picked: list[float] = logprobs.gather(1, index[:, None]).view(-1).tolist()
        result: dict[int, Sampled] = {}
        for i, chunk in enumerate(chunks):
            top: tuple[tuple[int, float], ...] = ()
            wanted = chunk.params.logprobs
            if wanted:
                values, indices = torch.topk(logprobs[i], min(wanted, logprobs.shape[-1]))
                top = tuple(zip(indices.tolist(), values.tolist(), strict=True))
            result[chunk.seq_id] = Sampled(chosen[i], picked[i], top)
        return result

    def _generator(self, seq_id: int, seed: int | None) -> torch.Generator | None:
        if seed is None:
            return None
        gen = self._generators.get(seq_id)
        if gen is None:
            gen = torch.Generator(device=self._device)
            gen.manual_seed(seed)
            self._generators[seq_id] = gen
        return gen


def draw(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token from one row of logits, after temperature, top-k and top-p."""
    scores = logits / max(params.temperature, 1e-5)
    if params.top_k > 0 and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, -math.inf)
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True)
        cumulative = torch.softmax(sorted_scores, dim=-1).cumsum(dim=-1)
        drop = cumulative - torch.softmax(sorted_scores, dim=-1) > params.top_p
        sorted_scores = sorted_scores.masked_fill(drop, -math.inf)
        scores = torch.full_like(scores, -math.inf).scatter(0, order, sorted_scores)
    probs = torch.softmax(scores, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator).item())
