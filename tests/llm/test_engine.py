"""The engine on a real tiny model: continuous batching gives what ``generate`` gives alone."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tensorgate.backends.base import Device
from tensorgate.backends.llm import row_groups
from tensorgate.backends.llm.kv_cache import _runs
from tensorgate.backends.llm.row_groups import row_ranges, similar_widths
from tensorgate.backends.llm.runner import CausalLMRunner, load_causal_lm
from tensorgate.clock import MonotonicClock
from tensorgate.errors import InternalError, InvalidInput
from tensorgate.generation import FinishReason, GenerationStream, Sampled, SamplingParams, StepPlan, collect
from tensorgate.scheduling.continuous.engine import Engine
from tensorgate.scheduling.continuous.kv_budget import KVBudget
from tensorgate.scheduling.continuous.step_scheduler import SchedulerSettings, StepScheduler

VOCAB = range(7, 70)


@pytest.fixture(scope="module", params=[False, True], ids=["transformers-forward", "lean-forward"])
def runner(tiny_dir: Path, request: pytest.FixtureRequest) -> CausalLMRunner:
    """Every engine test runs on both forwards: transformers' own and the lean one (the default)."""
    return load_causal_lm(tiny_dir, Device(), lean=request.param)


@pytest.fixture(scope="module")
def reference(tiny_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(tiny_dir, use_safetensors=True, local_files_only=True).eval()


def generate_alone(model: torch.nn.Module, prompt: list[int], max_tokens: int) -> list[int]:
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False)  # type: ignore[operator]
    return list(out[0, len(prompt) :].tolist())


class CheckedRunner:
    """Wraps the runner: records every plan and checks the engine's own accounting each step."""

    def __init__(self, inner: CausalLMRunner, scheduler: StepScheduler) -> None:
        self.inner = inner
        self.scheduler = scheduler
        self.plans: list[StepPlan] = []
        self.max_used = 0
        self.steps = 0
        self._stepped = asyncio.Event()
        self._loop = asyncio.get_running_loop()

    async def wait_until(self, predicate: Callable[[], bool], timeout_s: float = 30.0) -> None:
        """Wait, step by step (no sleeps), until ``predicate`` holds."""
        async with asyncio.timeout(timeout_s):
            while not predicate():
                self._stepped.clear()
                await self._stepped.wait()

    def reset(self) -> None:
        self.inner.reset()

    def run_step(self, plan: StepPlan) -> dict[int, Sampled]:
        kv = self.scheduler.kv
        assert kv.used_blocks <= kv.total_blocks
        assert plan.num_tokens <= self.scheduler.settings.max_num_batched_tokens
        assert self.scheduler.num_running <= self.scheduler.settings.max_num_seqs
        self.max_used = max(self.max_used, kv.used_blocks)
        self.plans.append(plan)
        try:
            return self.inner.run_step(plan)
        finally:
            self.steps += 1
            self._loop.call_soon_threadsafe(self._stepped.set)


@pytest.fixture()
async def make_engine(runner: CausalLMRunner) -> AsyncIterator[object]:
    engines: list[Engine] = []

    async def build(
        *, seqs: int = 8, tokens: int = 64, kv_tokens: int = 4096, block: int = 16
    ) -> tuple[Engine, CheckedRunner]:
        scheduler = StepScheduler(
            SchedulerSettings(seqs, tokens, max_model_len=512, eos_token_id=runner.codec.eos_token_id),
            KVBudget(kv_tokens * runner.kv_bytes_per_token, runner.kv_bytes_per_token, block),
        )
        checked = CheckedRunner(runner, scheduler)
        engine = Engine(checked, scheduler, runner.codec, MonotonicClock())
        await engine.start()
        engines.append(engine)
        return engine, checked

    yield build
    for engine in engines:
        await engine.aclose()


def workload(n: int, seed: int, longest: int = 60) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.choice(VOCAB) for _ in range(rng.randint(1, longest))], rng.randint(1, 24)) for _ in range(n)]


async def run_staggered(
    engine: Engine, checked: CheckedRunner, work: list[tuple[list[int], int]]
) -> list[GenerationStream]:
    """Submit requests a few steps apart so they join and leave while others decode."""
    streams: list[GenerationStream] = []
    tasks = []
    for prompt, max_tokens in work:
        stream = engine.submit(prompt, SamplingParams(max_tokens=max_tokens))
        streams.append(stream)
        tasks.append(asyncio.create_task(collect(stream)))
        target = checked.steps + 2
        await checked.wait_until(lambda t=target: checked.steps >= t or all(task.done() for task in tasks))
    async with asyncio.timeout(60):
        await asyncio.gather(*tasks)
    return streams


