"""The HTTP front end at its limit: the small model against bare echo servers, under two clients (issue 36).

The MLP is the case where the server's own work per request is all there is, and its limit is
the one event-loop core. In one sitting this measures, with ``hey`` and with ``tensorgate bench``
as the client (64 connections, keep-alive, byte-identical V2 JSON bodies):

- bare echo servers that answer the ``mlp`` response without a model: uvicorn with httptools
  (what tensorgate's listener is built on) and Granian (HTTP in Rust) through RSGI and ASGI;
- ``tensorgate serve`` of the bundled ``mlp`` (max batch 64, 2 ms window) and of the same model
  as a new user configured it in issue 36 (max batch 8, 5 ms window);
- the naive Flask server (the model global, one call per request);
- issue 36's fallback shape without a model (``_hop.py``): uvicorn front ends, one process and two
  sharing the port, each request handed over a Unix socket to one back-end process, which stands
  for the scheduler; its event-loop CPU per request is what the scheduler's core would pay.

For every run: requests/s, P50 and P99, the server's CPU per request (all its threads and
processes) and its event-loop thread's alone, and the client's CPU per request and share of the
machine's cores. Then the MLP and the uvicorn echo server at one connection, for the overhead of
everything past the HTTP layer. Rounds rotate the order; figures are medians over rounds. Last,
where the server's event loop spends its time under hey (py-spy, ``_profile.py``), when py-spy is
installed.

Run: ``python benchmarks/bench_front_end.py [--seconds 4] [--rounds 3]``; writes
``benchmarks/out/bench_front_end.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).parent))

from _echo import KINDS, EchoServer
from _hop import HopServer
from _naive import flask_baseline
from _profile import record
from _profile import table as profile_table
from bench_client_vs_hey import Measure, ensure_hey, run_hey, run_ours

from tensorgate.bench.inputs import Tensor
from tensorgate.bench.targets.http_tensor import v2_json_body
from tensorgate.examples import build_example_repository
from tensorgate.examples.build import mlp_model
from tensorgate.testing import ServerProcess

OUT = Path(__file__).parent / "out"
STEM = Path(__file__).stem
# The configuration issue 36's user tried: small batches, a long window.
MLP8 = """max_batch_size: 8
dynamic_batching:
  max_queue_delay_ms: 5
  max_queue_size: 1024
instance_group:
  - count: 1
    kind: cpu
"""
BAR_OF_ECHO = 0.75  # the MLP at 64 clients against the bare uvicorn echo server
BAR_OF_NAIVE = 7.0  # issue 3: at least 7x the naive server, with P99 under 20 ms
BAR_P99_MS = 20.0


@dataclass
class Endpoint:
    label: str
    url: str  # the whole infer URL
    pids: Callable[[], list[int]]  # the server's processes, for its CPU
    loop_pid: int | None = None  # the process whose main thread is the event loop


@dataclass
class Run:
    endpoint: str
    client: str
    concurrency: int
    measure: Measure
    server_us: float  # server CPU per request, every thread and process
    loop_us: float  # the event-loop thread's CPU per request
    client_us: float  # the client's CPU per request
    client_share: float  # the client's CPU over (wall time x cores)


def tree(pid: int) -> list[int]:
    try:
        return [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        return [pid]


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def thread_cpu_seconds(pid: int | None) -> float:
    """CPU of a process's main thread (its event loop), from /proc."""
    if pid is None:
        return float("nan")
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(endpoint: Endpoint, client: str, concurrency: int, drive: Callable[[], Measure]) -> Run:
    pids = endpoint.pids()
    server0, loop0, client0, wall0 = (
        cpu_seconds(pids),
        thread_cpu_seconds(endpoint.loop_pid),
        children_cpu(),
        time.perf_counter(),
    )
    result = drive()
    wall = time.perf_counter() - wall0
    server, loop, client_cpu = (
        cpu_seconds(pids) - server0,
        thread_cpu_seconds(endpoint.loop_pid) - loop0,
        children_cpu() - client0,
    )
    requests = max(1.0, result.rps * wall)
    return Run(
        endpoint.label,
        client,
        concurrency,
        result,
        server / requests * 1e6 if pids else float("nan"),
        loop / requests * 1e6,
        client_cpu / requests * 1e6,
        client_cpu / (wall * (os.cpu_count() or 1)),
    )


