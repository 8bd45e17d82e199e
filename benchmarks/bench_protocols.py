"""Protocols side by side, and what observability costs, in one run.

1. ResNet-18-shaped model, 10 clients: V2 HTTP JSON, V2 HTTP binary and V2 gRPC (unary
   ``ModelInfer``, and each request a message of a kept ``ModelStreamInfer`` stream), all driven by
   ``tensorgate bench`` (one tool, so the protocols are compared on equal terms), each run against
   its own in-process ceiling, measured right before and after it (``_ceiling.py``); 1 round with
   ``--quick``, 5 by default. Bars: gRPC and binary each >= 0.90 of it.
2. The same protocols at a fixed 100 requests/s, on a model with ResNet's input that costs
   next to nothing: the CPU each request costs the server and the client, which is what separates
   the protocols in section 1, measured without the model's noise.
3. MLP at 64 clients, JSON bodies, with ``hey``: everything on (metrics recorded and exported,
   JSON access log, tracing with an exporter and sampling off) against everything off
   (``--no-metrics --no-access-log``, no tracing), both servers up at once, in blocks of four short
   one-second runs (on-off-off-on, off-on-on-off; 8 blocks with ``--quick``, 36 by default), both event loops
   pinned to one CPU per two blocks, alternating (``_placement.py``); the cost is the median over
   blocks. Bar: on costs <= 5 % of req/s. Then the same two configurations under callgrind
   (``_callgrind.py``), where valgrind is installed: instructions per request, which this host's
   noise does not move.

The client's and the server's CPU use (cores: CPU seconds over wall seconds) are recorded beside
each run, so a reader can tell whether the client was the bottleneck. Run:
``python benchmarks/bench_protocols.py [--quick]``; writes ``benchmarks/out/bench_protocols.md``.

``--depth 34 --only protocols`` runs section 1 on a ResNet-34-shaped model instead. What a request
costs outside the model (client, event loop, kernel: about 0.9 ms of CPU for a 600 KB tensor) does
not shrink with a faster host, but the model's share does: the issue's host ran ResNet-18 at about
50 images/s, later hosts at 100-115, where the same overhead is twice the share of the ceiling.
ResNet-34 runs at about half ResNet-18's speed, which puts the ratio back on the issue's footing;
it is a second reading, not a substitute for the ResNet-18 bars.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).parent))

import _callgrind
from _ceiling import RESNET_INSTANCES, Bracket, Ceiling
from _models import export_resnet, resnet_input_stub
from _placement import pin_event_loops
from bench_serving import Result, hey, v2_json, write_onnx_model

from tensorgate.bench.targets.base import is_grpc
from tensorgate.examples.build import mlp_model
from tensorgate.testing import ServerProcess

OUT = Path(__file__).parent / "out"

# Seconds of load before each counted `tensorgate bench` run: connections opened, ORT warmed up.
WARMUP_S = 1.0
# Requests/s of the cost-per-request section: about what the ResNet-18 runs reach on the fastest
# hosts seen (~100 images/s; ~40 on one at the issue's speed), where that cost weighs most.
COST_RATE = 100
# Seconds per in-process arrangement when measuring the ceiling around a served run.
CEILING_S = 3.0
# Seconds per run of the observability blocks: short, so the four runs of a block see the same host
# (a block then spans ~5 s, where it spanned ~13 s with 3-second runs), and many blocks fit in the
# time a few long ones took. Measured with 24 blocks each: one-second runs gave a block-to-block
# spread (sd) of 9-11 % against ~12 % for three-second runs, and an A/A test (two identical "off"
# servers) a median of +0.1 %, so the short runs add no bias of their own.
OBSERVABILITY_RUN_S = 1.0
# Blocks of the observability comparison. The median over n blocks moves by about 1.25 sd / sqrt(n):
# with 36, 2-3 % on this host (block sd 9-15 % across today's runs), where 12 three-second blocks left about 4 %.
OBSERVABILITY_BLOCKS = 36
OBSERVABILITY_BLOCKS_QUICK = 8
# CPU sampling period in those one-second runs (both configurations pay its cost alike).
OBSERVABILITY_SAMPLE_S = 0.1

# hey, not `tensorgate bench`, drives the MLP: on this 2-core machine hey reached ~1.5x the req/s
# of `tensorgate bench` at 64 connections (benchmarks/out/bench_client_vs_hey.md), and the
# observability comparison needs the server saturated to show its cost.
MLP_CLIENT = "hey"
# Requests counted per callgrind run (a multiple of the 64 clients), and runs per configuration.
COUNTED_REQUESTS = 2944
COUNTED_RUNS = 2


@dataclass(frozen=True)
class Cores:
    """Mean cores (CPU seconds per wall second) over a client's load phase."""

    client: float
    server: float  # every thread of the server process tree
    loop: float  # the server's main thread: the event loop
    idle: float  # the host's CPUs, idle


