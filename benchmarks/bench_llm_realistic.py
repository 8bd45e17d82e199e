"""The text-generation engine on a model of realistic shape for this CPU, with and without the lean forward.

``bench_llm_continuous.py`` measures a 29k-parameter model, whose decode step is all framework
overhead. Here the model is a random-weight Llama of 4 layers, hidden size 256 and a vocabulary of
8,192 words (about 7 M parameters, 28 MB of float32 weights: more than this CPU's caches, so a
decode step is bound by reading the weights, as on a GPU). Two parts, one server:

1. Continuous against static batching on the same 100 requests as the small benchmark:
   ``transformers.generate`` on batches of 32, the engine in this process, and ``tensorgate
   serve`` over HTTP, once with the lean forward (``llm.lean_forward: true``, the default) and
   once with transformers' own forward (``false``).
2. Time to first token and time per output token at 1, 16 and 64 concurrent streams
   (``stream: true``, prompts of 128 tokens, 64 tokens out), measured by the client from the
   server-sent events, for both forwards.

Writes ``benchmarks/out/bench_llm_realistic.md``. ``--quick`` (16 requests, one round, 1 and 4
streams) checks the script end to end; its figures are not the measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _generation import (
    HERE,
    engine_runner,
    median_round,
    round_ratios,
    run_engine,
    run_http,
    run_static,
    workload,
)
from llm_model_factory import build_model
from transformers import AutoModelForCausalLM

from tensorgate.bench.http_client import HttpConnection, encode_request
from tensorgate.bench.targets.openai import event_text
from tensorgate.bench.targets.sse import SseParser
from tensorgate.testing import ServerProcess

# A small model of the usual proportions: 4 query heads sharing 2 key/value heads, an MLP of
# about 2.7 times the hidden size, and the usual initializer (logits are not peaked: lengths are
# forced, so greedy ties do not matter).
MODEL = {
    "hidden": 256,
    "layers": 4,
    "heads": 4,
    "kv_heads": 2,
    "intermediate": 688,
    "max_positions": 1024,
    "vocab": 8192,
    "initializer_range": 0.02,
}
FORWARDS = {"lean": True, "plain": False}  # model name in the repository -> llm.lean_forward
STREAMS = (1, 16, 64)
STREAM_PROMPT, STREAM_OUTPUT = 128, 64
# The bar: continuous batching over HTTP at least this many times static
# batching's tokens/s, with a lower mean latency.
BAR_OVER_STATIC = 2.9


def write_repository(repo: Path, args: argparse.Namespace) -> Path:
    """The same weights twice, as ``lean`` and ``plain``, differing only in ``llm.lean_forward``."""
    model_dir = build_model(repo / "lean" / "1", **MODEL)
    shutil.copytree(model_dir, repo / "plain" / "1")
    for name, lean in FORWARDS.items():
        (repo / name / "config.yaml").write_text(
            "backend: llm\nllm:\n"
            f"  max_num_seqs: {args.max_num_seqs}\n"
            f"  max_num_batched_tokens: {args.max_num_batched_tokens}\n"
            "  kv_cache_bytes: 1073741824\n"
            "  max_model_len: 1024\n"
            "  max_waiting: 1024\n"
            f"  threads: {args.threads}\n"
            f"  lean_forward: {str(lean).lower()}\n"
        )
    return model_dir


async def _stream_one(host: str, port: int, model: str, prompt: list[int]) -> tuple[float, float, int]:
    """One streamed completion: (time to first token, mean time per output token after it, tokens)."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": STREAM_OUTPUT,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    headers = (("Content-Type", "application/json"), ("Accept", "text/event-stream"))
    raw = encode_request("POST", f"{host}:{port}", "/v1/completions", json.dumps(body).encode(), headers)
    parser, times = SseParser(), []

    def on_body(chunk: bytes) -> None:
        times.extend(time.perf_counter() for payload in parser.feed(chunk) if event_text(payload, False) is not None)

    connection = HttpConnection(host, port)
    try:
        started = time.perf_counter()
        response = await connection.request(raw, on_body)
    finally:
        connection.close()
    if response.status != 200 or len(times) < 2:
        raise RuntimeError(f"stream to {model}: HTTP {response.status}, {len(times)} token events")
    return times[0] - started, (times[-1] - times[0]) / (len(times) - 1), len(times)


