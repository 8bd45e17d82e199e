"""Tensors through shared memory against the socket, in one run.

1. The ResNet-18-shaped model (random weights, FP32 [1, 3, 224, 224] per request, 602 KB) at 10
   clients: inputs and outputs through system shared memory, against Triton's binary HTTP
   extension (the same client, ``_shm_client.py``, for both) and gRPC (``tensorgate bench``).
   Reported per arrangement: images/s as a fraction of the in-process ceiling measured right
   before and after each run (``_ceiling.py``), and the server's event-loop CPU per request.
   Arrangements rotate per round.
2. A 64 MiB tensor (FP32 [1, 16 Mi]) through an identity Python model, one client, one request
   at a time: median latency through shared memory (in and out) against binary HTTP.

No bars: the issue asks for the figures. Run: ``python benchmarks/bench_shared_memory.py
[--quick]``; writes ``benchmarks/out/bench_shared_memory.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

from _ceiling import RESNET_INSTANCES, Ceiling
from _models import export_resnet18
from bench_protocols import CEILING_S, CpuSampler, median_interval, per_request, span, tensorgate_bench
from bench_serving import write_onnx_model
from model_builders import write_python_model

from tensorgate.testing import ServerProcess

OUT = Path(__file__).parent / "out"
CLIENT = Path(__file__).parent / "_shm_client.py"
BIG_ELEMENTS = 16 * 1024 * 1024  # 64 MiB of FP32
IDENTITY = """
from tensorgate import PythonModel


class Identity(PythonModel):
    def execute(self, inputs):
        return {"OUTPUT": inputs["INPUT"]}
"""
MODES = {"binary": "V2 HTTP binary", "shm": "V2 HTTP, shared memory", "grpc": "V2 gRPC"}


@dataclass(frozen=True)
class Run:
    mode: str
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    loop_us: float  # the server's event-loop CPU per request answered
    loop_cores: float
    client_cores: float
    ceiling: float


def own_client(
    server: ServerProcess,
    model: str,
    names: tuple[str, str],
    shape: str,
    out_bytes: int,
    mode: str,
    connections: int,
    seconds: float,
) -> tuple[dict[str, float], float, float, float]:
    """One run of ``_shm_client.py``: its report, and the event loop's cores, its CPU per request and
    the client's cores over the run."""
    host, port = server.http_address.split(":")
    command = [sys.executable, str(CLIENT), host, port, model, *names, shape, str(out_bytes), mode]
    command += [str(connections), f"{seconds:g}"]
    assert server.process is not None
    with CpuSampler(server.process.pid) as sampler:
        done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the client failed:\n{done.stderr[-4000:]}")
    report = json.loads(done.stdout)
    cores = sampler.cores(report["elapsed_s"])
    loop_us = cores.loop * report["elapsed_s"] / report["answered"] * 1e6 if report["answered"] else float("nan")
    return report, cores.loop, loop_us, cores.client