def median_of(runs: list[Run], endpoint: str, client: str, concurrency: int) -> Run:
    """The run with the median req/s of those that match, so its columns stay one run's own."""
    chosen = sorted(
        (r for r in runs if (r.endpoint, r.client, r.concurrency) == (endpoint, client, concurrency)),
        key=lambda r: r.measure.rps,
    )
    return chosen[len(chosen) // 2]


def table(rows: list[Run]) -> list[str]:
    lines = [
        "| endpoint | client | c | req/s | P50 ms | P99 ms | server CPU µs/req | event loop µs/req "
        "| client CPU µs/req | client share of cores | errors |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        m = r.measure
        server, loop = (f"{x:.0f}" if x == x else "" for x in (r.server_us, r.loop_us))  # NaN: not measured
        lines.append(
            f"| {r.endpoint} | {r.client} | {r.concurrency} | {m.rps:,.0f} | {m.p50_ms:.2f} | {m.p99_ms:.2f} "
            f"| {server} | {loop} | {r.client_us:.0f} | {r.client_share:.0%} | {m.errors} |"
        )
    return lines


def pure_build() -> bool:
    """Whether tensorgate runs uncompiled: py-spy cannot see mypyc-compiled functions (their time
    shows in their Python callers), so the profile is taken only on the pure-Python build."""
    import tensorgate

    return bool(json.loads((Path(tensorgate.__file__).parent / "_build.json").read_text()).get("pure"))


def mark(ok: bool) -> str:
    return "met" if ok else "**missed**"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile-seconds", type=float, default=6.0, help="0 skips the py-spy profile")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    hey, note = ensure_hey()
    lines = [f"## The HTTP front end at its limit ({STEM}.py)", ""]
    if hey is None:
        lines += [f"_{note}_", ""]
        (OUT / f"{STEM}.md").write_text("\n".join(lines))
        return 0
    echoes = {kind: EchoServer(kind) for kind in KINDS}
    hops = {workers: HopServer(workers) for workers in (1, 2)}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            repo = build_example_repository(work / "repo")
            shutil.copytree(repo / "mlp" / "1", repo / "mlp8" / "1")
            (repo / "mlp8" / "config.yaml").write_text(MLP8)
            rng = np.random.default_rng(0)
            body = v2_json_body((Tensor("features", "FP32", rng.uniform(-1, 1, (1, 16)).astype(np.float32)),))
            body_path, input_file = work / "body.json", work / "requests.json"
            body_path.write_bytes(body)
            input_file.write_text(json.dumps([json.loads(body)]))
            with (
                ServerProcess(
                    "--model-repository", str(repo), "--log-level", "warning", env={"OMP_NUM_THREADS": "1"}
                ) as server,
                flask_baseline(work, mlp_model().SerializeToString(), body) as naive_url,
            ):
                for echo in echoes.values():
                    echo.wait_ready()
                for hop in hops.values():
                    hop.wait_ready()
                assert server.process is not None
                served = server.process.pid
                endpoints = [
                    *(
                        Endpoint(
                            f"echo, {kind}",
                            f"{echo.url}/v2/models/mlp/infer",
                            lambda e=echo: tree(e.process.pid),
                            # Granian's event loop runs in its worker process, uvicorn's in its own main thread.
                            echo.process.pid if kind == "uvicorn" else None,
                        )
                        for kind, echo in echoes.items()
                    ),
                    Endpoint(
                        "tensorgate, mlp (64 / 2 ms)",
                        f"{server.url}/v2/models/mlp/infer",
                        lambda: [served],
                        served,
                    ),
                    Endpoint(
                        "tensorgate, mlp8 (8 / 5 ms)",
                        f"{server.url}/v2/models/mlp8/infer",
                        lambda: [served],
                        served,
                    ),
                    Endpoint("naive Flask", naive_url, lambda: [], None),
                    *(
                        Endpoint(
                            f"hop, {workers} front end{'s' if workers > 1 else ''}",
                            f"{hop.url}/v2/models/mlp/infer",
                            lambda h=hop: [*tree(h.frontend.pid), h.backend_pid],
                            hop.backend_pid,  # the scheduler side: what its core pays per request
                        )
                        for workers, hop in hops.items()
                    ),
                ]
                hop_one = endpoints[-2]
                scratch = work / "ours.json"

                def hey_drive(e: Endpoint, c: int) -> Callable[[], Measure]:
                    return lambda: run_hey([], hey, e.url, body_path, args.seconds, c)

                def ours_drive(e: Endpoint, c: int) -> Callable[[], Measure]:
                    base, _, path = e.url.partition("/v2/models/")
                    model = path.split("/")[0]
                    return lambda: run_ours([], base, input_file, args.seconds, scratch, None, c, model)

                for e in endpoints:  # warm every server (pools, allocator, batcher) first
                    hey_drive(e, 64)()
                plan: list[tuple[Endpoint, str, int, Callable[[], Measure]]] = []
                for e in endpoints:
                    plan.append((e, "hey", 64, hey_drive(e, 64)))
                    if e.label != "naive Flask" and not e.label.startswith("hop"):
                        plan.append((e, "tensorgate bench", 64, ours_drive(e, 64)))
                for e in (endpoints[0], endpoints[3], hop_one):
                    plan.append((e, "hey", 1, hey_drive(e, 1)))
                runs: list[Run] = []
                for round_index in range(args.rounds):
                    shift = round_index * len(plan) // max(1, args.rounds)
                    for e, client, c, drive in plan[shift:] + plan[:shift]:
                        runs.append(measure(e, client, c, drive))
                        print(f"round {round_index + 1}: {e.label}, {client}, c={c}: {runs[-1].measure.rps:,.0f}")
                profiled = (
                    args.profile_seconds > 0
                    and pure_build()
                    and record(
                        served,
                        args.profile_seconds,
                        work / "profile.txt",
                        lambda: run_hey([], hey, endpoints[4].url, body_path, args.profile_seconds, 64),
                    )
                )
                profile = profile_table(work / "profile.txt") if profiled else []
    finally:
        for echo in echoes.values():
            echo.close()
        for hop in hops.values():
            hop.close()

    rows = [median_of(runs, e.label, client, c) for e, client, c, _ in plan]
    echo_uv = median_of(runs, "echo, uvicorn", "hey", 64)
    mlp = median_of(runs, "tensorgate, mlp (64 / 2 ms)", "hey", 64)
    mlp8 = median_of(runs, "tensorgate, mlp8 (8 / 5 ms)", "hey", 64)
    naive = median_of(runs, "naive Flask", "hey", 64)
    ours_mlp = median_of(runs, "tensorgate, mlp (64 / 2 ms)", "tensorgate bench", 64)
    echo_c1 = median_of(runs, "echo, uvicorn", "hey", 1)
    mlp_c1 = median_of(runs, "tensorgate, mlp (64 / 2 ms)", "hey", 1)

    def of_echo(run: Run) -> list[float]:
        """Per round: this endpoint's req/s over the uvicorn echo server's in the same round."""
        mine = [r for r in runs if (r.endpoint, r.client, r.concurrency) == (run.endpoint, "hey", 64)]
        base = [r for r in runs if (r.endpoint, r.client, r.concurrency) == ("echo, uvicorn", "hey", 64)]
        return [a.measure.rps / b.measure.rps for a, b in zip(mine, base, strict=True)]

    mlp_of_echo, granian_of_echo = of_echo(mlp), of_echo(median_of(runs, "echo, granian-rsgi", "hey", 64))
    hop1, hop2 = (median_of(runs, label, "hey", 64) for label in ("hop, 1 front end", "hop, 2 front ends"))
    hop1_of_echo, hop2_of_echo = of_echo(hop1), of_echo(hop2)
    hop_c1 = median_of(runs, "hop, 1 front end", "hey", 1)
    naive_ratio = [
        a.measure.rps / b.measure.rps
        for a, b in zip(
            [r for r in runs if (r.endpoint, r.client, r.concurrency) == (mlp8.endpoint, "hey", 64)],
            [r for r in runs if (r.endpoint, r.client, r.concurrency) == ("naive Flask", "hey", 64)],
            strict=True,
        )
    ]
    lines += [
        f"{args.rounds} rounds of `-z {args.seconds:g}s` runs, the order rotated per round; each row is the "
        f"round with the median req/s. Client and servers share this machine's {os.cpu_count()} cores, as a "
        "new user's would. Server CPU counts every thread and process of the server; the event loop is its "
        "main thread (for Granian it runs in a worker process, so only the total is given).",
        "",
        *table(rows),
        "",
        f"- MLP at 64 clients (hey) over the bare uvicorn echo server: **{statistics.median(mlp_of_echo):.2f}** "
        f"(per round {', '.join(f'{x:.2f}' for x in mlp_of_echo)}); bar {BAR_OF_ECHO}: "
        f"{mark(statistics.median(mlp_of_echo) >= BAR_OF_ECHO)}. Server CPU per request "
        f"{mlp.server_us:.0f} µs against the echo server's {echo_uv.server_us:.0f} µs.",
        f"- Granian (RSGI) echo over uvicorn echo: {statistics.median(granian_of_echo):.2f} "
        f"(per round {', '.join(f'{x:.2f}' for x in granian_of_echo)}).",
        f"- MLP as issue 36 configured it (8 / 5 ms) over naive Flask, under hey: "
        f"**{statistics.median(naive_ratio):.1f}x** (per round {', '.join(f'{x:.1f}' for x in naive_ratio)}), "
        f"P99 {mlp8.measure.p99_ms:.1f} ms; bar {BAR_OF_NAIVE:g}x with P99 < {BAR_P99_MS:g} ms: "
        f"{mark(statistics.median(naive_ratio) >= BAR_OF_NAIVE and mlp8.measure.p99_ms < BAR_P99_MS)}. "
        f"With the bundled 64 / 2 ms: {mlp.measure.rps / naive.measure.rps:.1f}x, P99 {mlp.measure.p99_ms:.1f} ms.",
        f"- The same MLP server under `tensorgate bench` against hey: {ours_mlp.measure.rps / mlp.measure.rps:.2f}x "
        f"req/s; client CPU per request {ours_mlp.client_us:.0f} µs against hey's {mlp.client_us:.0f} µs.",
        f"- One connection: MLP P50 {mlp_c1.measure.p50_ms:.2f} ms against the echo server's "
        f"{echo_c1.measure.p50_ms:.2f} ms (hey reports 0.1 ms steps).",
        f"- Front ends and a hop, no model: two front ends on one port "
        f"{statistics.median(hop2_of_echo):.2f} of the uvicorn echo server's req/s "
        f"(per round {', '.join(f'{x:.2f}' for x in hop2_of_echo)}), one front end "
        f"{statistics.median(hop1_of_echo):.2f}. The back end's event loop spends {hop2.loop_us:.0f} µs per "
        f"request (two front ends; {hop1.loop_us:.0f} with one), against {mlp.loop_us:.0f} µs in tensorgate's "
        f"event loop for the MLP's whole request; at one connection the hop's P50 is "
        f"{hop_c1.measure.p50_ms:.2f} ms.",
        "",
    ]
    lines += ["### Where the event loop's time goes: tensorgate, mlp8, hey -c 64, pure-Python build", ""]
    if profile:
        lines += [*profile, ""]
    else:
        lines += [
            "_Not profiled in this run: it needs py-spy and the pure-Python build "
            "(`TENSORGATE_PURE_PYTHON=1 make install`, then this script), as py-spy cannot see compiled functions._",
            "",
        ]
    text = "\n".join(lines)
    (OUT / f"{STEM}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