def run_streams(server: ServerProcess, model: str, streams: int, requests: int, seed: int) -> dict[str, float]:
    """``requests`` streamed completions, ``streams`` at a time (waves that start together)."""
    host, port = server.http_address.rsplit(":", 1)
    rng = random.Random(seed)

    async def go() -> tuple[list[tuple[float, float, int]], float]:
        await _stream_one(host, int(port), model, [9, 10, 11])  # code paths warm
        results: list[tuple[float, float, int]] = []
        t0 = time.perf_counter()
        for _ in range(0, requests, streams):
            prompts = [[rng.randrange(7, MODEL["vocab"]) for _ in range(STREAM_PROMPT)] for _ in range(streams)]
            results += await asyncio.gather(*(_stream_one(host, int(port), model, p) for p in prompts))
        return results, time.perf_counter() - t0

    results, elapsed = asyncio.run(go())
    ttfts = sorted(r[0] for r in results)
    return {
        "ttft_p50_s": statistics.median(ttfts),
        "ttft_max_s": ttfts[-1],
        "tpot_s": statistics.fmean(r[1] for r in results),
        "tok_s": sum(r[2] for r in results) / elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--static-batch", type=int, default=32)
    parser.add_argument("--max-num-seqs", type=int, default=128)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3)
    # One intra-op thread on every side, as in bench_llm_continuous.py (spinning OpenMP threads on a
    # shared 2-core host make any side's figures noise).
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="16 requests, one round, 1 and 4 streams: a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.rounds, args.static_batch = 16, 1, 8
    levels = (1, 4) if args.quick else STREAMS
    torch.set_num_threads(args.threads)
    work = workload(args.requests, args.seed, MODEL["vocab"])
    modes = ("engine", *FORWARDS)
    rounds: dict[str, list[dict[str, Any]]] = {"static": [], **{mode: [] for mode in modes}}
    streams: dict[tuple[str, int], dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-llm-realistic-") as tmp:
        repo = Path(tmp)
        model_dir = write_repository(repo, args)
        params = sum(t.numel() for t in AutoModelForCausalLM.from_pretrained(model_dir).parameters())
        print(f"model: Llama, {MODEL['layers']} layers, hidden {MODEL['hidden']}, {params:,} parameters", flush=True)
        runner = engine_runner(model_dir, args.threads, lean=True)
        env = {"OMP_NUM_THREADS": str(args.threads)}
        with ServerProcess(
            "--model-repository", str(repo), "--log-level", "warning", ready_timeout_s=180, env=env
        ) as server:
            # Rounds alternate the modes; each figure is the median round (see round_ratios).
            for index in range(args.rounds):
                rounds["static"].append(run_static(model_dir, work, args.static_batch))
                rounds["engine"].append(run_engine(runner, work, args.max_num_seqs, args.max_num_batched_tokens))
                for name in FORWARDS:
                    rounds[name].append(run_http(server, work, name))
                print(f"round {index + 1}: " + ", ".join(f"{m} {rounds[m][-1]['elapsed_s']:.1f} s" for m in rounds))
            rounds["static"].append(run_static(model_dir, work, args.static_batch))  # closes the last round
            for count in levels:
                for name in FORWARDS:  # the two forwards back to back at each level, so drift hits both alike
                    streams[name, count] = run_streams(server, name, count, max(8, count), args.seed + count)
                    print(f"{count} streams, {name}: {streams[name, count]}", flush=True)
    report(args, params, rounds, streams, levels)


def report(
    args: argparse.Namespace,
    params: int,
    rounds: dict[str, list[dict[str, Any]]],
    streams: dict[tuple[str, int], dict[str, float]],
    levels: tuple[int, ...],
) -> None:
    names = {
        "static": f"static batching (transformers generate, batches of {args.static_batch})",
        "engine": "continuous batching (tensorgate engine, in-process, lean forward)",
        "lean": "continuous batching (tensorgate serve, HTTP, lean forward)",
        "plain": "continuous batching (tensorgate serve, HTTP, transformers' forward)",
    }
    lines = [
        "| mode | req/s | generated tok/s | mean latency s | P99 latency s | mean TTFT s | wall s | tok/s vs static |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ratios = {mode: round_ratios(rounds["static"], rounds[mode]) for mode in names if mode != "static"}
    for mode, name in names.items():
        r = median_round(rounds[mode])
        ratio = "1" if mode == "static" else f"{statistics.median(ratios[mode]):.2f}x"
        lines.append(
            f"| {name} | {r['req_s']:.2f} | {r['tok_s']:.0f} | {r['mean_s']:.2f} | {r['p99_s']:.2f} | "
            f"{r['ttft_s']:.2f} | {r['elapsed_s']:.1f} | {ratio} |"
        )
    lean_gain = statistics.median(
        lean["tok_s"] / plain["tok_s"] for lean, plain in zip(rounds["lean"], rounds["plain"], strict=True)
    )
    served = statistics.median(
        http["tok_s"] / engine["tok_s"] for http, engine in zip(rounds["lean"], rounds["engine"], strict=True)
    )
    stream_lines = [
        "| streams | forward | TTFT P50 ms | TTFT max ms | TPOT ms | output tok/s |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for (name, count), s in streams.items():
        stream_lines.append(
            f"| {count} | {name} | {s['ttft_p50_s'] * 1e3:.0f} | {s['ttft_max_s'] * 1e3:.0f} | "
            f"{s['tpot_s'] * 1e3:.1f} | {s['tok_s']:.0f} |"
        )
    tpot_gain = {c: streams["plain", c]["tpot_s"] / streams["lean", c]["tpot_s"] for c in levels}
    static_mean = median_round(rounds["static"])["mean_s"]
    lean_ratio, lean_mean = statistics.median(ratios["lean"]), median_round(rounds["lean"])["mean_s"]
    faster, sooner = lean_ratio >= BAR_OVER_STATIC, lean_mean < static_mean
    text = "\n".join(
        [
            "## Text generation at a realistic model shape",
            "",
            f"Model: random-weight Llama, {MODEL['layers']} layers, hidden {MODEL['hidden']}, {MODEL['heads']} "
            f"heads ({MODEL['kv_heads']} KV heads), MLP {MODEL['intermediate']}, vocabulary {MODEL['vocab']:,}, "
            f"{params:,} parameters, float32 on CPU, torch intra-op threads: {args.threads} on every side. "
            f"Engine: max_num_seqs {args.max_num_seqs}, max_num_batched_tokens {args.max_num_batched_tokens}.",
            "",
            f"### Continuous vs static batching ({args.requests} concurrent requests)",
            "",
            "Prompts 16-256 tokens, outputs 16-256 tokens, greedy, lengths forced (the workload of "
            "`bench_llm_continuous.py`).",
            "",
            *lines,
            "",
            f"Continuous / static over HTTP with the lean forward: **{lean_ratio:.2f}x** "
            f"(bar: {BAR_OVER_STATIC:g}x), mean latency {lean_mean:.2f} s against "
            f"{static_mean:.2f} s static; with transformers' forward: "
            f"{statistics.median(ratios['plain']):.2f}x. Lean / transformers' forward over HTTP: "
            f"**{lean_gain:.2f}x** tokens/s. Served (HTTP) / in-process engine: **{served:.2f}** of the ceiling.",
            "",
            f"**Bar {BAR_OVER_STATIC:g}x: {'met' if faster and sooner else 'missed'}** (continuous batching over "
            f"HTTP with the lean forward against static batching): throughput {lean_ratio:.2f}x, "
            f"{'at least' if faster else 'under'} {BAR_OVER_STATIC:g}x: {'met' if faster else 'missed'}; "
            f"mean latency {lean_mean:.2f} s against {static_mean:.2f} s, "
            f"{'lower' if sooner else 'not lower'}: {'met' if sooner else 'missed'}."
            + (" (A `--quick` smoke run: not a measurement.)" if args.quick else ""),
            "",
            f"Rows: the median of {args.rounds} rounds, each running the modes in turn, and one more static run "
            "after the last. Ratios to static: the median over rounds of each round's own ratio (against the mean "
            "of the static runs just before and after it); per round, lean: "
            f"{', '.join(f'{r:.2f}x' for r in ratios['lean'])}; transformers' forward: "
            f"{', '.join(f'{r:.2f}x' for r in ratios['plain'])}. Server TTFT is the server's own histogram "
            "(admission to first token).",
            "",
            f"### Streams: time to first token and per output token (prompts of {STREAM_PROMPT} tokens, "
            f"{STREAM_OUTPUT} out)",
            "",
            *stream_lines,
            "",
            "Time per output token, transformers' forward / lean: "
            + ", ".join(f"{tpot_gain[c]:.2f}x at {c}" for c in levels)
            + ". Measured by the client from the server-sent events (one token per event); the streams of a "
            "level start together, in waves, at least 8 requests per level.",
            "",
        ]
    )
    print(text)
    out = HERE / "out"
    out.mkdir(exist_ok=True)
    (out / "bench_llm_realistic.md").write_text(text)


if __name__ == "__main__":
    main()
