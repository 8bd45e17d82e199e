"""``tensorgate bench`` vs ``hey`` against the same endpoint, side by side in one run.

The load generator must not be the bottleneck, so its numbers are checked against a reference
client on the same machine at the same moment: ``hey -c 64 -z 5s`` and ``tensorgate bench -c 64
-z 5s`` take turns (three rounds, alternating who goes first, medians reported, because the
machine is shared and noisy) against one ``tensorgate serve`` of the bundled ``mlp`` model,
sending byte-identical V2 JSON bodies. The bar: our req/s at least hey's, and throughput and P50 within 15 %.

A second section measures the HTTP client options on one core (our raw asyncio + httptools
client, aiohttp, httpx): the evidence behind ``tensorgate/bench/http_client.py``.

Run: ``python benchmarks/bench_client_vs_hey.py [--seconds 5] [--rounds 3]``; writes
``benchmarks/out/bench_client_vs_hey.md`` and ``benchmarks/out/bench_client_vs_hey-cdf.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _echo import asgi_app

from tensorgate.bench.http_client import ConnectionPool, encode_request
from tensorgate.bench.inputs import Tensor
from tensorgate.bench.server_metrics import metrics_delta, scrape
from tensorgate.bench.targets.http_tensor import v2_json_body
from tensorgate.examples import build_example_repository
from tensorgate.testing import ServerProcess

OUT = Path(__file__).parent / "out"
STEM = Path(__file__).stem
CONCURRENCY = 64
TOLERANCE = 0.15


@dataclass
class Measure:
    tool: str
    rps: float
    p50_ms: float
    p99_ms: float
    mean_ms: float
    errors: int
    mean_batch: float = float("nan")
    single_batches: float = float("nan")  # share of the server's batches that held one request
    full_batches: float = float("nan")  # share that held all CONCURRENCY requests (the model's max batch)

    @property
    def in_flight(self) -> float:
        """Little's law, req/s x mean latency: a consistent closed-loop measurement gives the concurrency."""
        return self.rps * self.mean_ms / 1000


def ensure_hey() -> tuple[str | None, str]:
    """The hey binary, installing it with apt-get when missing (best effort), and a note."""
    found = shutil.which("hey")
    if found:
        return found, ""
    try:
        subprocess.run(["apt-get", "install", "-y", "hey"], capture_output=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"hey is not installed and could not be installed ({exc}); the comparison is skipped."
    found = shutil.which("hey")
    if found:
        return found, ""
    return None, "hey is not installed and `apt-get install -y hey` failed; the comparison is skipped."


def run_hey(
    prefix: list[str], hey: str, url: str, body_path: Path, seconds: float, concurrency: int = CONCURRENCY
) -> Measure:
    command = [*prefix, hey, "-c", str(concurrency), "-z", f"{seconds:g}s", "-m", "POST", "-T", "application/json"]
    output = subprocess.run(
        [*command, "-D", str(body_path), url], capture_output=True, text=True, check=True, timeout=seconds + 60
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
    p50 = float(re.search(r"50%+ in ([\d.]+) secs", output).group(1))  # type: ignore[union-attr]
    p99 = float(re.search(r"99%+ in ([\d.]+) secs", output).group(1))  # type: ignore[union-attr]
    mean = float(re.search(r"Average:\s+([\d.]+) secs", output).group(1))  # type: ignore[union-attr]
    statuses = re.findall(r"\[(\d+)\]\s+(\d+) responses", output)
    errors = sum(int(n) for code, n in statuses if code != "200")
    return Measure("hey", rps, p50 * 1000, p99 * 1000, mean * 1000, errors)


def run_ours(
    prefix: list[str],
    url: str,
    input_file: Path,
    seconds: float,
    out: Path,
    plot: Path | None,
    concurrency: int = CONCURRENCY,
    model: str = "mlp",
) -> Measure:
    command = [*prefix, sys.executable, "-m", "tensorgate", "bench", model, "-u", url, "-c", str(concurrency)]
    command += ["-z", f"{seconds:g}s", "--input-file", str(input_file), "--json", str(out)]
    if plot is not None:
        command += ["--plot", str(plot)]
    subprocess.run(command, capture_output=True, check=True, timeout=seconds + 60)
    run = json.loads(out.read_text())["runs"][0]
    latency = run["latency_s"]
    errors = sum(run["errors"].values())
    return Measure(
        "tensorgate bench",
        run["throughput_rps"],
        latency["p50"] * 1000,
        latency["p99"] * 1000,
        latency["mean"] * 1000,
        errors,
    )


def with_server_view(metrics_url: str | None, measure: Callable[[], Measure]) -> Measure:
    """Run ``measure`` between two scrapes of the server's metrics (if any) and add its batching view."""
    if metrics_url is None:
        return measure()
    before = scrape(metrics_url)
    result = measure()
    after = scrape(metrics_url)
    if before is not None and after is not None:
        delta = metrics_delta(before, after, "mlp")
        batches = sum(delta.batches.values())
        result.mean_batch = delta.mean_batch_size
        result.single_batches = delta.batches.get("1", 0.0) / batches if batches else float("nan")
        result.full_batches = delta.batches.get(str(CONCURRENCY), 0.0) / batches if batches else float("nan")
    return result


# -- HTTP client options on one core ------------------------------------------------------------


async def _drive(send: Callable[[], Awaitable[None]], requests: int, concurrency: int) -> tuple[float, float]:
    left = [requests]

    async def worker() -> None:
        while left[0] > 0:
            left[0] -= 1
            await send()

    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return requests / (time.perf_counter() - wall), (time.process_time() - cpu) / requests * 1e6


async def _raw(host: str, port: int, body: bytes, n: int) -> tuple[float, float]:
    pool = ConnectionPool(host, port)
    raw = encode_request(
        "POST", f"{host}:{port}", "/v2/models/mlp/infer", body, (("Content-Type", "application/json"),)
    )

    async def send() -> None:
        assert (await pool.request(raw)).status == 200

    try:
        return await _drive(send, n, 32)
    finally:
        await pool.aclose()


async def _aiohttp(url: str, body: bytes, n: int) -> tuple[float, float]:
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=32)) as session:

        async def send() -> None:
            async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
                await response.read()
                assert response.status == 200

        return await _drive(send, n, 32)


