"""``tensorgate bench`` vs ``hey`` against the same endpoint, side by side in one run (issue 5).

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
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tensorgate.bench.http_client import ConnectionPool, encode_request
from tensorgate.bench.inputs import Tensor
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
    errors: int


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


def run_hey(prefix: list[str], hey: str, url: str, body_path: Path, seconds: float) -> Measure:
    command = [*prefix, hey, "-c", str(CONCURRENCY), "-z", f"{seconds:g}s", "-m", "POST", "-T", "application/json"]
    output = subprocess.run(
        [*command, "-D", str(body_path), url], capture_output=True, text=True, check=True, timeout=seconds + 60
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
    p50 = float(re.search(r"50%+ in ([\d.]+) secs", output).group(1))  # type: ignore[union-attr]
    p99 = float(re.search(r"99%+ in ([\d.]+) secs", output).group(1))  # type: ignore[union-attr]
    statuses = re.findall(r"\[(\d+)\]\s+(\d+) responses", output)
    errors = sum(int(n) for code, n in statuses if code != "200")
    return Measure("hey", rps, p50 * 1000, p99 * 1000, errors)


def run_ours(
    prefix: list[str], server: ServerProcess, input_file: Path, seconds: float, out: Path, plot: Path | None
) -> Measure:
    command = [*prefix, sys.executable, "-m", "tensorgate", "bench", "mlp", "-u", server.url, "-c", str(CONCURRENCY)]
    command += ["-z", f"{seconds:g}s", "--input-file", str(input_file), "--json", str(out)]
    if plot is not None:
        command += ["--plot", str(plot)]
    subprocess.run(command, capture_output=True, check=True, timeout=seconds + 60)
    run = json.loads(out.read_text())["runs"][0]
    latency = run["latency_s"]
    errors = sum(run["errors"].values())
    return Measure("tensorgate bench", run["throughput_rps"], latency["p50"] * 1000, latency["p99"] * 1000, errors)


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
        pool.close()


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


def client_options(server: ServerProcess, body: bytes, n: int) -> list[str]:
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
    return lines


@dataclass
class Setup:
    server: ServerProcess
    hey: str
    url: str
    body_path: Path
    input_file: Path
    scratch: Path
    seconds: float
    rounds: int


def pin_server(server: ServerProcess, cpus: set[int]) -> None:
    """Move every thread of the server onto ``cpus`` (threads it starts later inherit this)."""
    assert server.process is not None
    for tid in os.listdir(f"/proc/{server.process.pid}/task"):
        os.sched_setaffinity(int(tid), cpus)


def compare(setup: Setup, prefix: list[str], plot: Path | None) -> list[str]:
    """Alternating rounds of hey and ours; a per-round table, medians, ratios and the bar."""
    measures: list[tuple[Measure, Measure]] = []
    for round_index in range(setup.rounds):
        last = plot if round_index == setup.rounds - 1 else None
        ours_json = setup.scratch / "ours.json"
        # Alternate who goes first so a drift in the machine's load favours neither client.
        if round_index % 2 == 0:
            theirs = run_hey(prefix, setup.hey, setup.url, setup.body_path, setup.seconds)
            ours = run_ours(prefix, setup.server, setup.input_file, setup.seconds, ours_json, last)
        else:
            ours = run_ours(prefix, setup.server, setup.input_file, setup.seconds, ours_json, last)
            theirs = run_hey(prefix, setup.hey, setup.url, setup.body_path, setup.seconds)
        pair = (theirs, ours)
        measures.append(pair)
    lines = ["| round | client | req/s | P50 (ms) | P99 (ms) | errors |", "|---|---|---:|---:|---:|---:|"]
    for i, pair in enumerate(measures, 1):
        for m in pair:
            lines.append(f"| {i} | {m.tool} | {m.rps:,.0f} | {m.p50_ms:.2f} | {m.p99_ms:.2f} | {m.errors} |")
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
        f"P50 {p50_ratio:.2f}.**",
        "",
        f"- req/s at least hey's: {mark(rps_ratio >= 1.0)}",
        f"- throughput within 15 %: {mark(abs(rps_ratio - 1) <= TOLERANCE)}",
        f"- P50 within 15 %: {mark(abs(p50_ratio - 1) <= TOLERANCE)}",
        "",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--client-requests", type=int, default=4000)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    hey, note = ensure_hey()
    lines = [f"## `tensorgate bench` vs `hey` ({STEM}.py)", ""]
    with (
        tempfile.TemporaryDirectory() as tmp,
        ServerProcess(
            "--model-repository", str(build_example_repository(Path(tmp) / "repo")), env={"OMP_NUM_THREADS": "1"}
        ) as server,
    ):
        rng = np.random.default_rng(0)
        tensor = Tensor("features", "FP32", rng.uniform(-1, 1, (1, 16)).astype(np.float32))
        body = v2_json_body((tensor,))
        body_path, input_file = Path(tmp) / "body.json", Path(tmp) / "requests.json"
        body_path.write_bytes(body)
        input_file.write_text(json.dumps([json.loads(body)]))
        # Warm the server (thread pools, allocator, batcher) before anything is measured.
        run_ours([], server, input_file, 1.0, Path(tmp) / "warm.json", None)
        lines += [
            f"`mlp` (features FP32 [1,16]) over keep-alive HTTP/1.1 V2 JSON, {CONCURRENCY} connections, "
            f"{args.seconds:g} s per run, {args.rounds} rounds alternating who goes first, medians compared. "
            f"This machine has {os.cpu_count()} cores and is shared with other work, so single rounds swing widely.",
            "",
        ]
        if hey is None:
            lines += [f"_{note}_", ""]
        else:
            setup = Setup(
                server, hey, server.url + "/v2/models/mlp/infer", body_path, input_file, Path(tmp), args.seconds,
                args.rounds,
            )  # fmt: skip
            lines += ["### Server and client share all cores", ""]
            lines += compare(setup, [], None)
            if (os.cpu_count() or 1) >= 2 and shutil.which("taskset"):
                pin_server(server, {0})
                lines += [
                    "### Server pinned to CPU 0, client pinned to CPU 1",
                    "",
                    "Each client gets one core of its own, so neither takes CPU from the server: "
                    "the client-is-not-the-bottleneck check proper.",
                    "",
                ]
                lines += compare(setup, ["taskset", "-c", "1"], OUT / f"{STEM}-cdf.png")
                lines += [f"![latency CDF of the last tensorgate bench round](out/{STEM}-cdf.png)", ""]
        lines += ["### HTTP client options on one core", ""]
        lines += client_options(server, body, args.client_requests)
        lines += [
            "",
            "Same server, same body, 32 concurrent requests from one Python process; CPU is the client "
            "process's own time per request, the figure that decides how much load one core can generate.",
            "",
        ]
    text = "\n".join(lines)
    (OUT / f"{STEM}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
