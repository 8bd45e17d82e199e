"""What the text-generation benchmarks share: the workload, static batching with ``generate``,
continuous batching over HTTP, and the summary of a run.

Static: what a naive server does. Requests are taken ``batch_size`` at a time in arrival order,
left-padded to the longest prompt, and run through ``transformers.generate`` until the longest
output of the batch is done; every request of a batch is answered when the batch ends. Both
sides force each request's exact output length (no EOS: ``ignore_eos`` for the server,
``min_new_tokens`` for ``generate``), greedy decoding.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import torch
from transformers import AutoModelForCausalLM, GenerationConfig, LogitsProcessor, LogitsProcessorList

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "llm"))

from tensorgate.bench.http_client import HttpConnection, encode_request  # noqa: E402
from tensorgate.testing import ServerProcess  # noqa: E402

Work = list[tuple[list[int], int]]  # (prompt token ids, output length) per request


def workload(n: int, seed: int, vocab: int) -> Work:
    """Prompts of 16-256 tokens (ids past the tokenizer's special tokens), outputs of 16-256."""
    rng = random.Random(seed)
    return [([rng.randrange(7, vocab) for _ in range(rng.randint(16, 256))], rng.randint(16, 256)) for _ in range(n)]


class _FirstToken(LogitsProcessor):
    """Records when ``generate`` produced its first token (its logits are processed once per step)."""

    def __init__(self) -> None:
        self.at: float | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.at is None:
            self.at = time.perf_counter()
        return scores


def run_static(model_dir: Path, work: Work, batch_size: int) -> dict[str, Any]:
    """Static batching with ``transformers.generate``, the model's own forward."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, use_safetensors=True).eval()
    pad = model.generation_config.pad_token_id
    latencies, ttfts = [], []
    generated = 0
    started = time.perf_counter()
    for first in range(0, len(work), batch_size):
        batch = work[first : first + batch_size]
        width = max(len(p) for p, _ in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p, _ in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in batch])
        longest = max(m for _, m in batch)
        marker = _FirstToken()
        config = GenerationConfig(
            max_new_tokens=longest, min_new_tokens=longest, do_sample=False, pad_token_id=pad, eos_token_id=None
        )
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                generation_config=config,
                logits_processor=LogitsProcessorList([marker]),
            )
        done = time.perf_counter()
        assert out.shape[1] == width + longest
        for _, m in batch:
            generated += m  # a naive server truncates each answer to what was asked
            latencies.append(done - started)
            ttfts.append((marker.at or done) - started)
    return summary(time.perf_counter() - started, len(work), generated, latencies, ttfts)


async def _one(
    connection: HttpConnection, host: str, model: str, prompt: list[int], max_tokens: int, t0: float
) -> tuple[float, int]:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    raw = encode_request(
        "POST", host, "/v1/completions", json.dumps(body).encode(), (("Content-Type", "application/json"),)
    )
    response = await connection.request(raw)
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {response.body[:200]!r}")
    return time.perf_counter() - t0, int(json.loads(response.body)["usage"]["completion_tokens"])


def _ttft_sum_count(metrics_url: str, model: str) -> tuple[float, float]:
    """The server's own time-to-first-token histogram (admission to first token) of ``model``: sum, count."""
    total = count = 0.0
    label = f'model="{model}"'
    for line in httpx.get(metrics_url, timeout=30).text.splitlines():
        if label not in line:
            continue
        if line.startswith("tensorgate_time_to_first_token_seconds_sum{"):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith("tensorgate_time_to_first_token_seconds_count{"):
            count = float(line.rsplit(" ", 1)[1])
    return total, count


def run_http(server: ServerProcess, work: Work, model: str) -> dict[str, Any]:
    """Every request of ``work`` sent at once to ``tensorgate serve`` (``/v1/completions``)."""
    return asyncio.run(_continuous_async(server, work, model))


async def _continuous_async(server: ServerProcess, work: Work, model: str) -> dict[str, Any]:
    # tensorgate's own load-generator client (~30 us of CPU per request), one connection per
    # request: on this 2-core host httpx spent ~5 ms of CPU per request, taken from the server.
    host, port = server.http_address.rsplit(":", 1)
    connections = [HttpConnection(host, int(port)) for _ in work]
    try:
        await _one(connections[0], host, model, [9, 10, 11], 4, time.perf_counter())  # code paths warm
        before = _ttft_sum_count(server.metrics_url, model)
        t0 = time.perf_counter()
        sent = (_one(c, host, model, p, m, t0) for c, (p, m) in zip(connections, work, strict=True))
        results = await asyncio.gather(*sent)
        elapsed = time.perf_counter() - t0
    finally:
        for connection in connections:
            connection.close()
    after = _ttft_sum_count(server.metrics_url, model)
    ttft = (after[0] - before[0]) / max(1.0, after[1] - before[1])
    generated = sum(r[1] for r in results)
    assert generated == sum(m for _, m in work), "the server generated a different number of tokens"
    return summary(elapsed, len(work), generated, [r[0] for r in results], [ttft])


def engine_runner(model_dir: Path, threads: int, lean: bool = True) -> Any:
    """The ``llm`` backend's runner over ``model_dir``, in this process."""
    from tensorgate.backends.base import Device
    from tensorgate.backends.llm.runner import load_causal_lm

    return load_causal_lm(model_dir, Device(), threads=threads, lean=lean)


def run_engine(runner: Any, work: Work, max_num_seqs: int, max_num_batched_tokens: int) -> dict[str, Any]:
    """The engine in this process, without HTTP: the scheduler and model steps alone."""
    from prometheus_client import CollectorRegistry

    from tensorgate.clock import MonotonicClock
    from tensorgate.generation import SamplingParams, collect
    from tensorgate.observability.generation_metrics import GenerationMetrics
    from tensorgate.scheduling.continuous.engine import Engine
    from tensorgate.scheduling.continuous.kv_budget import KVBudget
    from tensorgate.scheduling.continuous.step_scheduler import SchedulerSettings, StepScheduler

    codec = runner.codec
    registry = CollectorRegistry()
    metrics = GenerationMetrics(registry).for_version("bench", 1)

    async def go() -> dict[str, Any]:
        settings = SchedulerSettings(
            max_num_seqs, max_num_batched_tokens, 1024, max_waiting=1024, eos_token_id=codec.eos_token_id
        )
        scheduler = StepScheduler(settings, KVBudget(1 << 30, runner.kv_bytes_per_token, 16))
        engine = Engine(runner, scheduler, codec, MonotonicClock(), metrics)
        await engine.start()
        t0 = time.perf_counter()
        streams = [engine.submit(p, SamplingParams(max_tokens=m, ignore_eos=True), incremental=False) for p, m in work]

        async def finish(stream: Any) -> float:
            await collect(stream)
            return time.perf_counter() - t0

        latencies = await asyncio.gather(*(finish(s) for s in streams))
        elapsed = time.perf_counter() - t0
        generated = sum(len(s.output_ids) for s in streams)
        await engine.aclose()
        labels = {"model": "bench", "version": "1"}
        total = registry.get_sample_value("tensorgate_time_to_first_token_seconds_sum", labels) or 0.0
        count = registry.get_sample_value("tensorgate_time_to_first_token_seconds_count", labels) or 1.0
        return summary(elapsed, len(work), generated, list(latencies), [total / count])

    return asyncio.run(go())


def median_round(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median wall time (its figures stay consistent with each other)."""
    ordered = sorted(results, key=lambda r: r["elapsed_s"])
    return ordered[len(ordered) // 2]


def summary(
    elapsed: float, requests: int, generated: int, latencies: list[float], ttfts: list[float]
) -> dict[str, Any]:
    ordered = sorted(latencies)
    return {
        "elapsed_s": elapsed,
        "req_s": requests / elapsed,
        "tok_s": generated / elapsed,
        "mean_s": statistics.fmean(latencies),
        "p99_s": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "ttft_s": statistics.fmean(ttfts),
    }


def round_ratios(static: list[dict[str, Any]], continuous: list[dict[str, Any]]) -> list[float]:
    """Each round's continuous tokens/s over the mean of the static runs right before and right after
    it (``static`` has one run more than ``continuous``): this host's speed moves by a third within a
    minute, so a ratio of two medians can pair a quiet moment with a busy one, and one neighbour
    alone carries the drift of the seconds between."""
    around = [statistics.fmean([b["tok_s"], a["tok_s"]]) for b, a in itertools.pairwise(static)]
    return [r["tok_s"] / s for r, s in zip(continuous, around, strict=True)]
