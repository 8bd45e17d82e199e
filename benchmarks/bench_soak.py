"""Soak with its negative control (a planted leak that must miss the bar).

Two servers run side by side under the same steady load for ``--duration`` seconds (600 by
default): the bundled example repository, whose ``mlp`` gets the load, and the same repository
plus ``mlp_leak``, a Python model with the MLP's inputs and outputs that keeps every input it
is given (each row tiled to ``--leak-bytes``, 1 KiB by default) in a worker
process of its own, which gets the same load. Each server gets ``--rate`` requests/s (100), half
V2 JSON over HTTP/1.1 and half ModelInfer over gRPC, at fixed intervals, on 4 kept connections
per protocol (at most 4 requests in flight each; more would wait, and past 4 waiting a request is
skipped and counted), each with a 10 s timeout. Traffic goes to 127.0.0.1 only.

Every ``--sample-s`` seconds (2) the sampler sums, over each server's whole process tree, the PSS
of its anonymous and shared-memory pages (``Pss_Anon + Pss_Shmem`` from procfs' ``smaps_rollup``;
``_soak.held_bytes`` says why not the whole PSS, which is reported beside it with USS and RSS;
where the kernel lacks those fields, psutil's ``memory_full_info().pss``, else RSS, and the
section says which), and reads its FDs and threads. The first 20 % of the run (2 minutes of 10) is
discarded as warm-up, and an ordinary least-squares line through the rest gives the slope in
MiB/min; the bar is under 0.5 MiB/min. The leak control must miss that bar: if it passes, the
detector is broken. The arithmetic and the verdicts are in ``_soak.py``.

Run: ``python benchmarks/bench_soak.py [--duration 600] [--planted-leak | --no-leak] [--check]``;
writes ``benchmarks/out/bench_soak.md`` and ``out/bench_soak-memory.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import yaml

sys.path.insert(0, str(Path(__file__).parent))

import _soak as soak

import tensorgate
from tensorgate.bench.grpc_client import GrpcConnection, connect, framed
from tensorgate.bench.http_client import ConnectionLost, HttpConnection
from tensorgate.bench.inputs import Tensor
from tensorgate.bench.targets.base import Endpoint
from tensorgate.bench.targets.grpc_v2 import INFER_METHOD, infer_request_bytes
from tensorgate.bench.targets.http_tensor import encode_v2_json
from tensorgate.examples import build_example_repository
from tensorgate.testing import ServerProcess

OUT = Path(__file__).parent / "out"
CONNECTIONS = 4  # per protocol per server: the bound on requests in flight
VARIANTS = 32  # distinct request bodies, cycled
PROTOCOLS = ("http", "grpc")

# The planted leak: the MLP's interface, a fixed projection and softmax for an answer, and every
# input row kept forever, tiled to ``leak_bytes`` so the leak's size per request is known.
LEAK_MODEL = """
import numpy as np

from tensorgate import PythonModel


