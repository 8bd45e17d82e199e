"""Did a change cost speed? This tree's request path against an earlier revision's, in one run.

Two ``tensorgate serve`` processes serve the bundled ``mlp`` side by side: one runs a pure-Python
copy of this tree's package, the other the package as it was at ``--baseline`` (``git archive``),
so both are pure Python and only the code differs. Each round drives both, in alternating order,
with the same clients at 64 connections: V2 JSON and V1 ``:predict`` over HTTP (``hey``) and gRPC
(``tensorgate bench``). For each: requests/s and the server's CPU per request. The verdict per
protocol: a loss is a round-by-round req/s ratio (this tree over the baseline) whose whole range
lies below 1; a range that holds 1 is within the host's noise.

Run: ``python benchmarks/bench_revisions.py [--baseline REV] [--seconds 5] [--rounds 4]``; writes
``benchmarks/out/bench_revisions.md``.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from _profile import pure_copy, pure_env
from _side_by_side import Driver, SideBySide, spread
from bench_client_vs_hey import Measure, ensure_hey, run_hey
from bench_compiled import run_grpc

from tensorgate.bench.inputs import Tensor
from tensorgate.bench.targets.http_tensor import v2_json_body
from tensorgate.examples import build_example_repository
from tensorgate.testing import ServerProcess

OUT = Path(__file__).parent / "out"
STEM = Path(__file__).stem
CLIENTS = 64
TREES = ("this tree", "baseline")
ROOT = Path(__file__).resolve().parent.parent


def export(revision: str, dest: Path) -> str:
    """The ``tensorgate`` package as it was at ``revision``, under ``dest``; returns the commit."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", revision], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    archive = subprocess.run(["git", "archive", commit, "tensorgate"], cwd=ROOT, capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    (dest / "tensorgate" / "_build.json").write_text(json.dumps({"compiled": {}, "pure": True}))
    return commit


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default="HEAD~1", help="a git revision (default: the last commit's parent)")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    lines = [f"## This tree against an earlier revision ({STEM}.py)", ""]
    hey, note = ensure_hey()
    if hey is None:
        (OUT / f"{STEM}.md").write_text("\n".join([*lines, f"_{note}_", ""]))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        # Only the mlp: an earlier revision may not know the configuration of later examples.
        examples = build_example_repository(work / "examples")
        repo = work / "repo"
        shutil.copytree(examples / "mlp", repo / "mlp")
        copies = {"this tree": pure_copy(work / "current")}
        (work / "baseline").mkdir()
        commit = export(args.baseline, work / "baseline")
        copies["baseline"] = work / "baseline"
        rng = np.random.default_rng(0)
        features = rng.uniform(-1, 1, (1, 16)).astype(np.float32)
        v2_body = work / "v2.json"
        v2_body.write_bytes(v2_json_body((Tensor("features", "FP32", features),)))
        v1_body = work / "v1.json"
        v1_body.write_text(json.dumps({"instances": features.tolist()}))
        common = ("--model-repository", str(repo), "--log-level", "warning", "--no-access-log")
        threads = {"OMP_NUM_THREADS": "1"}
        with (
            ServerProcess(*common, env={**threads, **pure_env(copies["this tree"])}) as current,
            ServerProcess(*common, env={**threads, **pure_env(copies["baseline"])}) as baseline,
        ):
            servers = {"this tree": current, "baseline": baseline}
            pids = {}
            for tree, server in servers.items():
                assert server.process is not None
                pids[tree] = server.process.pid

            def v2(tree: str) -> Callable[[], Measure]:
                url = f"{servers[tree].url}/v2/models/mlp/infer"
                return lambda: run_hey([], hey, url, v2_body, args.seconds, CLIENTS)

            def v1(tree: str) -> Callable[[], Measure]:
                url = f"{servers[tree].url}/v1/models/mlp:predict"
                return lambda: run_hey([], hey, url, v1_body, args.seconds, CLIENTS)

            def grpc(tree: str) -> Callable[[], Measure]:
                address = servers[tree].grpc_address
                return lambda: run_grpc(address, args.seconds, work / f"grpc-{tree.replace(' ', '-')}.json")

            drivers: dict[str, Driver] = {
                "HTTP V2 JSON (hey)": v2,
                "HTTP V1 :predict (hey)": v1,
                "gRPC (tensorgate bench)": grpc,
            }
            for tree in TREES:  # warm both
                for driver in drivers.values():
                    driver(tree)()
            sides = SideBySide(TREES, pids, CLIENTS)
            sides.run(drivers, args.rounds)
    lines += [
        f"The bundled `mlp` served by a pure-Python copy of this tree and by the package as it was at "
        f"`{commit}`, side by side; {args.rounds} rounds of {args.seconds:g} s per client and tree, the trees' "
        f"order alternating; {CLIENTS} clients. Server CPU is every thread of the process.",
        "",
        "| protocol | tree | req/s (median) | P50 ms | P99 ms | server CPU µs/req | errors |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    notes = []
    for protocol in drivers:
        lines += sides.rows(protocol)
        rps, cpu = sides.ratios(protocol)
        if max(rps) < 1.0:
            verdict = "slower"
        elif min(rps) > 1.0:
            verdict = "faster"
        else:
            verdict = "within the host's noise"
        notes.append(
            f"- {protocol}: this tree over `{commit}`, req/s {spread(rps)}, server CPU per request {spread(cpu)}: "
            f"**{verdict}**."
        )
    lines += ["", *notes, ""]
    (OUT / f"{STEM}.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
