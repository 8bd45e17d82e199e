"""Does compiling the request path with mypyc pay? The installed build against a pure-Python copy, in one run.

Two ``tensorgate serve`` processes serve the bundled ``mlp`` side by side: one imports the installed
build (its request-path modules compiled by mypyc, when ``setup.py`` compiled them), the other a
copy of the same sources with no compiled module (``_profile.pure_copy``). The MLP is the model
where the server's own Python is nearly all a request costs, so it shows the most a compiler can
give. Each round drives both, in alternating order, with the same clients: ``hey`` (V2 JSON over
HTTP, 64 connections) and ``tensorgate bench --protocol grpc`` (64 calls in flight). For each:
requests/s and the server's CPU per request (every thread). The verdict per protocol: compiled
pays when every round's req/s ratio is above 1 and its CPU-per-request ratio below 1 (the rounds'
spread is the host's noise; a ratio whose range holds 1 is within it).

Run: ``python benchmarks/bench_compiled.py [--seconds 5] [--rounds 4]``; writes
``benchmarks/out/bench_compiled.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from _profile import compiled_code_in, pure_copy, pure_env
from _side_by_side import Driver, SideBySide, spread
from bench_client_vs_hey import Measure, ensure_hey, run_hey

from tensorgate.bench.inputs import Tensor
from tensorgate.bench.targets.http_tensor import v2_json_body
from tensorgate.examples import build_example_repository
from tensorgate.testing import ServerProcess

OUT = Path(__file__).parent / "out"
STEM = Path(__file__).stem
CLIENTS = 64
BUILDS = ("compiled", "pure")


def run_grpc(address: str, seconds: float, out: Path) -> Measure:
    """``tensorgate bench`` over gRPC (random inputs of the metadata's shape, batch 1)."""
    import subprocess

    command = [sys.executable, "-m", "tensorgate", "bench", "mlp", "--protocol", "grpc", "-u", address]
    command += ["-c", str(CLIENTS), "-z", f"{seconds:g}s", "--json", str(out)]
    subprocess.run(command, capture_output=True, check=True, timeout=seconds + 60)
    run = json.loads(out.read_text())["runs"][0]
    latency = run["latency_s"]
    return Measure(
        "tensorgate bench",
        run["throughput_rps"],
        latency["p50"] * 1000,
        latency["p99"] * 1000,
        latency["mean"] * 1000,
        sum(run["errors"].values()),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    lines = [f"## Compiled (mypyc) against pure Python ({STEM}.py)", ""]
    hey, note = ensure_hey()
    if hey is None:
        (OUT / f"{STEM}.md").write_text("\n".join([*lines, f"_{note}_", ""]))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        repo = build_example_repository(work / "repo")
        copy = pure_copy(work / "pure")
        rng = np.random.default_rng(0)
        body = v2_json_body((Tensor("features", "FP32", rng.uniform(-1, 1, (1, 16)).astype(np.float32)),))
        body_path = work / "body.json"
        body_path.write_bytes(body)
        common = ("--model-repository", str(repo), "--log-level", "warning")
        threads = {"OMP_NUM_THREADS": "1"}
        with (
            ServerProcess(*common, env=threads) as compiled,
            ServerProcess(*common, env={**threads, **pure_env(copy)}) as pure,
        ):
            servers = {"compiled": compiled, "pure": pure}
            pids = {}
            for build, server in servers.items():
                assert server.process is not None
                pids[build] = server.process.pid
            mapped = {build: compiled_code_in(pid) for build, pid in pids.items()}
            if not mapped["compiled"]:
                lines += [
                    "_The installed build has no compiled module (a pure install, or mypyc is not used): "
                    "nothing to compare._",
                    "",
                ]
                (OUT / f"{STEM}.md").write_text("\n".join(lines))
                return 0
            assert not mapped["pure"], f"the pure copy loaded compiled code: {mapped['pure']}"

            def http(build: str) -> Callable[[], Measure]:
                url = f"{servers[build].url}/v2/models/mlp/infer"
                return lambda: run_hey([], hey, url, body_path, args.seconds, CLIENTS)

            def grpc(build: str) -> Callable[[], Measure]:
                address = servers[build].grpc_address
                return lambda: run_grpc(address, args.seconds, work / f"grpc-{build}.json")

            drivers: dict[str, Driver] = {"HTTP V2 JSON (hey)": http, "gRPC (tensorgate bench)": grpc}
            for build in BUILDS:  # warm both: first calls, the allocator, the caches
                run_hey([], hey, f"{servers[build].url}/v2/models/mlp/infer", body_path, 1, CLIENTS)
                run_grpc(servers[build].grpc_address, 1, work / "warm.json")
            sides = SideBySide(BUILDS, pids, CLIENTS)
            sides.run(drivers, args.rounds)
    lines += [
        f"The bundled `mlp` served by the installed build (mypyc: {len(mapped['compiled'])} compiled "
        f"librar{'y' if len(mapped['compiled']) == 1 else 'ies'} mapped) and by a pure-Python copy of the same "
        f"sources, side by side; {args.rounds} rounds of {args.seconds:g} s per client and build, the builds' "
        f"order alternating; {CLIENTS} clients. Server CPU is every thread of the process.",
        "",
        "| protocol | build | req/s (median) | P50 ms | P99 ms | server CPU µs/req | errors |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    verdicts, notes = [], []
    for protocol in drivers:
        lines += sides.rows(protocol)
        rps, cpu = sides.ratios(protocol)
        pays = min(rps) > 1.0 and max(cpu) < 1.0
        within = min(rps) <= 1.0 <= max(rps)
        verdict = "pays" if pays else ("within the host's noise" if within else "does not pay")
        verdicts.append(pays)
        notes.append(
            f"- {protocol}: compiled over pure, req/s {spread(rps)}, server CPU per request {spread(cpu)}: "
            f"**{verdict}**."
        )
    lines += ["", *notes]
    lines += [
        "",
        "Verdict: mypyc "
        + ("pays on both protocols." if all(verdicts) else "does not pay beyond the noise on every protocol.")
        + (
            " It pays on " + ", ".join(p for p, ok in zip(drivers, verdicts, strict=True) if ok) + "."
            if any(verdicts)
            else ""
        ),
        "",
    ]
    (OUT / f"{STEM}.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