async def _httpx(url: str, body: bytes, n: int) -> tuple[float, float]:
    import httpx

    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=32)) as client:

        async def send() -> None:
            response = await client.post(url, content=body, headers={"Content-Type": "application/json"})
            assert response.status_code == 200

        return await _drive(send, n, 32)


def hey_cpu(hey: str, url: str, body_path: Path, n: int) -> tuple[float, float]:
    """hey's req/s and CPU per request (user + system of the child, from getrusage)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    command = [hey, "-n", str(n), "-c", "32", "-m", "POST", "-T", "application/json", "-D", str(body_path), url]
    output = subprocess.run(command, capture_output=True, text=True, check=True, timeout=300).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
    return rps, cpu / n * 1e6


def client_options(server: ServerProcess, body: bytes, n: int, hey: str | None, body_path: Path) -> list[str]:
    import uvloop

    host, port = server.http_address.split(":")
    url = server.url + "/v2/models/mlp/infer"
    options: list[tuple[str, Callable[[], Awaitable[tuple[float, float]]]]] = [
        ("raw asyncio.Protocol + httptools (ours)", lambda: _raw(host, int(port), body, n)),
        ("aiohttp", lambda: _aiohttp(url, body, n)),
        ("httpx", lambda: _httpx(url, body, max(200, n // 10))),
    ]
    lines = [
        "| client (uvloop, 32 connections, one process) | req/s | client CPU per request (µs) |",
        "|---|---:|---:|",
    ]
    for name, make in options:
        try:
            rps, cpu_us = uvloop.run(make())
        except ImportError:
            lines.append(f"| {name} | not installed | |")
            continue
        lines.append(f"| {name} | {rps:,.0f} | {cpu_us:,.0f} |")
    if hey is not None:
        rps, cpu_us = hey_cpu(hey, url, body_path, n)
        lines.append(f"| hey (Go, for reference; all cores) | {rps:,.0f} | {cpu_us:,.0f} |")
    return lines


# -- a trivial endpoint: the clients compared with no server-side batching in the way -----------


def serve_trivial(fd: int) -> None:
    import uvicorn

    # uvicorn's own ``fd=`` option assumes a Unix socket, which leaves TCP_NODELAY off (40 ms
    # delayed-ACK stalls); hand it the inherited TCP socket instead.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, fileno=fd)
    config = uvicorn.Config(asgi_app, log_level="warning", access_log=False, loop="uvloop", http="httptools")
    uvicorn.Server(config).run(sockets=[sock])


class TrivialServer:
    """The trivial endpoint in a child process, on a socket this process bound to a free port."""

    def __init__(self) -> None:
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(1024)
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        fd = self._socket.fileno()
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve-trivial", str(fd)], pass_fds=[fd], stdout=subprocess.DEVNULL
        )

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.post(self.url + "/v2/models/mlp/infer", content=b"{}").status_code == 200:
                    return
            except httpx.TransportError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise
            time.sleep(0.05)

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(10)
        self._socket.close()


# -- the comparison -----------------------------------------------------------------------------


@dataclass
class Setup:
    hey: str
    base_url: str
    metrics_url: str | None
    body_path: Path
    input_file: Path
    scratch: Path
    seconds: float
    rounds: int


def pin(pid: int, cpus: set[int]) -> None:
    """Move every thread of process ``pid`` onto ``cpus`` (threads it starts later inherit this)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(tid), cpus)