async def test_greedy_matches_generate_with_joins_and_leaves(make_engine, reference) -> None:  # type: ignore[no-untyped-def]
    engine, checked = await make_engine(seqs=6, tokens=40)
    work = workload(14, seed=3)
    streams = await run_staggered(engine, checked, work)
    for (prompt, max_tokens), stream in zip(work, streams, strict=True):
        assert stream.output_ids == generate_alone(reference, prompt, max_tokens), f"prompt of {len(prompt)}"
    # The test really exercised continuous batching: decodes shared forwards with other rows,
    # and prompts longer than the token budget were split into chunks.
    assert max(sum(1 for c in p.chunks if len(c.token_ids) == 1) for p in checked.plans) >= 3
    assert any(any(not c.sample and c.start == 0 for c in p.chunks) for p in checked.plans)


async def test_chunked_prefill_of_a_long_prompt_does_not_stall_decodes(make_engine, reference) -> None:  # type: ignore[no-untyped-def]
    engine, checked = await make_engine(seqs=4, tokens=16)
    short = engine.submit([9, 10, 11], SamplingParams(max_tokens=20, ignore_eos=True))
    short_task = asyncio.create_task(collect(short))
    await checked.wait_until(lambda: checked.steps >= 2)
    long_prompt = [VOCAB[i % len(VOCAB)] for i in range(120)]
    long = engine.submit(long_prompt, SamplingParams(max_tokens=8))
    async with asyncio.timeout(60):
        await asyncio.gather(short_task, collect(long))
    assert long.output_ids == generate_alone(reference, long_prompt, 8)
    prefill_steps = [p for p in checked.plans if any(c.seq_id == long.seq_id and not c.sample for c in p.chunks)]
    assert len(prefill_steps) >= 7  # 120 tokens through a 16-token budget
    for plan in prefill_steps:  # and the short sequence decoded in each of them
        assert any(c.seq_id == short.seq_id and len(c.token_ids) == 1 for c in plan.chunks) or short.finish_reason


async def test_preempted_sequences_recompute_to_the_same_tokens(make_engine, reference) -> None:  # type: ignore[no-untyped-def]
    # 96 cache tokens for 6 sequences that grow to ~50 tokens each: preemption is certain.
    engine, checked = await make_engine(seqs=6, tokens=64, kv_tokens=96, block=8)
    rng = random.Random(11)
    work = [([rng.choice(VOCAB) for _ in range(rng.randint(20, 30))], 24) for _ in range(6)]
    streams = [engine.submit(p, SamplingParams(max_tokens=m)) for p, m in work]
    async with asyncio.timeout(60):
        await asyncio.gather(*(collect(s) for s in streams))
    assert engine.scheduler.preemptions > 0
    for (prompt, max_tokens), stream in zip(work, streams, strict=True):
        assert stream.output_ids == generate_alone(reference, prompt, max_tokens)
    assert checked.max_used <= engine.scheduler.kv.total_blocks
    assert engine.scheduler.kv.used_blocks == 0


async def test_whole_answer_requests_get_every_token_in_two_hand_overs(make_engine, reference, runner) -> None:  # type: ignore[no-untyped-def]
    # Preemption is certain (as above); the callers want only the final answer (incremental=False).
    engine, _ = await make_engine(seqs=6, tokens=64, kv_tokens=96, block=8)
    handed: dict[int, int] = {}
    deliver = engine._deliver

    def counting(update, sampled, now):  # type: ignore[no-untyped-def]
        handed[update.seq.seq_id] = handed.get(update.seq.seq_id, 0) + 1
        deliver(update, sampled, now)

    engine._deliver = counting  # type: ignore[method-assign]
    rng = random.Random(12)
    work = [([rng.choice(VOCAB) for _ in range(rng.randint(20, 30))], 24) for _ in range(6)]
    streams = [engine.submit(p, SamplingParams(max_tokens=m), incremental=False) for p, m in work]
    async with asyncio.timeout(60):
        events = await asyncio.gather(*(collect(s) for s in streams))
    assert engine.scheduler.preemptions > 0
    for (prompt, max_tokens), stream, got in zip(work, streams, events, strict=True):
        assert stream.output_ids == generate_alone(reference, prompt, max_tokens)
        assert stream.text == runner.codec.decode(stream.output_ids)
        assert len(got) == 1 and got[0].finish_reason is not None  # one event: the end
        # Handed to the event loop twice: the first token (time to first token) and the last.
        assert handed[stream.seq_id] == min(2, len(stream.output_ids))
    assert max(len(s.output_ids) for s in streams) > 2