_NO_CORES = Cores(float("nan"), float("nan"), float("nan"), float("nan"))


@dataclass
class Measured:
    """One load run plus the CPU the client and the server used while it lasted."""

    result: Result
    cores: Cores
    wall_s: float
    server_view: dict[str, Any] | None = None  # from /metrics: mean batch, queue, compute, outcomes
    window_s: float = float("nan")  # the span the CPU columns cover: warm-up and counted run


class CpuSampler:
    """Polls, every 0.5 s, the CPU seconds of a server and of every other child of this process.

    Any child process that is not a server (``server`` or ``others``, or one of their own
    children) counts as the client, and only ``server``'s tree as the server, so the helpers that
    launch ``hey`` or ``tensorgate bench`` need no changes. Wraps one client run; :meth:`cores`
    then gives the mean cores used over the client's last ``window_s`` seconds alive (its load
    phase, without its start-up).
    """

    # Each poll walks /proc for the process trees: every 0.1 s that took 0.038 cores of this
    # script's CPU (measured), ~2 % of the host taken from the server it measures and not from the
    # in-process ceiling; every 0.5 s, 0.006. One-second runs still need the finer period.
    PERIOD_S = 0.5

    def __init__(self, server: int, others: Sequence[int] = (), period_s: float = PERIOD_S) -> None:
        self._period_s = period_s
        self._servers = [psutil.Process(pid) for pid in (server, *others)]
        self._me = psutil.Process()
        self._seen: dict[int, tuple[psutil.Process, float]] = {}
        # (t, client s, server s, server main thread s, host idle s, client alive)
        self._samples: list[tuple[float, float, float, float, float, bool]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    @staticmethod
    def _cpu(process: psutil.Process) -> float:
        times = process.cpu_times()
        return float(times.user + times.system)

    def _main_thread_s(self) -> float:
        server = self._servers[0]
        try:
            return next(float(t.user_time + t.system_time) for t in server.threads() if t.id == server.pid)
        except (psutil.Error, StopIteration):
            return float("nan")

    def _sample(self) -> None:
        server_pids: set[int] = set()
        server_s = 0.0
        loop_s = self._main_thread_s()
        idle_s = float(psutil.cpu_times().idle)
        for index, server in enumerate(self._servers):
            try:
                tree = [server, *server.children(recursive=True)]
            except psutil.Error:
                continue
            for process in tree:
                server_pids.add(process.pid)
                try:
                    cpu = self._cpu(process)
                except psutil.Error:
                    continue
                if index == 0:
                    server_s += cpu
        alive = False
        try:
            children = self._me.children(recursive=True)
        except psutil.Error:
            children = []
        for child in children:
            if child.pid in server_pids:
                continue
            try:
                self._seen[child.pid] = (child, self._cpu(child))
                alive = alive or child.status() != psutil.STATUS_ZOMBIE
            except psutil.Error:
                pass  # gone: its last reading stays in _seen
        client_s = sum(cpu for _, cpu in self._seen.values())
        self._samples.append((time.perf_counter(), client_s, server_s, loop_s, idle_s, alive))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self._period_s)

    def cores(self, window_s: float) -> Cores:
        """Mean cores over the client's last ``window_s`` seconds alive."""
        alive = [sample for sample in self._samples if sample[5]]
        if len(alive) < 2:
            return _NO_CORES
        end = alive[-1]
        begin = min(alive, key=lambda sample: abs(sample[0] - (end[0] - window_s)))
        span = end[0] - begin[0]
        if span <= 0:
            return _NO_CORES
        client, server, loop, idle = ((end[i] - begin[i]) / span for i in range(1, 5))
        return Cores(client, server, loop, idle)