def compare(setup: Setup, prefix: list[str], plot: Path | None) -> list[str]:
    """Alternating rounds of hey and ours; a per-round table, medians, ratios and the bar."""
    measures: list[tuple[Measure, Measure]] = []
    url = setup.base_url + "/v2/models/mlp/infer"
    for round_index in range(setup.rounds):
        last = plot if round_index == setup.rounds - 1 else None
        ours_json = setup.scratch / "ours.json"

        def hey_run() -> Measure:
            return run_hey(prefix, setup.hey, url, setup.body_path, setup.seconds)

        def our_run(plot_path: Path | None = last, out: Path = ours_json) -> Measure:
            return run_ours(prefix, setup.base_url, setup.input_file, setup.seconds, out, plot_path)

        # Alternate who goes first so a drift in the machine's load favours neither client.
        if round_index % 2 == 0:
            theirs = with_server_view(setup.metrics_url, hey_run)
            ours = with_server_view(setup.metrics_url, our_run)
        else:
            ours = with_server_view(setup.metrics_url, our_run)
            theirs = with_server_view(setup.metrics_url, hey_run)
        measures.append((theirs, ours))
    server_columns = setup.metrics_url is not None
    header = "| round | client | req/s | P50 (ms) | P99 (ms) | mean (ms) | req/s x mean |"
    rule = "|---|---|---:|---:|---:|---:|---:|"
    if server_columns:
        header += " server mean batch | batches of 1 | batches of 64 |"
        rule += "---:|---:|---:|"
    lines = [header + " errors |", rule + "---:|"]
    for i, pair in enumerate(measures, 1):
        for m in pair:
            row = (
                f"| {i} | {m.tool} | {m.rps:,.0f} | {m.p50_ms:.2f} | {m.p99_ms:.2f} | {m.mean_ms:.2f} | "
                f"{m.in_flight:.1f} |"
            )
            if server_columns:
                row += f" {m.mean_batch:.1f} | {m.single_batches:.0%} | {m.full_batches:.0%} |"
            lines.append(row + f" {m.errors} |")
    hey_rps = statistics.median(t.rps for t, _ in measures)
    our_rps = statistics.median(o.rps for _, o in measures)
    hey_p50 = statistics.median(t.p50_ms for t, _ in measures)
    our_p50 = statistics.median(o.p50_ms for _, o in measures)
    rps_ratio, p50_ratio = our_rps / hey_rps, our_p50 / hey_p50

    def mark(ok: bool) -> str:
        return "yes" if ok else "**no**"

    return [
        *lines,
        "",
        f"Median over rounds: hey {hey_rps:,.0f} req/s, P50 {hey_p50:.2f} ms; tensorgate bench "
        f"{our_rps:,.0f} req/s, P50 {our_p50:.2f} ms. **Ratios (ours / hey): req/s {rps_ratio:.2f}, "
        f"P50 {p50_ratio:.2f}.** Bar: req/s at least hey's: {mark(rps_ratio >= 1.0)}; "
        f"throughput within 15 %: {mark(abs(rps_ratio - 1) <= TOLERANCE)}; "
        f"P50 within 15 %: {mark(abs(p50_ratio - 1) <= TOLERANCE)}.",
        "",
    ]