class KeepsEveryInput(PythonModel):
    def load(self, context):
        self.row_values = int(context.parameters.get("leak_bytes", 1024)) // 4
        self.weights = np.random.default_rng(7).standard_normal((16, 3)).astype(np.float32) / 4
        self.kept = []  # the leak

    def execute(self, inputs):
        x = inputs["features"]
        self.kept.append(np.resize(x, (x.shape[0], self.row_values)))
        logits = x @ self.weights
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        return {"probabilities": (e / e.sum(axis=1, keepdims=True)).astype(np.float32)}
"""


def write_leak_model(repo: Path, leak_bytes: int) -> None:
    model = repo / "mlp_leak"
    (model / "1").mkdir(parents=True, exist_ok=True)
    (model / "1" / "model.py").write_text(LEAK_MODEL)
    config = {
        "backend": "python",
        "max_batch_size": 64,
        "dynamic_batching": {"max_queue_delay_ms": 2, "max_queue_size": 1024},
        # A worker process: the leak is in a child, so only a sum over the tree sees it.
        "instance_group": [{"count": 1, "isolation": "process"}],
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [-1, 16]}],
        "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 3]}],
        "parameters": {"leak_bytes": leak_bytes},
    }
    (model / "config.yaml").write_text(yaml.safe_dump(config))


# -- sampling -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sample:
    t: float  # seconds since the load began
    held: float  # bytes summed over the tree: the fitted metric (see ``memory_source``)
    pss: float  # the whole PSS (RSS where there is none)
    pss_file: float  # its file-backed part (0 where unknown)
    uss: float
    rss: float
    processes: int
    fds: int  # of the server process itself
    threads: int
    tree_fds: int
    tree_threads: int


def memory_source() -> str:
    """What ``Sample.held`` is on this host: ``rollup`` (PSS of anonymous and shmem pages, from
    ``smaps_rollup``), ``pss`` (psutil's ``memory_full_info().pss``) or ``rss``."""
    try:
        if "Pss_Anon" in soak.parse_rollup(Path("/proc/self/smaps_rollup").read_text()):
            return "rollup"
    except OSError:
        pass
    return "pss" if hasattr(psutil.Process().memory_full_info(), "pss") else "rss"


METRICS = {
    "rollup": "anon+shmem PSS",
    "pss": "PSS",
    "rss": "RSS",
}


def process_memory(process: psutil.Process, source: str) -> tuple[float, float, float, float, float]:
    """(held, pss, pss_file, uss, rss) of one process, in bytes."""
    if source == "rollup":
        try:
            fields = soak.parse_rollup(Path(f"/proc/{process.pid}/smaps_rollup").read_text())
        except FileNotFoundError as exc:
            raise psutil.NoSuchProcess(process.pid) from exc
        uss = fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)
        return soak.held_bytes(fields), fields["Pss"], fields.get("Pss_File", 0), uss, fields["Rss"]
    memory = process.memory_full_info()
    pss = getattr(memory, "pss", memory.rss)
    return pss, pss, 0.0, getattr(memory, "uss", memory.rss), memory.rss


def sample_tree(root: psutil.Process, t: float, source: str) -> Sample:
    totals = [0.0] * 5
    processes = tree_fds = tree_threads = 0
    fds = threads = 0
    for index, process in enumerate([root, *root.children(recursive=True)]):
        try:
            with process.oneshot():
                memory = process_memory(process, source)
                n_fds, n_threads = process.num_fds(), process.num_threads()
        except psutil.NoSuchProcess:  # a child that ended between the listing and the read
            continue
        totals = [a + b for a, b in zip(totals, memory, strict=True)]
        processes += 1
        tree_fds += n_fds
        tree_threads += n_threads
        if index == 0:
            fds, threads = n_fds, n_threads
    held, pss, pss_file, uss, rss = totals
    return Sample(t, held, pss, pss_file, uss, rss, processes, fds, threads, tree_fds, tree_threads)


class Sampler(threading.Thread):
    """Samples every server's tree at ``t0 + k * every_s`` on a thread of its own, so a slow read of
    procfs never delays a request (the load runs on the event loop)."""

    def __init__(self, roots: dict[str, psutil.Process], t0: float, every_s: float, source: str) -> None:
        super().__init__(name="soak-sampler", daemon=True)
        self.source = source
        self.roots = roots
        self.t0 = t0
        self.every_s = every_s
        self.samples: dict[str, list[Sample]] = {name: [] for name in roots}
        self.stopped = threading.Event()

    def run(self) -> None:
        k = 0
        while True:
            t = time.monotonic() - self.t0
            for name, root in self.roots.items():
                self.samples[name].append(sample_tree(root, t, self.source))
            k += 1
            if self.stopped.wait(max(0.0, self.t0 + k * self.every_s - time.monotonic())):
                return


# -- load ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class Lane:
    """One protocol's requests to one server: fixed intervals, a fixed set of connections."""

    server: str
    protocol: str
    rate: float
    phase_s: float
    send: Callable[[Any, int], Awaitable[str | None]]  # (connection, index) -> None or an error key
    connections: list[Any]
    starts: list[float] = field(default_factory=list)  # seconds since t0 the request was due
    latencies: list[float] = field(default_factory=list)  # of successful requests, aligned with starts
    errors: Counter[str] = field(default_factory=Counter)
    error_times: list[float] = field(default_factory=list)
    skipped: int = 0
    sent: int = 0