def tensorgate_bench(
    server: ServerProcess, protocol: str, model: str, load: Sequence[str], seconds: float, label: str
) -> Measured:
    """One run of ``tensorgate bench`` with ``load`` (``-c N`` or ``--rate R``); figures read from its
    ``--json`` report."""
    url = server.grpc_address if is_grpc(protocol) else server.url
    with tempfile.TemporaryDirectory(prefix="tg-bench-json-") as tmp:
        report = Path(tmp) / "report.json"
        command = [
            sys.executable,
            "-m",
            "tensorgate",
            "bench",
            model,
            "-u",
            url,
            "--protocol",
            protocol,
            *load,
            "-z",
            f"{seconds:g}s",
            "--warmup",
            f"{WARMUP_S:g}s",
            "--json",
            str(report),
            "--metrics-url",
            server.metrics_url,
        ]

        def run() -> subprocess.CompletedProcess[str]:
            return subprocess.run(command, capture_output=True, text=True, timeout=seconds + WARMUP_S + 120)

        started = time.perf_counter()
        with CpuSampler(server.process.pid) as sampler:  # type: ignore[union-attr]
            done = run()
        wall = time.perf_counter() - started
        if done.returncode not in (0, 3) or not report.exists():
            raise RuntimeError(f"tensorgate bench {protocol} failed ({done.returncode}):\n{done.stderr[-4000:]}")
        run_json = json.loads(report.read_text())["runs"][0]
    latency = run_json["latency_s"]

    def ms(key: str) -> float:
        value = latency.get(key)
        return float("nan") if value is None else value * 1000

    good = run_json["successes"] / run_json["elapsed_s"] if run_json["elapsed_s"] else float("nan")
    errors = sum(run_json["errors"].values())
    window = WARMUP_S + run_json["elapsed_s"]
    result = Result(label, good, ms("p50"), ms("p90"), ms("p99"), errors)
    return Measured(result, sampler.cores(window), wall, run_json.get("server"), window)


def cores(value: float) -> str:
    return "-" if value != value else f"{value:.2f}"


def row(m: Measured, ceiling: float) -> str:
    result = m.result
    return (
        f"| {result.label} | {result.rps:,.1f} | {result.p50_ms:.2f} | {result.p90_ms:.2f} | {result.p99_ms:.2f} "
        f"| {result.errors} | {result.rps / ceiling:.2f} | {cores(m.cores.client)} | {cores(m.cores.server)} |"
    )