async def test_cancellation_frees_a_slot_for_a_waiting_request(make_engine) -> None:  # type: ignore[no-untyped-def]
    engine, checked = await make_engine(seqs=2, tokens=64)
    long = [engine.submit([9, 10], SamplingParams(max_tokens=200, ignore_eos=True)) for _ in range(2)]
    waiting = engine.submit([11, 12], SamplingParams(max_tokens=3, ignore_eos=True))
    await checked.wait_until(lambda: checked.steps >= 3)
    assert engine.num_running == 2 and engine.num_waiting == 1
    long[0].cancel()
    async with asyncio.timeout(30):
        events = await collect(waiting)
    assert events[-1].finish_reason is FinishReason.LENGTH
    assert len(waiting.output_ids) == 3
    assert engine.num_running == 1  # the other long one is still going
    long[1].cancel()
    async with asyncio.timeout(30):
        await engine.drain(30)  # the driver reports quiet after its last update
    assert not engine.scheduler.has_work()
    assert engine.scheduler.kv.used_blocks == 0


async def test_randomized_load_stays_within_the_cache_budget(make_engine) -> None:  # type: ignore[no-untyped-def]
    engine, checked = await make_engine(seqs=5, tokens=24, kv_tokens=160, block=8)
    rng = random.Random(5)
    streams = []
    for _ in range(20):
        prompt = [rng.choice(VOCAB) for _ in range(rng.randint(1, 50))]
        params = SamplingParams(
            max_tokens=rng.randint(1, 30), temperature=rng.choice([0.0, 0.8]), seed=rng.randint(0, 9)
        )
        streams.append(engine.submit(prompt, params, priority=1))
    tasks = [asyncio.create_task(collect(s)) for s in streams]
    for index in rng.sample(range(20), 5):
        await asyncio.sleep(0)
        streams[index].cancel()
    async with asyncio.timeout(60):
        await asyncio.gather(*tasks, return_exceptions=True)
        await engine.drain(30)  # the driver reports quiet after its last update
    assert not engine.scheduler.has_work()
    assert checked.max_used <= engine.scheduler.kv.total_blocks
    assert engine.scheduler.kv.used_blocks == 0
    assert engine.num_running == 0 and engine.num_waiting == 0


async def test_seeded_sampling_is_reproducible(make_engine) -> None:  # type: ignore[no-untyped-def]
    engine, _ = await make_engine()
    params = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, top_k=20, seed=42, ignore_eos=True)
    a = engine.submit([9, 10, 11], params)
    b = engine.submit([9, 10, 11], params)
    c = engine.submit([9, 10, 11], SamplingParams(max_tokens=12, temperature=1.0, seed=7, ignore_eos=True))
    async with asyncio.timeout(30):
        await asyncio.gather(collect(a), collect(b), collect(c))
    assert a.output_ids == b.output_ids
    assert a.output_ids != c.output_ids


async def test_stop_strings_and_rejections(make_engine, runner: CausalLMRunner) -> None:  # type: ignore[no-untyped-def]
    engine, _ = await make_engine()
    first = engine.submit([9, 10, 11], SamplingParams(max_tokens=10, ignore_eos=True))
    await collect(first)
    words = first.text.split()
    stop = words[min(2, len(words) - 1)]
    again = engine.submit([9, 10, 11], SamplingParams(max_tokens=10, ignore_eos=True, stop=(stop,)))
    events = await collect(again)
    assert events[-1].finish_reason is FinishReason.STOP
    assert stop not in again.text and first.text.startswith(again.text)
    with pytest.raises(InvalidInput):
        engine.submit(list(range(7, 70)) * 9, SamplingParams(max_tokens=1))


async def test_prompts_prefilled_together_match_generate(make_engine, reference) -> None:  # type: ignore[no-untyped-def]
    # Five prompts of different lengths admitted in one step: prefilled in left-padded forwards of
    # similar lengths (150 and 140 together; 12, 9 and 1 together), each must match generate alone.
    lengths = (9, 150, 12, 1, 140)
    assert similar_widths(sorted(lengths, reverse=True), 0, 5) == [(0, 2), (2, 5)]
    engine, checked = await make_engine(seqs=8, tokens=512)
    rng = random.Random(21)
    work = [([rng.choice(VOCAB) for _ in range(n)], 12) for n in lengths]
    streams = [engine.submit(p, SamplingParams(max_tokens=m)) for p, m in work]
    async with asyncio.timeout(60):
        await asyncio.gather(*(collect(s) for s in streams))
    first = checked.plans[0]
    assert sum(1 for c in first.chunks if c.start == 0) == 5
    for (prompt, max_tokens), stream in zip(work, streams, strict=True):
        assert stream.output_ids == generate_alone(reference, prompt, max_tokens)