def http_lane(server: str, endpoint: Endpoint, model: str, bodies: list[Tensor], rate: float, phase: float) -> Lane:
    requests = [encode_v2_json(endpoint, model, None, (tensor,)) for tensor in bodies]

    async def send(connection: HttpConnection, index: int) -> str | None:
        response = await connection.request(requests[index % len(requests)])
        if response.status != 200:
            return f"http {response.status}"
        return None if b'"probabilities"' in response.body else "http 200 without outputs"

    connections = [HttpConnection(endpoint.host, endpoint.port) for _ in range(CONNECTIONS)]
    return Lane(server, "http", rate, phase, send, connections)


class GrpcSlot:
    """A kept gRPC connection, opened again if the server ends it."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.connection: GrpcConnection | None = None

    async def call(self, message: bytes) -> int:
        if self.connection is None or not self.connection.usable:
            self.close()
            self.connection = await connect(Endpoint(self.host, self.port, ""))
        return (await self.connection.call(INFER_METHOD, message)).code

    def close(self) -> None:
        if self.connection is not None and self.connection.transport is not None:
            self.connection.transport.close()
        self.connection = None


def grpc_lane(server: str, endpoint: Endpoint, model: str, bodies: list[Tensor], rate: float, phase: float) -> Lane:
    messages = [framed(infer_request_bytes(model, None, (tensor,))) for tensor in bodies]

    async def send(slot: GrpcSlot, index: int) -> str | None:
        code = await slot.call(messages[index % len(messages)])
        return None if code == 0 else f"grpc status {code}"

    return Lane(server, "grpc", rate, phase, send, [GrpcSlot(endpoint.host, endpoint.port) for _ in range(CONNECTIONS)])


async def run_lane(lane: Lane, t0: float, duration_s: float, timeout_s: float) -> None:
    free: asyncio.Queue[Any] = asyncio.Queue()
    for connection in lane.connections:  # FIFO: every connection is used in turn and stays open
        free.put_nowait(connection)
    waiting = 0
    pending: set[asyncio.Task[None]] = set()

    async def one(index: int, offset: float) -> None:
        nonlocal waiting
        due = t0 + offset
        connection = None
        error: str | None = None
        try:
            async with asyncio.timeout(timeout_s):
                waiting += 1
                try:
                    connection = await free.get()
                finally:
                    waiting -= 1
                error = await lane.send(connection, index)
        except TimeoutError:
            error = "timeout"
        except (OSError, ConnectionLost):
            error = "connection error"
        finally:
            if connection is not None:
                if error is not None and isinstance(connection, GrpcSlot):
                    connection.close()  # the next call starts on a fresh connection
                free.put_nowait(connection)
        if error is None:
            lane.starts.append(offset)
            lane.latencies.append(time.monotonic() - due)
        else:
            lane.errors[error] += 1
            lane.error_times.append(offset)

    interval = 1.0 / lane.rate
    index = 0
    while (offset := lane.phase_s + index * interval) < duration_s:
        delay = t0 + offset - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if free.empty() and waiting >= CONNECTIONS:
            lane.skipped += 1  # the server is behind by a whole connection's worth: do not pile on
        else:
            lane.sent += 1
            task = asyncio.create_task(one(index, offset))
            pending.add(task)
            task.add_done_callback(pending.discard)
        index += 1
    if pending:
        await asyncio.gather(*pending)
    for connection in lane.connections:
        connection.close()


async def prime(lanes: list[Lane]) -> None:
    """Open every connection before the clock starts (one request each, not counted), so the
    servers' FD counts at the start already include them."""

    async def first(lane: Lane, connection: Any, index: int) -> None:
        error = await lane.send(connection, index)
        if error is not None:
            raise RuntimeError(f"{lane.server} {lane.protocol}: the first request failed: {error}")

    await asyncio.gather(*(first(lane, c, i) for lane in lanes for i, c in enumerate(lane.connections)))