def header(unit: str) -> str:
    return (
        f"| scenario | {unit} | P50 ms | P90 ms | P99 ms | errors | of ceiling | client CPU (cores) "
        "| server CPU (cores) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    )


def server_view_row(m: Measured) -> str:
    view = m.server_view or {}

    def value(key: str, scale: float) -> str:
        number = view.get(key)
        return "-" if number is None else f"{number * scale:.1f}"

    return (
        f"| {m.result.label} | {value('mean_batch_size', 1)} | {value('mean_queue_s', 1000)} "
        f"| {value('mean_compute_s', 1000)} |"
    )


def per_request(measured: Measured, cores: float) -> float:
    """Microseconds of CPU per request the server answered over the CPU window (warm-up included,
    as in the CPU figures: the counted rate alone would miss the warm-up's requests)."""
    answered = ((measured.server_view or {}).get("requests_by_outcome") or {}).get("success", 0)
    return cores * measured.window_s / answered * 1e6 if answered else float("nan")


def cpu_row(name: str, runs: Sequence[Measured]) -> str:
    total = os.cpu_count() or 1

    def med(values: Sequence[float]) -> str:
        return cores(statistics.median(values))

    model = [m.cores.server - m.cores.loop for m in runs]
    rest = [total - m.cores.server - m.cores.client - m.cores.idle for m in runs]
    loop_us = statistics.median(per_request(m, m.cores.loop) for m in runs)
    return (
        f"| {name} | {med(model)} | {med([m.cores.loop for m in runs])} | {med([m.cores.client for m in runs])} "
        f"| {med([m.cores.idle for m in runs])} | {med(rest)} | {loop_us:,.0f} |"
    )


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def median_interval(values: Sequence[float], level: float = 0.90, resamples: int = 4000) -> tuple[float, float]:
    """A percentile-bootstrap interval for the median of ``values``: where the median of as many runs
    would fall on other draws of this host's noise. Seeded, so a report reproduces from its runs.
    NaN for fewer than three runs, whose resamples say nothing."""
    if len(values) < 3:
        return float("nan"), float("nan")
    data = np.asarray(values, dtype=np.float64)
    draws = np.random.default_rng(0).choice(data, size=(resamples, len(data)))
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(np.median(draws, axis=1), [tail, 100 - tail])
    return float(low), float(high)


def span(interval: tuple[float, float]) -> str:
    low, high = interval
    return "-" if low != low else f"{low:.2f}-{high:.2f}"


def bar_line(name: str, ratio: float, interval: tuple[float, float], bar: float) -> str:
    low, high = interval
    head = f"- {name}: **{ratio:.3f}** of the ceiling (bar >= {bar:.2f}): {verdict(ratio >= bar)}"
    if low != low:
        return f"{head} (too few rounds for an interval)."
    if low >= bar:
        reading = "the whole interval clears the bar"
    elif high < bar:
        reading = "the whole interval falls short of it"
    else:
        reading = "the interval straddles the bar: these runs cannot tell a pass from a miss"
    return f"{head}; 90 % interval of the median {low:.2f}-{high:.2f}, {reading}."


PROTOCOLS = {
    "v2-json": "V2 HTTP JSON",
    "v2-binary": "V2 HTTP binary",
    "grpc": "V2 gRPC",
    "grpc-stream": "V2 gRPC stream",  # ModelStreamInfer: each request a message on a kept stream
}


def protocols_section(work: Path, seconds: float, rounds: int, lines: list[str], depth: int = 18) -> None:
    onnx_path = export_resnet(work / f"resnet{depth}.onnx", depth)
    repo = work / "resnet_repo"
    config = {"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_ms": 5}, **RESNET_INSTANCES}
    write_onnx_model(repo, "resnet", onnx_path.read_bytes(), config)
    runs: list[tuple[str, Measured, Bracket]] = []  # in the order run
    ceiling = Ceiling(onnx_path, CEILING_S)
    with ServerProcess("--model-repository", str(repo), "--log-level", "warning") as server:
        for index in range(rounds):
            shift = index % len(PROTOCOLS)
            order = list(PROTOCOLS)[shift:] + list(PROTOCOLS)[:shift]  # none always first
            for protocol in order:
                label = f"round {index + 1}, {PROTOCOLS[protocol]}"
                measured, bracket = ceiling.around(
                    lambda p=protocol, name=label: tensorgate_bench(server, p, "resnet", ("-c", "10"), seconds, name)
                )
                runs.append((protocol, measured, bracket))
    table = [row(measured, ceiling.of(bracket)) for _, measured, bracket in runs]
    ratios = {p: [m.result.rps / ceiling.of(bracket) for q, m, bracket in runs if q == p] for p in PROTOCOLS}
    ratio = {p: statistics.median(values) for p, values in ratios.items()}
    interval = {p: median_interval(values) for p, values in ratios.items()}
    # Against the served arrangement run in-process: what serving itself costs, whatever the
    # arrangement gives up against the best one.
    of_served = {
        p: statistics.median(m.result.rps / ceiling.of(bracket, "served") for q, m, bracket in runs if q == p)
        for p in PROTOCOLS
    }

    def med(protocol: str, key: str) -> float:
        return statistics.median(getattr(m.result, key) for q, m, _ in runs if q == protocol)

    summary = [
        f"| {PROTOCOLS[p]} | {med(p, 'rps'):.1f} | {med(p, 'p50_ms'):.1f} | {med(p, 'p90_ms'):.1f} "
        f"| {med(p, 'p99_ms'):.1f} | **{ratio[p]:.2f}** | {span(interval[p])} | {of_served[p]:.2f} |"
        for p in PROTOCOLS
    ]
    every = [m for _, m, _ in runs]
    lines += [
        f"### Protocols side by side: ResNet-{depth}-shaped model, 10 clients",
        "",
        "FP32 [1, 3, 224, 224] per request (random weights); config `max_batch_size: 8`, "
        "`dynamic_batching: {max_queue_delay_ms: 5}`, two instances of one onnxruntime thread each, "
        "one per CPU (`cpus`; `benchmarks/_ceiling.py` says why). One `tensorgate serve`; each protocol driven by "
        f"`tensorgate bench -c 10 -z {seconds:g}s --warmup {WARMUP_S:g}s`, {rounds} round(s), the protocol "
        "order rotated per round. Each served run is compared with its own ceiling: the mean of the "
        f"in-process ceiling measured right before and right after it ({CEILING_S:g} s per arrangement; the "
        "arrangement with the highest median in the ceiling table). Throughput counts the successful requests "
        "(1 image each) that complete inside the counted window, over that window (as perf_analyzer's time "
        "windows); each in-process loop's rate is taken over its own time. CPU columns: CPU seconds per "
        "wall second over the client's load phase (warm-up "
        f"and counted run, sampled every {CpuSampler.PERIOD_S:g} s).",
        "",
        header("images/s"),
        *table,
        "",
        f"Medians over the {rounds} round(s) (the ratio is the median of the per-run ratios; beside it, a "
        "90 % bootstrap interval for that median, from the same runs; last, the same runs against the "
        "served arrangement run in-process, two pinned single-thread sessions at batch 1: what serving "
        "costs, apart from what that arrangement gives up against the best one):",
        "",
        "| protocol | images/s | P50 ms | P90 ms | P99 ms | of ceiling | 90 % interval | of served arrangement |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *summary,
        "",
        "The in-process ceiling (images/s), in the order measured:",
        "",
        *ceiling.table(),
        "",
        "The server's view of the same runs (tensorgate's /metrics scraped by `tensorgate bench "
        "--metrics-url` before and after each, warm-up included): per request, mean time queued and in "
        "the model; per batch, mean size.",
        "",
        "| run | mean batch size | mean queue ms | mean compute ms |",
        "|---|---:|---:|---:|",
        *[server_view_row(m) for m in every],
        "",
        f"Where this host's {os.cpu_count()} CPUs went during the same runs (cores, medians over the rounds): "
        "the server's threads other than its main one (the model instances), its main thread (the event "
        "loop), the client, idle, and the rest (other processes, the kernel's own threads, this script). "
        "The model can only have what the others leave it. Last, the event loop's CPU per request "
        "answered, under this load: section 2 measures the same at 100 requests/s on an otherwise idle "
        "host, where waking threads from idle adds to it.",
        "",
        "| protocol | model threads | event loop | client | idle | rest | event loop us/request |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *[cpu_row(PROTOCOLS[p], [m for q, m, _ in runs if q == p]) for p in PROTOCOLS],
        "",
        bar_line("gRPC", ratio["grpc"], interval["grpc"], 0.90),
        f"- gRPC over one kept stream per client (`ModelStreamInfer`, as tritonclient's `async_stream_infer` "
        f"and perf_analyzer's `--streaming`): {ratio['grpc-stream']:.2f} of the ceiling; the bar above is "
        "for unary `ModelInfer`, what `tritonclient`'s `infer` calls.",
        bar_line("HTTP binary", ratio["v2-binary"], interval["v2-binary"], 0.90),
        f"- HTTP JSON: {ratio['v2-json']:.2f} of the ceiling (bar >= 0.65: {verdict(ratio['v2-json'] >= 0.65)}).",
        f"- Client CPU peaked at {max(m.cores.client for m in every):.2f} cores of {os.cpu_count()}; the "
        f"server used at most {max(m.cores.server for m in every):.2f}. The client shares the machine with the "
        "server, so every core it takes is one the model does not get.",
        "",
    ]


