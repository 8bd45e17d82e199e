"""Continuous vs static batching on the same model and the same 100 requests.

Static: ``transformers.generate`` on batches of 32 in arrival order (see ``_generation.py``).
Continuous, two ways: the engine in this process (scheduler and model steps, no HTTP), and the
same requests all sent at once over HTTP to ``tensorgate serve`` (OpenAI ``/v1/completions``);
the server's time to first token comes from its own histogram on /metrics.

Model: a small random-weight Llama built here (no downloads); ``bench_llm_realistic.py`` runs the
same comparison on a model of realistic shape. Writes ``benchmarks/out/bench_llm_continuous.md``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch
from _generation import HERE, engine_runner, median_round, round_ratios, run_engine, run_http, run_static, workload
from llm_model_factory import build_model
from transformers import AutoModelForCausalLM

from tensorgate.testing import ServerProcess

MODEL_VOCAB = 74  # the word-level tokenizer trained on tests/llm/data/corpus.txt
# Why this shape: on CPU a decode step's cost is mostly per-step work (framework calls per layer,
# plus attention over every cached position), so the regime where batching many sequences pays
# is a model whose per-step cost is not dominated by per-row arithmetic, the same regime as a GPU
# whose decode step is bound by reading the weights once per step. Larger shapes are options
# (--hidden, --layers, ...): the ratio falls as per-row work dominates (see the report).
MODEL = {"hidden": 32, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate": 96, "max_positions": 1024}


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
    work = workload(args.requests, args.seed, MODEL_VOCAB - 4)
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
        runner = engine_runner(model_dir, args.threads)
        env = {"OMP_NUM_THREADS": str(args.threads)}
        with ServerProcess(
            "--model-repository", str(repo), "--log-level", "warning", ready_timeout_s=120, env=env
        ) as server:
            for index in range(args.rounds):
                rounds["static"].append(run_static(model_dir, work, args.static_batch))
                rounds["engine"].append(run_engine(runner, work, args.max_num_seqs, args.max_num_batched_tokens))
                rounds["http"].append(run_http(server, work, "bench"))
                print(
                    f"round {index + 1}: static {rounds['static'][-1]['elapsed_s']:.2f} s, engine "
                    f"{rounds['engine'][-1]['elapsed_s']:.2f} s, HTTP {rounds['http'][-1]['elapsed_s']:.2f} s",
                    flush=True,
                )
            rounds["static"].append(run_static(model_dir, work, args.static_batch))  # closes the last round
        static, engine, continuous = (median_round(rounds[k]) for k in ("static", "engine", "http"))
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
    per_round = {mode: round_ratios(rounds["static"], rounds[mode]) for mode in ("http", "engine")}
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