# -- one run's figures --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Figures:
    server: str
    model: str
    duration_s: float
    warmup_s: float
    samples: list[Sample]
    lanes: list[Lane]
    expected_slope: float | None  # MiB/min the planted leak adds by its data alone

    def at_warmup(self) -> Sample:
        return next(s for s in self.samples if s.t >= self.warmup_s)

    def fit(self, metric: str = "held") -> soak.Fit:
        return soak.memory_fit([s.t for s in self.samples], [getattr(s, metric) for s in self.samples], self.warmup_s)

    def mib(self, metric: str = "held") -> tuple[float, float, float]:
        """``metric`` at the start, the end of warm-up and the end, in MiB."""
        start, warm, end = (
            getattr(s, metric) / soak.MIB for s in (self.samples[0], self.at_warmup(), self.samples[-1])
        )
        return start, warm, end

    @property
    def failed(self) -> int:
        return sum(sum(lane.errors.values()) for lane in self.lanes)

    def p99_ms(self, protocol: str | None, first: bool) -> float:
        window = min(60.0, self.duration_s / 2)
        begin, end = (0.0, window) if first else (self.duration_s - window, self.duration_s)
        lanes = [lane for lane in self.lanes if protocol is None or lane.protocol == protocol]
        starts = [t for lane in lanes for t in lane.starts]
        latencies = [v for lane in lanes for v in lane.latencies]
        return soak.window_p99(starts, latencies, begin, end) * 1000

    def verdicts(self) -> dict[str, bool]:
        start, warm, end = self.samples[0], self.at_warmup(), self.samples[-1]
        _, held_warm, held_end = self.mib()
        counts = ("fds", "threads", "tree_fds", "tree_threads", "processes")
        return {
            "slope": soak.slope_met(self.fit()),
            "no failed request": self.failed == 0,
            "growth": soak.growth_met(held_warm, held_end),
            "flat": all(soak.flat(getattr(warm, k), getattr(end, k)) for k in counts)
            and all(soak.flat(getattr(start, k), getattr(end, k)) for k in counts),
            "p99": soak.p99_met(self.p99_ms(None, True), self.p99_ms(None, False)),
        }


def summary_lines(figures: Figures, metric: str) -> list[str]:
    """The verdict line for one run, for stdout and the section."""
    fit = figures.fit()
    verdicts = figures.verdicts()
    if figures.expected_slope is None:
        return [
            f"- **{figures.server}**: slope {fit.slope:+.3f} MiB/min after warm-up ({metric}; bar < "
            f"{soak.SLOPE_BAR_MIB_PER_MIN}): **{soak.word(verdicts['slope'])}**; failed requests {figures.failed}: "
            f"**{soak.word(verdicts['no failed request'])}**. the other checks: FDs, threads and processes flat "
            f"(within {soak.FLAT_TOLERANCE}): {soak.word(verdicts['flat'])}; growth from the end of warm-up under "
            f"max(5 %, 16 MiB): {soak.word(verdicts['growth'])}; P99 of the last minute under "
            f"{soak.P99_RATIO_BAR}x the first's: {soak.word(verdicts['p99'])}."
        ]
    return [
        f"- **{figures.server}** (detector calibration): slope {fit.slope:+.3f} MiB/min ({metric}; the "
        f"leak's data alone is {figures.expected_slope:.2f} MiB/min); the bar is **{soak.word(verdicts['slope'])}**, "
        f"so the detector reports the leak: **{soak.word(not verdicts['slope'])}**; failed requests {figures.failed}."
    ]


# -- the section --------------------------------------------------------------------------------


