"""The HTTP front end at its limit: the small model against bare echo servers, under two clients.

The MLP is the case where the server's own work per request is all there is, and its limit is
the one event-loop core. In one sitting this measures, with ``hey`` and with ``tensorgate bench``
as the client (64 connections, keep-alive, byte-identical V2 JSON bodies):

- bare echo servers that answer the ``mlp`` response without a model: uvicorn with httptools
  (what tensorgate's listener is built on) and Granian (HTTP in Rust) through RSGI and ASGI;
- ``tensorgate serve`` of the bundled ``mlp`` (max batch 64, 2 ms window) and of the same model
  as a new user first configured it (max batch 8, 5 ms window);
- the same server with Granian as its HTTP front end instead of the uvicorn subclass
  (``_granian_tensorgate.py``: the server's own HTTP app under Granian's ASGI interface);
- the naive Flask server (the model global, one call per request);
- the fallback shape without a model (``_hop.py``): uvicorn front ends, one process and two
  sharing the port, each request handed over a Unix socket to one back-end process, which stands
  for the scheduler; its event-loop CPU per request is what the scheduler's core would pay.

For every run: requests/s, P50 and P99, the server's CPU per request (all its threads and
processes) and its event-loop thread's alone, and the client's CPU per request and share of the
machine's cores. Then the MLP (on either front end) and the uvicorn and Granian ASGI echo servers at
one connection, for the overhead of everything past the HTTP layer. Rounds rotate the order;
figures are medians over rounds. Last, where the server's event loop spends its time under hey
(py-spy, ``_profile.py``), when py-spy is installed: py-spy cannot see compiled functions, so the
profiled server runs on a pure-Python copy of the same sources, whatever build is installed.

Run: ``python benchmarks/bench_front_end.py [--seconds 4] [--rounds 3]``; writes
``benchmarks/out/bench_front_end.md``.
"""

from __future__ import annotations

import argparse
import contextlib
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
from _granian_tensorgate import GranianTensorgate
from _hop import HopServer
from _naive import flask_baseline
from _profile import compiled_code_in, imported_from, pure_copy, pure_env, record, summary
from _profile import table as profile_table
from bench_client_vs_hey import Measure, ensure_hey, run_hey, run_ours

from tensorgate.bench.inputs import Tensor
from tensorgate.bench.targets.http_tensor import v2_json_body
from tensorgate.examples import build_example_repository
from tensorgate.examples.build import mlp_model
from tensorgate.testing import ServerProcess

OUT = Path(__file__).parent / "out"
STEM = Path(__file__).stem
# The configuration a new user first tried: small batches, a long window.
MLP8 = """max_batch_size: 8
dynamic_batching:
  max_queue_delay_ms: 5
  max_queue_size: 1024
instance_group:
  - count: 1
    kind: cpu
"""
BAR_OF_ECHO = 0.75  # the MLP at 64 clients against the bare uvicorn echo server
BAR_C1_OVERHEAD_MS = 0.3  # the MLP's P50 over the echo server's at one connection, no worse than today's
BAR_OF_NAIVE = 7.0  # at least 7x the naive server, with P99 under 20 ms
BAR_P99_MS = 20.0
# Endpoint labels, as the table shows them.
ON_MLP, ON_MLP8, ON_GRANIAN = (
    "tensorgate, mlp (64 / 2 ms)",
    "tensorgate, mlp8 (8 / 5 ms)",
    "tensorgate, mlp on Granian ASGI",
)


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


def mark(ok: bool) -> str:
    return "met" if ok else "**missed**"


def close_all(granian: GranianTensorgate | None, echoes: dict[str, EchoServer], hops: dict[int, HopServer]) -> None:
    if granian is not None:
        granian.close()
    for server in (*echoes.values(), *hops.values()):
        server.close()


