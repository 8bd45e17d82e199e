"""Continuous batching vs static batching on the same model and the same 100 requests.

Static: what a naive server does. Requests are taken 32 at a time in arrival order, left-padded
to the longest prompt, and run through ``transformers.generate`` until the longest output of the
batch is done; every request of a batch is answered when the batch ends.

Continuous, two ways: the engine in this process (scheduler and model steps, no HTTP), and the
same requests all sent at once over HTTP to ``tensorgate serve`` (OpenAI ``/v1/completions``);
the server's time to first token comes from its own histogram on /metrics.

Both force each request's exact output length (no EOS: ``ignore_eos`` for the server,
``min_new_tokens`` for ``generate``), greedy decoding. Model: a random-weight Llama built here
(no downloads). Writes ``benchmarks/out/bench_llm_continuous.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import torch
from transformers import AutoModelForCausalLM, GenerationConfig, LogitsProcessor, LogitsProcessorList

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "llm"))

from llm_model_factory import build_model  # noqa: E402

from tensorgate.bench.http_client import HttpConnection, encode_request  # noqa: E402
from tensorgate.testing import ServerProcess  # noqa: E402

MODEL_VOCAB = 74  # the word-level tokenizer trained on tests/llm/data/corpus.txt
# Why this shape: on CPU a decode step's cost is mostly per-step work (framework calls per layer,
# plus attention over every cached position), so the regime where batching many sequences pays
# is a model whose per-step cost is not dominated by per-row arithmetic, the same regime as a GPU
# whose decode step is bound by reading the weights once per step. Larger shapes are options
# (--hidden, --layers, ...): the ratio falls as per-row work dominates (see the report).
MODEL = {"hidden": 32, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate": 96, "max_positions": 1024}


def workload(n: int, seed: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(7, 70) for _ in range(rng.randint(16, 256))], rng.randint(16, 256)) for _ in range(n)]


class _FirstToken(LogitsProcessor):
    """Records when ``generate`` produced its first token (its logits are processed once per step)."""

    def __init__(self) -> None:
        self.at: float | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.at is None:
            self.at = time.perf_counter()
        return scores


def run_static(model_dir: Path, work: list[tuple[list[int], int]], batch_size: int) -> dict[str, Any]:
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
    return _summary(time.perf_counter() - started, len(work), generated, latencies, ttfts)


async def _one(
    connection: HttpConnection, host: str, prompt: list[int], max_tokens: int, t0: float
) -> tuple[float, int]:
    body = {"model": "bench", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    raw = encode_request(
        "POST", host, "/v1/completions", json.dumps(body).encode(), (("Content-Type", "application/json"),)
    )
    response = await connection.request(raw)
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {response.body[:200]!r}")
    return time.perf_counter() - t0, int(json.loads(response.body)["usage"]["completion_tokens"])


def _ttft_sum_count(metrics_url: str) -> tuple[float, float]:
    """The server's own time-to-first-token histogram (admission to first token), sum and count."""
    total = count = 0.0
    for line in httpx.get(metrics_url, timeout=30).text.splitlines():
        if line.startswith("tensorgate_time_to_first_token_seconds_sum{"):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith("tensorgate_time_to_first_token_seconds_count{"):
            count = float(line.rsplit(" ", 1)[1])
    return total, count


async def _continuous_async(server: ServerProcess, work: list[tuple[list[int], int]]) -> dict[str, Any]:
    # tensorgate's own load-generator client (~30 us of CPU per request), one connection per
    # request: on this 2-core host httpx spent ~5 ms of CPU per request, taken from the server.
    host, port = server.http_address.rsplit(":", 1)
    connections = [HttpConnection(host, int(port)) for _ in work]
    try:
        await _one(connections[0], host, [9, 10, 11], 4, time.perf_counter())  # code paths warm
        before = _ttft_sum_count(server.metrics_url)
        t0 = time.perf_counter()
        results = await asyncio.gather(*(_one(c, host, p, m, t0) for c, (p, m) in zip(connections, work, strict=True)))
        elapsed = time.perf_counter() - t0
    finally:
        for connection in connections:
            connection.close()
    after = _ttft_sum_count(server.metrics_url)
    ttft = (after[0] - before[0]) / max(1.0, after[1] - before[1])
    generated = sum(r[1] for r in results)
    assert generated == sum(m for _, m in work), "the server generated a different number of tokens"
    return _summary(elapsed, len(work), generated, [r[0] for r in results], [ttft])