def code_line() -> str:
    package = Path(tensorgate.__file__).resolve().parent
    pure = str(importlib.util.find_spec("tensorgate.types").origin).endswith(".py")  # type: ignore[union-attr]
    build = "pure-Python build (no mypyc-compiled modules)" if pure else "mypyc-compiled build"
    try:
        commit = subprocess.run(
            ["git", "-C", str(package), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(package), "status", "--porcelain", "--", "."], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"tensorgate from {package}, {build}"
    return f"tensorgate at commit {commit}{' with uncommitted changes' if dirty else ''}, {build}"


def row(label: str, runs: list[Figures], cell: Callable[[Figures], str]) -> str:
    return f"| {label} | " + " | ".join(cell(f) for f in runs) + " |"


def table(runs: list[Figures], metric: str) -> list[str]:
    def counts(f: Figures, key: str) -> str:
        return " / ".join(str(getattr(s, key)) for s in (f.samples[0], f.at_warmup(), f.samples[-1]))

    def levels(f: Figures, key: str) -> str:
        return " / ".join(f"{v:.1f}" for v in f.mib(key))

    def fitted(f: Figures, key: str, bold: bool = False) -> str:
        fit = f.fit(key)
        slope = f"**{fit.slope:+.3f}**" if bold else f"{fit.slope:+.3f}"
        return f"{slope} ± {fit.stderr:.3f} (residual s.d. {fit.residual_sd:.2f} MiB)"

    def requests(f: Figures, protocol: str) -> str:
        lanes = [lane for lane in f.lanes if lane.protocol == protocol]
        kinds = Counter[str]()
        for lane in lanes:
            kinds.update(lane.errors)
        detail = f" ({', '.join(f'{k}: {n}' for k, n in sorted(kinds.items()))})" if kinds else ""
        sent = sum(lane.sent for lane in lanes)
        return f"{sent:,} / {sum(kinds.values())}{detail} / {sum(lane.skipped for lane in lanes)}"

    def p99(f: Figures, protocol: str | None) -> str:
        return f"{f.p99_ms(protocol, True):.2f} / {f.p99_ms(protocol, False):.2f}"

    def growth(f: Figures) -> str:
        _, warm, end = f.mib()
        return f"{end - warm:+.1f} (bar < {soak.growth_bar_mib(warm):.0f})"

    lines = [
        "| | " + " | ".join(f"{f.server} (`{f.model}`)" for f in runs) + " |",
        "|---|" + "---:|" * len(runs),
        row("run / warm-up left out of the fit (s)", runs, lambda f: f"{f.duration_s:.0f} / {f.warmup_s:.0f}"),
        row("memory samples fitted", runs, lambda f: str(f.fit().points)),
        row("processes in the tree: start / end of warm-up / end", runs, lambda f: counts(f, "processes")),
        row(f"{metric}, tree (MiB): start / end of warm-up / end", runs, lambda f: levels(f, "held")),
        row(f"**slope of {metric} (MiB/min, OLS ± s.e.)**", runs, lambda f: fitted(f, "held", bold=True)),
        row(f"growth of {metric}, end of warm-up to end (MiB)", runs, growth),
    ]
    if any(s.pss != s.held for f in runs for s in f.samples):
        lines += [
            row("whole PSS, tree (MiB): start / end of warm-up / end", runs, lambda f: levels(f, "pss")),
            row("slope of the whole PSS (MiB/min)", runs, lambda f: fitted(f, "pss")),
            row("slope of its file-backed part, Pss_File (MiB/min)", runs, lambda f: fitted(f, "pss_file")),
            row("slope of USS, private pages (MiB/min)", runs, lambda f: fitted(f, "uss")),
        ]
    return [
        *lines,
        row("slope of RSS (MiB/min)", runs, lambda f: fitted(f, "rss")),
        row("HTTP requests: sent / failed / skipped", runs, lambda f: requests(f, "http")),
        row("gRPC requests: sent / failed / skipped", runs, lambda f: requests(f, "grpc")),
        row("server FDs: start / end of warm-up / end", runs, lambda f: counts(f, "fds")),
        row("server threads: start / end of warm-up / end", runs, lambda f: counts(f, "threads")),
        row("FDs of the whole tree: start / end of warm-up / end", runs, lambda f: counts(f, "tree_fds")),
        row("threads of the whole tree: start / end of warm-up / end", runs, lambda f: counts(f, "tree_threads")),
        row("HTTP P99 (ms): first minute / last minute", runs, lambda f: p99(f, "http")),
        row("gRPC P99 (ms): first minute / last minute", runs, lambda f: p99(f, "grpc")),
        row("all requests P99 (ms): first minute / last minute", runs, lambda f: p99(f, None)),
    ]


def plot(runs: list[Figures], path: Path, metric: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7.5, 4.8))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for f in runs:
        minutes = np.array([s.t for s in f.samples]) / 60
        base = f.at_warmup().held / soak.MIB
        held = np.array([s.held for s in f.samples]) / soak.MIB - base
        line = axes.plot(minutes, held, lw=1, label=f"{f.server}: {metric}")[0]
        fit = f.fit()
        xs = np.array([f.warmup_s / 60, f.duration_s / 60])
        axes.plot(xs, fit.intercept + fit.slope * xs - base, "--", color=line.get_color(), lw=1.5)
        if any(s.pss != s.held for s in f.samples):
            pss = np.array([s.pss for s in f.samples]) / soak.MIB
            pss -= f.at_warmup().pss / soak.MIB
            axes.plot(minutes, pss, ":", color=line.get_color(), lw=0.8, label=f"{f.server}: whole PSS")
    axes.axvspan(0, runs[0].warmup_s / 60, color="0.92", label="warm-up (not fitted)")
    axes.set_xlabel("minutes under load")
    axes.set_ylabel("MiB above the end of warm-up (tree)")
    axes.set_title("memory under steady load (dashed: least-squares fit)")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def section(runs: list[Figures], args: argparse.Namespace, began: str, ended: str) -> list[str]:
    metric = METRICS[args.source]
    source = {
        "rollup": "the PSS of anonymous and shared-memory pages, `Pss_Anon + Pss_Shmem` from procfs `smaps_rollup`",
        "pss": "`memory_full_info().pss`: this kernel's `smaps_rollup` has no `Pss_Anon`",
        "rss": "PSS is not available here",
    }[args.source]
    lines = [
        "## Soak: memory under steady load, and a planted leak (bench_soak.py)",
        "",
        f"Run {began} to {ended}; {code_line()}. "
        f"{'Both servers ran side by side, under the same load, for the same time. ' if len(runs) > 1 else ''}"
        f"Each got {args.rate:g} requests/s for {args.duration:g} s: {args.rate / 2:g}/s V2 JSON over HTTP/1.1 and "
        f"{args.rate / 2:g}/s ModelInfer over gRPC (features FP32 [1,16], {VARIANTS} bodies cycled), at fixed "
        f"intervals, on {CONNECTIONS} kept connections per protocol (at most {CONNECTIONS} in flight; a request due "
        f"while {CONNECTIONS} more wait is skipped and counted), {args.timeout_s:g} s timeout, to 127.0.0.1 only: "
        "a few percent of the MLP's capacity (thousands of requests/s, the serving section). Default server "
        f"configuration (metrics and access log on). The host's {psutil.cpu_count()} cores are shared with other "
        f"work, which moves latencies more than memory: load average {args.load_before:.1f} at the start, "
        f"{args.load_after:.1f} at the end.",
        "",
        f"Memory is **{metric}** ({source}), summed over the server's whole process tree (server and worker "
        f"processes), sampled every {args.sample_s:g} s. The first {soak.WARMUP_FRACTION:.0%} of the run "
        "is warm-up and left out; an ordinary least-squares line through the rest gives the slope. Bar "
        f"under **{soak.SLOPE_BAR_MIB_PER_MIN} MiB/min**, and no failed request; its "
        "other checks are reported beside them. Not the whole PSS: a library page mapped by N processes counts "
        "1/N in each, N counted over the whole host, so the whole PSS moves when unrelated processes map or "
        "unmap numpy or onnxruntime (this script's first 10-minute run, beside a test suite that started "
        "servers, read +1.8 MiB/min of whole PSS from a server whose USS read +0.04); anonymous and "
        "shared-memory pages are shared only inside the tree, so their PSS counts each page once and nothing "
        "outside moves it. The whole PSS, its file-backed part, USS and RSS are fitted "
        "too. The s.e. assumes independent samples, which samples seconds apart are not: it is for scale.",
        "",
        "The planted leak (the negative control) is `mlp_leak`, a Python model (`backend: python`, in a "
        f"worker process) with the MLP's inputs and outputs that keeps every input row, tiled to "
        f"{args.leak_bytes} bytes; it must miss the bar, or the detector is broken.",
        "",
        *table(runs, metric),
        "",
    ]
    for f in runs:
        lines += summary_lines(f, metric)
    return [*lines, "", "![memory over time](out/bench_soak-memory.png)", ""]