def resnet_section(work: Path, seconds: float, rounds: int, lines: list[str]) -> None:
    onnx_path = export_resnet18(work / "resnet18.onnx")
    repo = work / "resnet_repo"
    config = {"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_ms": 5}, **RESNET_INSTANCES}
    write_onnx_model(repo, "resnet", onnx_path.read_bytes(), config)
    ceiling = Ceiling(onnx_path, CEILING_S)
    runs: list[Run] = []
    with ServerProcess(
        "--model-repository", str(repo), "--log-level", "warning", "--shared-memory", "system"
    ) as server:
        for index in range(rounds):
            order = list(MODES)[index % len(MODES) :] + list(MODES)[: index % len(MODES)]
            for mode in order:
                if mode == "grpc":
                    measured, bracket = ceiling.around(
                        lambda: tensorgate_bench(server, "grpc", "resnet", ("-c", "10"), seconds, "grpc")
                    )
                    result = measured.result
                    runs.append(
                        Run(
                            mode,
                            result.rps,
                            result.p50_ms,
                            result.p99_ms,
                            result.errors,
                            per_request(measured, measured.cores.loop),
                            measured.cores.loop,
                            measured.cores.client,
                            ceiling.of(bracket),
                        )
                    )
                    continue
                (report, loop, loop_us, client), bracket = ceiling.around(
                    lambda m=mode: own_client(
                        server, "resnet", ("input", "logits"), "1,3,224,224", 4000, m, 10, seconds
                    )
                )
                runs.append(
                    Run(
                        mode,
                        report["answered"] / report["elapsed_s"],
                        report["p50_ms"],
                        report["p99_ms"],
                        report["errors"],
                        loop_us,
                        loop,
                        client,
                        ceiling.of(bracket),
                    )
                )
    lines += [
        "### ResNet-18-shaped model, 10 clients: shared memory against binary HTTP and gRPC",
        "",
        "One `tensorgate serve --shared-memory system`; config `max_batch_size: 8`, "
        "`dynamic_batching: {max_queue_delay_ms: 5}`, two pinned single-thread onnxruntime instances. "
        f"HTTP binary and shared memory are driven by the same client (`benchmarks/_shm_client.py`, 10 kept-alive "
        f"connections, {seconds:g} s per run; with shared memory, each connection's tensor is written into its "
        "region once and each request names the region), gRPC by `tensorgate bench -c 10`. Each run is compared "
        f"with the in-process ceiling measured right before and after it; {rounds} round(s), the order rotated.",
        "",
        "| run | images/s | P50 ms | P99 ms | errors | of ceiling | loop cores | loop us/request | client cores |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *[
            f"| {MODES[r.mode]} | {r.rps:.1f} | {r.p50_ms:.1f} | {r.p99_ms:.1f} | {r.errors} | {r.rps / r.ceiling:.2f} "
            f"| {r.loop_cores:.2f} | {r.loop_us:,.0f} | {r.client_cores:.2f} |"
            for r in runs
        ],
        "",
        "Medians per arrangement (the ratio's 90 % bootstrap interval beside it):",
        "",
        "| arrangement | of ceiling | 90 % interval | event loop us/request | P99 ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for mode, label in MODES.items():
        mine = [r for r in runs if r.mode == mode]
        ratios = [r.rps / r.ceiling for r in mine]
        lines.append(
            f"| {label} | **{statistics.median(ratios):.2f}** | {span(median_interval(ratios))} "
            f"| {statistics.median(r.loop_us for r in mine):,.0f} | {statistics.median(r.p99_ms for r in mine):.1f} |"
        )
    shm_us = statistics.median(r.loop_us for r in runs if r.mode == "shm")
    binary_us = statistics.median(r.loop_us for r in runs if r.mode == "binary")
    lines += [
        "",
        f"- Event-loop CPU per request through shared memory: {shm_us:,.0f} us against {binary_us:,.0f} us for "
        f"binary HTTP ({shm_us / binary_us:.2f}x).",
        "",
    ]


def big_tensor_section(work: Path, requests_s: float, lines: list[str]) -> None:
    repo = work / "identity_repo"
    write_python_model(
        repo, "identity", code=IDENTITY, width=BIG_ELEMENTS, max_batch_size=1, health_check={"enabled": False}
    )
    medians: dict[str, list[float]] = {"binary": [], "shm": []}
    args = ("--model-repository", str(repo), "--log-level", "warning", "--shared-memory", "system")
    with ServerProcess(*args, "--max-body-bytes", str(256 << 20)) as server:
        for _ in range(3):
            for mode in ("binary", "shm"):
                report, *_ = own_client(
                    server, "identity", ("INPUT", "OUTPUT"), f"1,{BIG_ELEMENTS}", BIG_ELEMENTS * 4, mode, 1, requests_s
                )
                if report["errors"]:
                    raise RuntimeError(f"{mode}: {report['errors']} failed requests")
                medians[mode].append(report["p50_ms"])
    shm_ms, binary_ms = statistics.median(medians["shm"]), statistics.median(medians["binary"])
    lines += [
        "### A 64 MiB tensor, one request at a time",
        "",
        f"FP32 [1, {BIG_ELEMENTS}] in and out of an identity Python model; one client, {requests_s:g} s per run, "
        "three alternating runs per arrangement (median latency of each run).",
        "",
        "| arrangement | median latency ms (per run) | median |",
        "|---|---|---:|",
        f"| V2 HTTP binary | {', '.join(f'{v:.1f}' for v in medians['binary'])} | {binary_ms:.1f} |",
        f"| V2 HTTP, shared memory | {', '.join(f'{v:.1f}' for v in medians['shm'])} | {shm_ms:.1f} |",
        "",
        f"- Shared memory takes {shm_ms / binary_ms:.2f}x the latency of binary HTTP for a 64 MiB tensor "
        f"({binary_ms - shm_ms:.1f} ms less).",
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one short round (a smoke run)")
    args = parser.parse_args()
    seconds, rounds, big_s = (4.0, 1, 2.0) if args.quick else (10.0, 3, 5.0)
    lines = [
        "## Shared memory against the socket (`bench_shared_memory.py`)",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {os.cpu_count()} CPUs.",
        "",
    ]
    with tempfile.TemporaryDirectory(prefix="tg-bench-shm-") as tmp:
        resnet_section(Path(tmp), seconds, rounds, lines)
        big_tensor_section(Path(tmp), big_s, lines)
    OUT.mkdir(exist_ok=True)
    (OUT / "bench_shared_memory.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