def cost_section(work: Path, seconds: float, rounds: int, lines: list[str]) -> None:
    """CPU per request of each protocol at a fixed rate, with a model that costs next to nothing.

    The ResNet runs above compare throughputs that this host's noise moves by 10 %; what sets them
    apart is the CPU each protocol's requests take from the model. Measured directly, at a fixed
    open-loop rate, that cost is a steadier figure, and it is the one a change to a protocol's path
    should be judged by.
    """
    repo = work / "stub_repo"
    config = {"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_ms": 5}, **RESNET_INSTANCES}
    write_onnx_model(repo, "resnet_stub", resnet_input_stub(), config)
    order = ("v2-binary", "grpc", "grpc-stream", "v2-json")
    runs: dict[str, list[Measured]] = {p: [] for p in order}
    with ServerProcess("--model-repository", str(repo), "--log-level", "warning") as server:
        for index in range(rounds):
            for protocol in order[index % len(order) :] + order[: index % len(order)]:
                label = f"round {index + 1}, {PROTOCOLS[protocol]}"
                load = ("--rate", str(COST_RATE))
                runs[protocol].append(tensorgate_bench(server, protocol, "resnet_stub", load, seconds, label))

    def med(protocol: str, side: str) -> float:
        return statistics.median(per_request(m, getattr(m.cores, side)) for m in runs[protocol])

    def both(protocol: str) -> float:
        return med(protocol, "server") + med(protocol, "client")

    def host_percent(us: float) -> float:  # CPU per request at COST_RATE, as a share of the host
        return us * COST_RATE / 1e4 / (os.cpu_count() or 1)

    base = both("v2-binary")
    rows = []
    for protocol in order:
        server_us, client_us = med(protocol, "server"), med(protocol, "client")
        rate = statistics.median(m.result.rps for m in runs[protocol])
        rows.append(
            f"| {PROTOCOLS[protocol]} | {rate:.1f} | {server_us:,.0f} | {client_us:,.0f} "
            f"| {server_us + client_us:,.0f} | {both(protocol) / base:.2f} |"
        )
    extra, stream_extra = both("grpc") - base, both("grpc-stream") - base
    lines += [
        f"### What a ResNet-sized request costs outside the model: {COST_RATE} requests/s",
        "",
        "The same input and output as the ResNet runs (FP32 [1, 3, 224, 224] in, [1, 1000] out) on a model "
        "that costs next to nothing (a mean per channel and a projection), served with the same config. "
        f"Each protocol driven open-loop by `tensorgate bench --rate {COST_RATE} -z {seconds:g}s` (the "
        f"ResNet-18 runs' rate on the fastest hosts seen), {rounds} round(s), order rotated; CPU seconds of the server "
        "(every thread: the event loop's, the model's) and of the client over the run, per "
        "request served. Medians over the rounds. At this rate the CPUs are idle most of the time, so "
        "each request also pays for waking the event loop, the model's thread and the client from idle, "
        "which is dear on a virtual machine; under the ResNet load the CPUs never idle, and what the "
        "event loop spends per request there is the last column of the CPU table above.",
        "",
        "| protocol | requests/s | server CPU us/request | client CPU us/request | both | vs HTTP binary |",
        "|---|---:|---:|---:|---:|---:|",
        *rows,
        "",
        f"- gRPC costs {extra:,.0f} us of CPU per request more than HTTP binary, server and client "
        f"together: at {COST_RATE} requests/s, {extra * COST_RATE / 1e6:.3f} cores, "
        f"{host_percent(extra):.1f} % of this host's {os.cpu_count()} cores, "
        "taken from the model.",
        f"- Over a kept stream (`ModelStreamInfer`), {stream_extra:,.0f} us more than HTTP binary: "
        f"{host_percent(stream_extra):.1f} % of the host at that rate.",
        "",
    ]