LOCKSTEP_NOTE = (
    "How to read the tables: `req/s x mean` is Little's law and should equal the 64 connections for any "
    "closed-loop client that measures correctly. The batching columns show how each client's arrival "
    "pattern meets the dynamic batcher (`mlp`: max batch 64, 2 ms window). A client that answers each "
    "response at once sends its requests back in bursts: more full 64-request batches, and, when the server "
    "has one core, more lone requests dispatched as a batch of 1 while the rest of the burst waits behind "
    "them. hey's slower turnaround spreads requests into overlapping mid-size batches. So against a batching "
    "server the arrival pattern, not only the client's cost per request (last table), decides throughput."
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--client-requests", type=int, default=4000)
    parser.add_argument("--serve-trivial", type=int, help=argparse.SUPPRESS)  # internal: the child server
    args = parser.parse_args()
    if args.serve_trivial is not None:
        serve_trivial(args.serve_trivial)
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    hey, note = ensure_hey()
    lines = [f"## `tensorgate bench` vs `hey` ({STEM}.py)", ""]
    trivial = TrivialServer()
    try:
        with (
            tempfile.TemporaryDirectory() as tmp,
            ServerProcess(
                "--model-repository", str(build_example_repository(Path(tmp) / "repo")), env={"OMP_NUM_THREADS": "1"}
            ) as server,
        ):
            trivial.wait_ready()
            rng = np.random.default_rng(0)
            tensor = Tensor("features", "FP32", rng.uniform(-1, 1, (1, 16)).astype(np.float32))
            body = v2_json_body((tensor,))
            body_path, input_file = Path(tmp) / "body.json", Path(tmp) / "requests.json"
            body_path.write_bytes(body)
            input_file.write_text(json.dumps([json.loads(body)]))
            # Warm both servers (thread pools, allocator, batcher) before anything is measured.
            for url in (trivial.url, server.url):
                run_ours([], url, input_file, 1.0, Path(tmp) / "warm.json", None)
            lines += [
                f"V2 JSON `mlp` requests (features FP32 [1,16], byte-identical for both clients) over keep-alive "
                f"HTTP/1.1, `-c {CONCURRENCY} -z {args.seconds:g}s`, {args.rounds} rounds alternating who goes "
                f"first, medians compared. This machine has {os.cpu_count()} cores and is shared with other "
                "work, so single rounds swing widely. Two endpoints: a trivial uvicorn app that answers a fixed "
                "response (the clients themselves compared) and `tensorgate serve` of the bundled `mlp` model.",
                "",
            ]
            if hey is None:
                lines += [f"_{note}_", ""]
            else:
                scratch = Path(tmp)
                trivial_setup = Setup(hey, trivial.url, None, body_path, input_file, scratch, args.seconds, args.rounds)
                served_setup = Setup(
                    hey, server.url, server.metrics_url, body_path, input_file, scratch, args.seconds, args.rounds
                )
                lines += ["### Trivial endpoint, server and client share all cores", ""]
                lines += compare(trivial_setup, [], None)
                lines += ["### tensorgate serve, server and client share all cores", ""]
                lines += compare(served_setup, [], None)
                if (os.cpu_count() or 1) >= 2 and shutil.which("taskset"):
                    assert server.process is not None
                    pin(trivial.process.pid, {0})
                    pin(server.process.pid, {0})
                    pinned = ["taskset", "-c", "1"]
                    lines += [
                        "### Trivial endpoint pinned to CPU 0, client pinned to CPU 1",
                        "",
                        "One core each, so neither client takes CPU from the server: the "
                        "client-is-not-the-bottleneck check proper.",
                        "",
                    ]
                    lines += compare(trivial_setup, pinned, OUT / f"{STEM}-cdf.png")
                    lines += [f"![latency CDF, last tensorgate bench round](out/{STEM}-cdf.png)", ""]
                    lines += ["### tensorgate serve pinned to CPU 0, client pinned to CPU 1", ""]
                    lines += compare(served_setup, pinned, None)
                lines += [LOCKSTEP_NOTE, ""]
            lines += ["### HTTP client options on one core", ""]
            lines += client_options(server, body, args.client_requests, hey, body_path)
            lines += [
                "",
                "Against `tensorgate serve`, same body, 32 concurrent requests from one process; CPU is the "
                "client process's own time per request, the figure that decides how much load one core can "
                "generate.",
                "",
            ]
    finally:
        trivial.close()
    text = "\n".join(lines)
    (OUT / f"{STEM}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