def _engine_runner(model_dir: Path, threads: int) -> Any:
    from tensorgate.backends.base import Device
    from tensorgate.backends.llm_backend import CausalLMRunner

    runner = CausalLMRunner()
    runner.load(model_dir, Device(), threads=threads)
    return runner


def run_engine(runner: Any, work: list[tuple[list[int], int]], args: argparse.Namespace) -> dict[str, Any]:
    """The engine in this process, without HTTP: the scheduler and model steps alone."""
    from prometheus_client import CollectorRegistry

    from tensorgate.backends.llm_step import SamplingParams
    from tensorgate.clock import MonotonicClock
    from tensorgate.observability.generation_metrics import GenerationMetrics
    from tensorgate.scheduling.continuous.engine import Engine, collect
    from tensorgate.scheduling.continuous.kv_budget import KVBudget
    from tensorgate.scheduling.continuous.step_scheduler import SchedulerSettings, StepScheduler

    codec = runner.codec
    registry = CollectorRegistry()
    metrics = GenerationMetrics(registry).for_version("bench", 1)

    async def go() -> dict[str, Any]:
        settings = SchedulerSettings(
            args.max_num_seqs, args.max_num_batched_tokens, 1024, max_waiting=1024, eos_token_id=codec.eos_token_id
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
        return _summary(elapsed, len(work), generated, list(latencies), [total / count])

    return asyncio.run(go())


def _median(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median wall time (its figures stay consistent with each other)."""
    ordered = sorted(results, key=lambda r: r["elapsed_s"])
    return ordered[len(ordered) // 2]


def _summary(
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--static-batch", type=int, default=32)
    parser.add_argument("--max-num-seqs", type=int, default=128)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=9)
    for key in MODEL:
        parser.add_argument(f"--{key.replace('_', '-')}", type=int, default=MODEL[key], help="model shape")
    # One intra-op thread for both sides: on a shared 2-core host, torch's spinning OpenMP threads
    # lose badly to any other load (measured here: a 2-thread decode step ran 10-30x slower than a
    # 1-thread one while other processes were busy), which would make either side's numbers noise.
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    MODEL.update({key: getattr(args, key) for key in MODEL})
    work = workload(args.requests, args.seed)
    with tempfile.TemporaryDirectory(prefix="bench-llm-") as tmp:
        repo = Path(tmp)
        model_dir = build_model(repo / "bench" / "1", **MODEL)
        (repo / "bench" / "config.yaml").write_text(
            "backend: llm\nllm:\n"
            f"  max_num_seqs: {args.max_num_seqs}\n"
            f"  max_num_batched_tokens: {args.max_num_batched_tokens}\n"
            "  kv_cache_bytes: 1073741824\n"
            "  max_model_len: 1024\n"
            "  max_waiting: 1024\n"
            f"  threads: {args.threads}\n"
        )
        params = sum(t.numel() for t in AutoModelForCausalLM.from_pretrained(model_dir).parameters())
        print(f"model: Llama, {MODEL['layers']} layers, hidden {MODEL['hidden']}, {params:,} parameters")
        # Rounds alternate the three modes and each figure is the median round: the host is shared,
        # and a burst of someone else's load during one mode would otherwise decide the ratio.
        rounds: dict[str, list[dict[str, Any]]] = {"static": [], "engine": [], "http": []}
        runner = _engine_runner(model_dir, args.threads)
        env = {"OMP_NUM_THREADS": str(args.threads)}
        with ServerProcess(
            "--model-repository", str(repo), "--log-level", "warning", ready_timeout_s=120, env=env
        ) as server:
            for index in range(args.rounds):
                rounds["static"].append(run_static(model_dir, work, args.static_batch))
                rounds["engine"].append(run_engine(runner, work, args))
                rounds["http"].append(asyncio.run(_continuous_async(server, work)))
                print(
                    f"round {index + 1}: static {rounds['static'][-1]['elapsed_s']:.2f} s, engine "
                    f"{rounds['engine'][-1]['elapsed_s']:.2f} s, HTTP {rounds['http'][-1]['elapsed_s']:.2f} s",
                    flush=True,
                )
            rounds["static"].append(run_static(model_dir, work, args.static_batch))  # closes the last round
        static, engine, continuous = (_median(rounds[k]) for k in ("static", "engine", "http"))
    report(args, params, static, engine, continuous, work, rounds)


def report(
    args: argparse.Namespace,
    params: int,
    static: dict[str, Any],
    engine: dict[str, Any],
    cont: dict[str, Any],
    work: list[Any],
    rounds: dict[str, list[dict[str, Any]]],
) -> None:
    rows = [
        (f"static batching (transformers generate, batches of {args.static_batch})", static),
        ("continuous batching (tensorgate engine, in-process)", engine),
        ("continuous batching (tensorgate serve, HTTP /v1/completions)", cont),
    ]
    header = "| mode | req/s | generated tok/s | mean latency s | P99 latency s | mean TTFT s | wall s |"
    lines = [header, "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in rows:
        lines.append(
            f"| {name} | {r['req_s']:.2f} | {r['tok_s']:.0f} | {r['mean_s']:.2f} | {r['p99_s']:.2f} | "
            f"{r['ttft_s']:.2f} | {r['elapsed_s']:.1f} |"
        )
    # Each round's continuous runs against the mean of the static runs right before and right after
    # them: this host's speed moves by a third within a minute, so a ratio of two medians can pair a
    # quiet moment with a busy one, and one neighbour alone carries the drift of the seconds between.
    around = [
        statistics.fmean([before["tok_s"], after["tok_s"]])
        for before, after in zip(rounds["static"], rounds["static"][1:], strict=False)
    ]
    per_round = {
        mode: [r["tok_s"] / s for r, s in zip(rounds[mode], around, strict=True)] for mode in ("http", "engine")
    }
    ratio = statistics.median(per_round["http"])
    engine_ratio = statistics.median(per_round["engine"])
    prompt_tokens = sum(len(p) for p, _ in work)
    out_tokens = sum(m for _, m in work)
    text = "\n".join(
        [
            "## Continuous vs static batching (text generation)",
            "",
            f"{args.requests} concurrent requests, prompts 16-256 tokens ({prompt_tokens} in all), outputs 16-256 "
            f"tokens ({out_tokens} in all), greedy, lengths forced. Model: random-weight Llama, {MODEL['layers']} "
            f"layers, hidden {MODEL['hidden']}, {MODEL['heads']} heads ({MODEL['kv_heads']} KV heads), "
            f"{params:,} parameters (vocabulary of {MODEL_VOCAB} words), float32 on CPU. "
            f"Engine: max_num_seqs {args.max_num_seqs}, "
            f"max_num_batched_tokens {args.max_num_batched_tokens}. "
            f"torch intra-op threads: {args.threads} on both sides.",
            "",
            *lines,
            "",
            f"Throughput ratio over HTTP (continuous / static): **{ratio:.2f}x**; in-process engine: "
            f"**{engine_ratio:.2f}x** (bar: 2.9x). Mean latency {cont['mean_s']:.2f} s (HTTP) and "
            f"{engine['mean_s']:.2f} s (in-process) vs {static['mean_s']:.2f} s static.",
            "",
            f"Rows: the median of {args.rounds} rounds, each running the three modes in turn, and one more "
            "static run after the last. Ratios: the median over rounds of each round's own ratio (continuous / "
            "the mean of the static runs just before and just after it); per "
            f"round, HTTP: {', '.join(f'{r:.2f}x' for r in per_round['http'])}; in-process: "
            f"{', '.join(f'{r:.2f}x' for r in per_round['engine'])}.",
            "",
            "Static latency counts from the moment all requests are ready (each request is answered when its "
            "batch ends); static TTFT is when its batch produced its first token. Server TTFT is the server's own "
            "`tensorgate_time_to_first_token_seconds` histogram (admission to first token), read from /metrics.",
            "",
        ]
    )
    print(text)
    out = HERE / "out"
    out.mkdir(exist_ok=True)
    (out / "bench_llm_continuous.md").write_text(text)


if __name__ == "__main__":
    main()