def mlp_section(work: Path, seconds: float, rounds: int, lines: list[str]) -> None:
    repo = work / "mlp_repo"
    write_onnx_model(
        repo,
        "mlp",
        mlp_model().SerializeToString(),
        {"max_batch_size": 64, "dynamic_batching": {"max_queue_delay_ms": 2, "max_queue_size": 4096}},
    )
    body = v2_json("features", np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32))
    configs = {
        # Sampling off is ratio 0 with an exporter configured: what an operator runs to trace only
        # the requests a client marks sampled (the console exporter prints nothing here).
        "on": (
            "--model-repository",
            str(repo),
            "--log-level",
            "warning",
            "--trace-exporter",
            "console",
            "--trace-sample-ratio",
            "0",
        ),
        "off": ("--model-repository", str(repo), "--log-level", "warning", "--no-metrics", "--no-access-log"),
    }
    runs: dict[str, list[Measured]] = {"on": [], "off": []}
    table: list[str] = []
    with ExitStack() as stack:
        servers = {name: stack.enter_context(ServerProcess(*args)) for name, args in configs.items()}
        pids = [server.process.pid for server in servers.values()]  # type: ignore[union-attr]
        for server in servers.values():  # warm-up, not counted
            hey(f"{server.url}/v2/models/mlp/infer", body, 64, 1.0)
        pair_ratios: list[float] = []
        pair_cpu: list[float] = []  # server CPU seconds per request, on / off
        for index in range(rounds):
            # Blocks of four short runs, on-off-off-on (then off-on-on-off, alternating): this host's
            # speed drifts by tens of percent within a minute, and a steady drift across a block
            # weighs on both configurations alike, which a pair of runs cannot give (in pairs, single
            # ratios here ranged from -21 % to +30 % around a cost near 2 %). Each block is compared
            # within itself; the cost is the median over blocks.
            order = ("on", "off", "off", "on") if index % 2 == 0 else ("off", "on", "on", "off")
            # Blocks 1 and 2 (one of each order) on one CPU, 3 and 4 on the other, and so on.
            cpu_used = pin_event_loops(pids, index // 2)
            block: dict[str, list[Measured]] = {"on": [], "off": []}
            for turn, name in enumerate(order):
                server = servers[name]
                label = f"block {index + 1}, run {turn + 1}, everything {name}"
                started = time.perf_counter()
                others = [pid for pid in pids if pid != server.process.pid]  # type: ignore[union-attr]
                sampler = CpuSampler(server.process.pid, others, period_s=OBSERVABILITY_SAMPLE_S)  # type: ignore[union-attr]
                with sampler:
                    result = hey(f"{server.url}/v2/models/mlp/infer", body, 64, seconds, label=label)
                wall = time.perf_counter() - started
                block[name].append(Measured(result, sampler.cores(seconds), wall))
                runs[name].append(block[name][-1])
            rps = {name: sum(m.result.rps for m in ms) for name, ms in block.items()}
            cpu = {name: sum(m.cores.server / m.result.rps for m in ms) for name, ms in block.items()}
            pair_ratios.append(rps["on"] / rps["off"])
            pair_cpu.append(cpu["on"] / cpu["off"])
            errors = sum(m.result.errors for ms in block.values() for m in ms)
            table.append(
                f"| {index + 1} | {cpu_used} | {'-'.join(order)} | {rps['on'] / 2:,.0f} | {rps['off'] / 2:,.0f} "
                f"| {(1 - pair_ratios[-1]) * 100:+.1f} % | {(pair_cpu[-1] - 1) * 100:+.1f} % | {errors} |"
            )
        exported = httpx.get(servers["on"].metrics_url, timeout=5).text
        with open(servers["on"].log_path, "rb") as log:
            access_lines = sum(1 for _ in log)
    counted = instruction_lines(configs, body, work) if _callgrind.available() else ["(valgrind is not installed)"]
    median = {name: statistics.median(m.result.rps for m in ms) for name, ms in runs.items()}
    p50 = {name: statistics.median(m.result.p50_ms for m in ms) for name, ms in runs.items()}
    p99 = {name: statistics.median(m.result.p99_ms for m in ms) for name, ms in runs.items()}
    # The median over blocks: the ABBA order within a block already cancels a steady drift, and what
    # is left is this host's spells of contention, which cut single runs by 20-40 % (P90 doubling
    # while the server's CPU stays at one core) and swing whichever block they fall in by 10-20 %
    # either way; a mean carries one such block into the figure, the median does not. The geometric
    # mean is printed beside it.
    cost = 1 - statistics.median(pair_ratios)
    mean_cost = 1 - statistics.geometric_mean(pair_ratios)
    samples = sum(1 for line in exported.splitlines() if line and not line.startswith("#"))
    lines += [
        "### Observability overhead: MLP, 64 clients, JSON",
        "",
        "Input `features` FP32 [1, 16]; config `max_batch_size: 64`, `dynamic_batching: "
        "{max_queue_delay_ms: 2, max_queue_size: 4096}`. Two servers up at once: *on* (defaults: metrics "
        "recorded and exported, JSON access log, `--trace-exporter console --trace-sample-ratio 0`: tracing "
        "configured, sampling off) and *off* (`--no-metrics --no-access-log`, no trace exporter). Load from "
        f"`{MLP_CLIENT} -c 64 -z {seconds:g}s`, {rounds} blocks of four runs, on-off-off-on and off-on-on-off "
        "in turn, after a 1 s warm-up of each server; the cost is 1 minus the median over blocks of "
        "(the block's on req/s / its off req/s). Both servers' event loops are pinned to one CPU per two "
        "blocks, the CPU alternating (on this host a loop on CPU 1 served ~5 % more than one on CPU 0). One "
        "row per block: each configuration's mean req/s over its two runs, the cost in req/s (1 - on/off) "
        "and in the server's CPU seconds per request (on/off - 1, each server's own CPU sampled every "
        f"{OBSERVABILITY_SAMPLE_S:g} s over its runs), and errors over the four runs.",
        "",
        "| block | loop CPU | order | on req/s | off req/s | cost (req/s) | cost (CPU/request) | errors |",
        "|---:|---:|---|---:|---:|---:|---:|---:|",
        *table,
        "",
        "| configuration | median req/s | median P50 ms | median P99 ms |",
        "|---|---:|---:|---:|",
        *[f"| everything {n} | {median[n]:,.0f} | {p50[n]:.2f} | {p99[n]:.2f} |" for n in ("on", "off")],
        "",
        f"- Cost of observability: **{cost * 100:+.1f} %** of req/s (bar: <= 5 %): {verdict(cost <= 0.05)}. "
        f"Over all blocks (geometric mean): {mean_cost * 100:+.1f} %; blocks ranged from "
        f"{(1 - max(pair_ratios)) * 100:+.1f} % to {(1 - min(pair_ratios)) * 100:+.1f} %.",
        f"- The same cost in server CPU per request (the server is bound by its one event-loop core here, so "
        "this is the cost a saturated server pays, less exposed than req/s to the CPU other processes take): "
        f"**{(statistics.median(pair_cpu) - 1) * 100:+.1f} %** (median over blocks).",
        f"- P50 {p50['on'] / p50['off']:.2f}x and P99 {p99['on'] / p99['off']:.2f}x with it on.",
        f"- Sanity: the *on* server exported {samples} metric samples and wrote {access_lines:,} log lines "
        "(nearly all access-log records) over the warm-up and the runs.",
        "",
        "#### The same cost in instructions (callgrind)",
        "",
        *counted,
        "",
    ]


def instruction_lines(configs: dict[str, tuple[str, ...]], body: bytes, work: Path) -> list[str]:
    """Instructions per request, each configuration in turn under callgrind (``_callgrind.py``)."""
    body_path = work / "mlp_body.json"
    body_path.write_bytes(body)
    counts: dict[str, list[float]] = {"on": [], "off": []}
    rows = []
    for index in range(COUNTED_RUNS):
        for name in ("on", "off") if index % 2 == 0 else ("off", "on"):
            out = work / f"callgrind.{name}.{index}.out"
            per_request, errors = _callgrind.instructions_per_request(
                list(configs[name]), out, "/v2/models/mlp/infer", body_path, COUNTED_REQUESTS, 64
            )
            counts[name].append(per_request)
            rows.append(f"| {index + 1} | everything {name} | {per_request:,.0f} | {errors} |")
    on, off = (statistics.mean(counts[name]) for name in ("on", "off"))
    spread = max(max(v) / min(v) - 1 for v in counts.values())
    return [
        f"Each server run under `valgrind --tool=callgrind`, counting only while `hey -n {COUNTED_REQUESTS} "
        f"-c 64` runs (after {_callgrind.WARMUP_REQUESTS} requests of warm-up), {COUNTED_RUNS} runs per "
        "configuration, alternating. Instructions, not time: repeatable whatever else the host does, blind "
        "to cache misses, and at callgrind's ~30x slower pace the access log's once-per-flush and "
        "once-per-millisecond work is shared by fewer requests than at full speed (so overstated).",
        "",
        "| run | configuration | instructions per request | errors |",
        "|---:|---|---:|---:|",
        *rows,
        "",
        f"- Cost of observability: **{(on / off - 1) * 100:+.1f} %** of the instructions per request "
        f"({on - off:,.0f} per request; runs of one configuration differed by up to {spread * 100:.1f} %).",
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="3-second runs instead of 10")
    parser.add_argument("--only", choices=["protocols", "observability"])
    parser.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="rounds of the protocols section (1 with --quick); each adds ~2 minutes and narrows the "
        "interval around its medians",
    )
    parser.add_argument(
        "--depth",
        type=int,
        choices=[18, 34],
        default=18,
        help="the ResNet shape for the protocols section; 34 runs about half as fast as 18, as the issue's "
        "host ran 18, and writes out/bench_protocols-resnet34.md (run_all.py keeps to 18)",
    )
    args = parser.parse_args()
    if shutil.which("hey") is None:
        sys.exit("hey is not installed: apt-get install hey")
    seconds = 3.0 if args.quick else 10.0
    load_start = os.getloadavg()
    lines = [
        "## Protocols and observability overhead (bench_protocols.py)",
        "",
        f"Each run {seconds:g} s; clients and server share this machine's {os.cpu_count()} cores.",
        "",
    ]
    with tempfile.TemporaryDirectory(prefix="tg-bench-") as tmp:
        work = Path(tmp)
        if args.only in (None, "protocols"):
            protocols_section(work, seconds, 1 if args.quick else args.rounds, lines, args.depth)
            cost_section(work, seconds, 1 if args.quick else 3, lines)
        if args.only in (None, "observability"):
            blocks = OBSERVABILITY_BLOCKS_QUICK if args.quick else OBSERVABILITY_BLOCKS
            mlp_section(work, OBSERVABILITY_RUN_S, blocks, lines)
    load_end = os.getloadavg()
    lines += [
        f"Machine load (1/5/15-min load average) at start: {'/'.join(f'{v:.2f}' for v in load_start)}, "
        f"at end: {'/'.join(f'{v:.2f}' for v in load_end)}, on {os.cpu_count()} cores. A load above the core "
        "count means other work took CPU from these runs: read the ratios, not the absolute figures.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    OUT.mkdir(exist_ok=True)
    suffix = "" if args.depth == 18 else f"-resnet{args.depth}"
    (OUT / f"{Path(__file__).stem}{suffix}.md").write_text(text)


if __name__ == "__main__":
    main()