async def test_decode_rows_attend_over_only_the_key_columns_they_need(make_engine, reference, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Rows of very different lengths decode in one batch, longest first, and ranges of shorter rows
    attend over fewer key columns (forced here, where it would not pay); each sequence must still
    match generate alone."""
    monkeypatch.setattr(row_groups, "MIN_SAVED_KEY_SLOTS", 0)
    used: list[list[tuple[int, int]]] = []

    def recorded(lengths: list[int]) -> list[tuple[int, int]]:
        ranges = row_ranges(lengths)
        used.append(ranges)
        return ranges

    monkeypatch.setattr(row_groups, "row_ranges", recorded)
    lengths = (9, 150, 12, 1, 140, 60)
    engine, checked = await make_engine(seqs=8, tokens=512)
    rng = random.Random(5)
    work = [([rng.choice(VOCAB) for _ in range(n)], 10 + n % 7) for n in lengths]
    streams = [engine.submit(p, SamplingParams(max_tokens=m)) for p, m in work]
    async with asyncio.timeout(60):
        await asyncio.gather(*(collect(s) for s in streams))
    assert sum(1 for c in checked.plans[0].chunks if c.start == 0) == len(lengths)  # one decode batch
    assert any(len(ranges) > 1 for ranges in used)
    for (prompt, max_tokens), stream in zip(work, streams, strict=True):
        assert stream.output_ids == generate_alone(reference, prompt, max_tokens), f"prompt of {len(prompt)}"


def test_decode_row_ranges_split_where_padding_would_waste_enough() -> None:
    # Longest first; a departed row (0) inside a range does not split it.
    lengths = [500] * 10 + [0] + [470] * 9 + [60] * 20
    assert row_ranges(lengths) == [(0, 20), (20, 40)]
    assert row_ranges([100, 99, 98]) == [(0, 3)]  # nothing to gain: one range


def test_rows_that_keep_their_order_move_as_runs() -> None:
    # Old rows 0-3 stay in order around two joining rows (new positions 2 and 5): two slice copies.
    assert _runs([(0, 0), (1, 1), (3, 2), (4, 3)]) == [(0, 0, 2), (3, 2, 2)]
    assert _runs([(0, 0), (1, 2), (2, 3)]) == [(0, 0, 1), (1, 2, 2)]  # a departed row 1 between
    assert _runs([]) == []


def test_prompts_are_grouped_only_where_padding_would_waste_enough() -> None:
    assert similar_widths([100, 98, 97, 95], 0, 4) == [(0, 4)]  # little padding: one forward
    assert similar_widths([40, 29, 17, 3, 1], 0, 5) == [(0, 5)]  # too few slots saved to pay a forward
    assert similar_widths([256, 250, 240, 30, 20, 16], 0, 6) == [(0, 3), (3, 6)]
    groups = similar_widths([256, 250, 250, 250, 128, 120, 120, 120, 16, 15, 15, 15], 0, 12)
    assert groups == [(0, 4), (4, 8), (8, 12)]


async def test_drain_waits_for_running_sequences(make_engine) -> None:  # type: ignore[no-untyped-def]
    engine, _ = await make_engine()
    stream = engine.submit([9, 10, 11], SamplingParams(max_tokens=30, ignore_eos=True))
    async with asyncio.timeout(30):
        await engine.drain(30)
    assert stream.finish_reason is FinishReason.LENGTH and len(stream.output_ids) == 30


class FailsOnce:
    """The real runner, except that its first step with work raises."""

    def __init__(self, inner: CausalLMRunner) -> None:
        self.inner = inner
        self.failed = False

    def reset(self) -> None:
        self.inner.reset()

    def run_step(self, plan: StepPlan) -> dict[int, Sampled]:
        if plan.chunks and not self.failed:
            self.failed = True
            raise RuntimeError("injected by the test")
        return self.inner.run_step(plan)


async def test_a_failing_step_fails_its_sequences_and_the_engine_keeps_serving(runner: CausalLMRunner) -> None:
    scheduler = StepScheduler(
        SchedulerSettings(4, 64, max_model_len=512, eos_token_id=runner.codec.eos_token_id),
        KVBudget(4096 * runner.kv_bytes_per_token, runner.kv_bytes_per_token, 16),
    )
    failing = FailsOnce(runner)
    engine = Engine(failing, scheduler, runner.codec, MonotonicClock())
    await engine.start()
    try:
        doomed = engine.submit([9, 10, 11], SamplingParams(max_tokens=4, ignore_eos=True))
        with pytest.raises(InternalError, match="the model failed: RuntimeError"):
            await asyncio.wait_for(collect(doomed), 30)
        assert failing.failed
        fine = engine.submit([9, 10, 11], SamplingParams(max_tokens=4, ignore_eos=True))
        events = await asyncio.wait_for(collect(fine), 30)
        assert events[-1].finish_reason is FinishReason.LENGTH
        assert len(fine.output_ids) == 4
        await engine.drain(30)
        assert not scheduler.has_work()
        assert scheduler.kv.used_blocks == 0
    finally:
        await engine.aclose()