# -- main ---------------------------------------------------------------------------------------


def request_tensors() -> list[Tensor]:
    rng = np.random.default_rng(0)
    return [Tensor("features", "FP32", rng.standard_normal((1, 16)).astype(np.float32)) for _ in range(VARIANTS)]


async def load(servers: dict[str, tuple[ServerProcess, str]], args: argparse.Namespace) -> tuple[list[Lane], Sampler]:
    """Every lane against every server for ``args.duration`` seconds, sampled throughout."""
    bodies = request_tensors()
    lanes: list[Lane] = []
    per_protocol = args.rate / 2
    for name, (server, model) in servers.items():
        http, grpc = (Endpoint("127.0.0.1", server.ports[p], "") for p in ("http", "grpc"))
        lanes.append(http_lane(name, http, model, bodies, per_protocol, 0.0))
        lanes.append(grpc_lane(name, grpc, model, bodies, per_protocol, 0.5 / per_protocol))
    await prime(lanes)
    t0 = time.monotonic() + 0.05
    roots = {name: psutil.Process(server.process.pid) for name, (server, _) in servers.items() if server.process}
    sampler = Sampler(roots, t0, args.sample_s, args.source)
    sampler.start()
    try:
        await asyncio.gather(*(run_lane(lane, t0, args.duration, args.timeout_s) for lane in lanes))
    finally:
        sampler.stopped.set()
        await asyncio.to_thread(sampler.join, 10)
    return lanes, sampler


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--duration",
        type=float,
        default=600.0,
        help="seconds of load (default 600); the server grows for about its first minute, so a run under ~5 "
        "minutes, whose 20 %% warm-up ends inside that minute, reads that growth as a slope",
    )
    parser.add_argument("--rate", type=float, default=100.0, help="requests/s per server, half HTTP, half gRPC")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--planted-leak", action="store_true", help="run only the planted-leak control")
    which.add_argument("--no-leak", action="store_true", help="run only the real server")
    parser.add_argument("--leak-bytes", type=int, default=1024, help="bytes the planted leak keeps per request row")
    parser.add_argument("--sample-s", type=float, default=2.0, help="seconds between memory samples")
    parser.add_argument("--timeout-s", type=float, default=10.0, help="per-request timeout")
    parser.add_argument("--check", action="store_true", help="exit 1 when a bar is missed or the leak goes unseen")
    parser.add_argument("--output", type=Path, default=OUT / "bench_soak.md", help="where the section goes")
    parser.add_argument("--samples-json", type=Path, help="also write every memory sample here")
    args = parser.parse_args()
    if args.duration / args.sample_s < 10:
        parser.error("too few samples: lengthen --duration or shorten --sample-s")
    args.source = memory_source()
    warmup = soak.warmup_s(args.duration)
    OUT.mkdir(exist_ok=True)
    began = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    args.load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="tensorgate-soak-") as work:
        wanted: dict[str, tuple[Path, str]] = {}
        if not args.planted_leak:
            wanted["real server"] = (build_example_repository(Path(work) / "real"), "mlp")
        if not args.no_leak:
            leak_repo = build_example_repository(Path(work) / "leak")
            write_leak_model(leak_repo, args.leak_bytes)
            wanted["planted leak"] = (leak_repo, "mlp_leak")
        servers: dict[str, tuple[ServerProcess, str]] = {}
        try:
            for name, (repo, model) in wanted.items():
                servers[name] = (ServerProcess("--model-repository", str(repo)).start(), model)
            print(f"load: {args.rate:g} req/s per server for {args.duration:g} s; fit after {warmup:g} s", flush=True)
            lanes, sampler = asyncio.run(load(servers, args))
            for name, (server, _) in servers.items():
                if server.process is not None and server.process.poll() is not None:
                    raise RuntimeError(f"{name} exited with {server.process.returncode}; log:\n{server.log()}")
        finally:
            for server, _ in servers.values():
                server.stop()
    ended = datetime.datetime.now(datetime.UTC).strftime("%H:%M UTC")
    args.load_after = os.getloadavg()[0]
    runs = [
        Figures(
            name,
            model,
            args.duration,
            warmup,
            sampler.samples[name],
            [lane for lane in lanes if lane.server == name],
            None if model == "mlp" else args.leak_bytes * args.rate * 60 / soak.MIB,
        )
        for name, (_, model) in servers.items()
    ]
    if args.samples_json is not None:
        dump = {f.server: [dataclasses.asdict(s) for s in f.samples] for f in runs}
        args.samples_json.write_text(json.dumps(dump))
    metric = METRICS[args.source]
    plot(runs, OUT / "bench_soak-memory.png", metric)
    args.output.write_text("\n".join(section(runs, args, began, ended)))
    print("\n".join(table(runs, metric)), "", *(line for f in runs for line in summary_lines(f, metric)), sep="\n")
    print(f"wrote {args.output}")
    if args.check:
        missed = [f.server for f in runs if f.expected_slope is None and not f.verdicts()["slope"]]
        missed += [f.server for f in runs if f.expected_slope is None and f.failed]
        missed += [f.server for f in runs if f.expected_slope is not None and f.verdicts()["slope"]]
        if missed:
            print(f"bars missed: {', '.join(sorted(set(missed)))}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