def profile_pure(work: Path, repo: Path, hey: str, body_path: Path, seconds: float) -> list[str]:
    """The mlp8 endpoint of a server on a pure-Python copy of the sources, sampled by py-spy under hey -c 64.

    py-spy cannot see mypyc-compiled functions (their time shows in their Python callers), so the
    profiled server imports tensorgate from a copy without compiled modules whatever build is
    installed; the child's import path and the libraries mapped into the running server are checked."""
    copy = pure_copy(work / "pure")
    env = {"OMP_NUM_THREADS": "1", **pure_env(copy)}
    where = imported_from(env)
    if not where.startswith(str(copy)):
        return [f"_Not profiled: a child Python with the copy first on its path imported tensorgate from {where}._"]
    with contextlib.ExitStack() as stack:
        try:
            pure = stack.enter_context(
                ServerProcess("--model-repository", str(repo), "--log-level", "warning", env=env)
            )
        except (TimeoutError, RuntimeError) as exc:  # its log is in the message
            return [f"_Not profiled: the pure-Python copy's server did not start: {str(exc)[-800:]}_"]
        assert pure.process is not None
        pid = pure.process.pid
        compiled = compiled_code_in(pid)
        if compiled:
            return [f"_Not profiled: the pure-Python copy's server has compiled code mapped: {compiled}._"]
        endpoint = Endpoint(
            "tensorgate, mlp8, pure-Python copy", f"{pure.url}/v2/models/mlp8/infer", lambda: [pid], pid
        )
        run_hey([], hey, endpoint.url, body_path, 2, 64)  # warm, as the measured servers were
        runs: list[Run] = []
        raw = work / "profile.txt"
        drive = lambda: run_hey([], hey, endpoint.url, body_path, seconds, 64)  # noqa: E731
        if not record(pid, seconds, raw, lambda: runs.append(measure(endpoint, "hey", 64, drive))):
            return ["_Not profiled in this run: py-spy is not installed or could not attach._"]
    run = runs[0]
    return [
        f"The profiled server imports tensorgate from a pure-Python copy of the same sources (`{where}`; no "
        "compiled module mapped into it), so py-spy sees every function; the measured servers above run the "
        f"installed build. Under the profile (py-spy at 250 Hz, `hey -c 64 -z {seconds:g}s`) it served "
        f"{run.measure.rps:,.0f} req/s with {run.loop_us:.0f} µs of event-loop CPU per request.",
        "",
        *profile_table(raw),
        "",
        summary(raw, run.loop_us),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--profile-seconds", type=float, default=6.0, help="0 skips the py-spy profile of the pure-Python copy"
    )
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
    granian: GranianTensorgate | None = None
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
            granian = GranianTensorgate(repo, {"OMP_NUM_THREADS": "1"})
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
                granian_error = None
                try:
                    granian.wait_ready()
                except RuntimeError as exc:  # reported in the section; the rest is measured all the same
                    granian_error = str(exc)
                    granian.close()
                    granian = None
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
                    Endpoint(ON_MLP, f"{server.url}/v2/models/mlp/infer", lambda: [served], served),
                    Endpoint(ON_MLP8, f"{server.url}/v2/models/mlp8/infer", lambda: [served], served),
                    # Granian's worker runs the server and its asyncio loop on its main thread, Granian's
                    # HTTP in Rust threads beside it.
                    *(
                        Endpoint(
                            ON_GRANIAN,
                            f"{g.url}/v2/models/mlp/infer",
                            lambda g=g: tree(g.process.pid),
                            g.worker_pid(),
                        )
                        for g in ([] if granian is None else [granian])
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
                by_label = {e.label: e for e in endpoints}
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
                for label in ("echo, uvicorn", "echo, granian-asgi", ON_MLP, ON_GRANIAN, "hop, 1 front end"):
                    if label in by_label:
                        plan.append((by_label[label], "hey", 1, hey_drive(by_label[label], 1)))
                runs: list[Run] = []
                for round_index in range(args.rounds):
                    shift = round_index * len(plan) // max(1, args.rounds)
                    for e, client, c, drive in plan[shift:] + plan[:shift]:
                        runs.append(measure(e, client, c, drive))
                        print(f"round {round_index + 1}: {e.label}, {client}, c={c}: {runs[-1].measure.rps:,.0f}")
            # The profile comes after every other server has stopped, so it has the cores to itself
            # as far as this script goes (closing twice, here and below, is harmless).
            close_all(granian, echoes, hops)
            profile = (
                profile_pure(work, repo, hey, body_path, args.profile_seconds)
                if args.profile_seconds > 0
                else ["_Not profiled in this run (`--profile-seconds 0`)._"]
            )
    finally:
        close_all(granian, echoes, hops)

    rows = [median_of(runs, e.label, client, c) for e, client, c, _ in plan]
    echo_uv = median_of(runs, "echo, uvicorn", "hey", 64)
    mlp = median_of(runs, ON_MLP, "hey", 64)
    mlp8 = median_of(runs, ON_MLP8, "hey", 64)
    naive = median_of(runs, "naive Flask", "hey", 64)
    ours_mlp = median_of(runs, ON_MLP, "tensorgate bench", 64)
    echo_c1 = median_of(runs, "echo, uvicorn", "hey", 1)
    mlp_c1 = median_of(runs, ON_MLP, "hey", 1)
    granian_echo_c1 = median_of(runs, "echo, granian-asgi", "hey", 1)

    def per_round(endpoint: str, base: str) -> list[float]:
        """Per round: ``endpoint``'s req/s at 64 clients (hey) over ``base``'s in the same round."""
        mine = [r for r in runs if (r.endpoint, r.client, r.concurrency) == (endpoint, "hey", 64)]
        theirs = [r for r in runs if (r.endpoint, r.client, r.concurrency) == (base, "hey", 64)]
        return [a.measure.rps / b.measure.rps for a, b in zip(mine, theirs, strict=True)]

    def of_echo(run: Run) -> list[float]:
        """Per round: this endpoint's req/s over the uvicorn echo server's in the same round."""
        return per_round(run.endpoint, "echo, uvicorn")

    def rounds_text(ratios: list[float]) -> str:
        return f"**{statistics.median(ratios):.2f}** (per round {', '.join(f'{x:.2f}' for x in ratios)})"

    def overhead(mine: Run, echo: Run) -> tuple[float, str]:
        """The P50 at one connection over the echo server's, and the verdict against the bar."""
        extra = mine.measure.p50_ms - echo.measure.p50_ms
        return extra, mark(extra <= BAR_C1_OVERHEAD_MS + 1e-9)

    def on_granian_lines() -> list[str]:
        """tensorgate's app on Granian against the uvicorn listener and the echo servers, or why it is missing."""
        if granian_error is not None:
            return [f"- tensorgate's own HTTP app on Granian (ASGI): not measured, it did not start: {granian_error}"]
        of_mlp, of_asgi_echo = per_round(ON_GRANIAN, ON_MLP), per_round(ON_GRANIAN, "echo, granian-asgi")
        of_echo_uv = per_round(ON_GRANIAN, "echo, uvicorn")
        hey64, ours = median_of(runs, ON_GRANIAN, "hey", 64), median_of(runs, ON_GRANIAN, "tensorgate bench", 64)
        c1 = median_of(runs, ON_GRANIAN, "hey", 1)
        extra, verdict = overhead(c1, granian_echo_c1)
        return [
            f"- tensorgate's own HTTP app on Granian (ASGI, one worker, one runtime thread; the same server, "
            f"model and configuration) at 64 clients under hey: {rounds_text(of_mlp)} of the uvicorn "
            f"listener's MLP req/s, {rounds_text(of_asgi_echo)} of the bare Granian ASGI echo server's, "
            f"and {rounds_text(of_echo_uv)} of the bare uvicorn echo server's (bar {BAR_OF_ECHO}: "
            f"{mark(statistics.median(of_echo_uv) >= BAR_OF_ECHO)}). Server CPU per request "
            f"{hey64.server_us:.0f} µs against {mlp.server_us:.0f} µs on the uvicorn listener, event loop "
            f"{hey64.loop_us:.0f} µs against {mlp.loop_us:.0f} µs; under `tensorgate bench` "
            f"{ours.measure.rps:,.0f} req/s against {ours_mlp.measure.rps:,.0f}.",
            f"- One connection on Granian: P50 {c1.measure.p50_ms:.2f} ms against the Granian ASGI echo server's "
            f"{granian_echo_c1.measure.p50_ms:.2f} ms, **{extra:+.2f} ms** (bar: no worse than "
            f"+{BAR_C1_OVERHEAD_MS:g} ms: {verdict}); against the uvicorn echo server's, "
            f"{c1.measure.p50_ms - echo_c1.measure.p50_ms:+.2f} ms.",
        ]

    mlp_extra, mlp_c1_mark = overhead(mlp_c1, echo_c1)

    mlp_of_echo, granian_of_echo = of_echo(mlp), per_round("echo, granian-rsgi", "echo, uvicorn")
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
        "main thread (for the Granian echo servers it runs in a worker process, so only the total is given; "
        "for tensorgate on Granian it is the main thread of Granian's worker process, where the server and its "
        "asyncio loop run, Granian's HTTP parsing and writes running in Rust threads beside it).",
        "",
        *table(rows),
        "",
        f"- MLP at 64 clients (hey) over the bare uvicorn echo server: **{statistics.median(mlp_of_echo):.2f}** "
        f"(per round {', '.join(f'{x:.2f}' for x in mlp_of_echo)}); bar {BAR_OF_ECHO}: "
        f"{mark(statistics.median(mlp_of_echo) >= BAR_OF_ECHO)}. Server CPU per request "
        f"{mlp.server_us:.0f} µs against the echo server's {echo_uv.server_us:.0f} µs.",
        f"- Granian (RSGI) echo over uvicorn echo: {statistics.median(granian_of_echo):.2f} "
        f"(per round {', '.join(f'{x:.2f}' for x in granian_of_echo)}).",
        f"- MLP as a new user configured it (8 / 5 ms) over naive Flask, under hey: "
        f"**{statistics.median(naive_ratio):.1f}x** (per round {', '.join(f'{x:.1f}' for x in naive_ratio)}), "
        f"P99 {mlp8.measure.p99_ms:.1f} ms; bar {BAR_OF_NAIVE:g}x with P99 < {BAR_P99_MS:g} ms: "
        f"{mark(statistics.median(naive_ratio) >= BAR_OF_NAIVE and mlp8.measure.p99_ms < BAR_P99_MS)}. "
        f"With the bundled 64 / 2 ms: {mlp.measure.rps / naive.measure.rps:.1f}x, P99 {mlp.measure.p99_ms:.1f} ms.",
        f"- The same MLP server under `tensorgate bench` against hey: {ours_mlp.measure.rps / mlp.measure.rps:.2f}x "
        f"req/s; client CPU per request {ours_mlp.client_us:.0f} µs against hey's {mlp.client_us:.0f} µs.",
        f"- One connection (hey reports latency in 0.1 ms steps, so each P50 and their difference is known to "
        f"about 0.1 ms): MLP P50 {mlp_c1.measure.p50_ms:.2f} ms against the uvicorn echo server's "
        f"{echo_c1.measure.p50_ms:.2f} ms, an overhead of **{mlp_extra:+.2f} ms**; bar: no worse than "
        f"+{BAR_C1_OVERHEAD_MS:g} ms: {mlp_c1_mark}.",
        *on_granian_lines(),
        f"- Front ends and a hop, no model: two front ends on one port "
        f"{statistics.median(hop2_of_echo):.2f} of the uvicorn echo server's req/s "
        f"(per round {', '.join(f'{x:.2f}' for x in hop2_of_echo)}), one front end "
        f"{statistics.median(hop1_of_echo):.2f}. The back end's event loop spends {hop2.loop_us:.0f} µs per "
        f"request (two front ends; {hop1.loop_us:.0f} with one), against {mlp.loop_us:.0f} µs in tensorgate's "
        f"event loop for the MLP's whole request; at one connection the hop's P50 is "
        f"{hop_c1.measure.p50_ms:.2f} ms.",
        "",
    ]
    lines += ["### Where the event loop's time goes: tensorgate, mlp8, hey -c 64, a pure-Python copy", ""]
    lines += [*profile, ""]
    text = "\n".join(lines)
    (OUT / f"{STEM}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
