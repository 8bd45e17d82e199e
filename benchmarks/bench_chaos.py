"""The chaos run for minutes: 16 clients over HTTP and gRPC (unary and streaming) on an ONNX model,
a Python model in worker processes and a pipeline of both, while faults land at random times from
a seed (benchmarks/_chaos.py). Prints the table of faults, requests, answers and failures by cause,
and exits 1 if any invariant broke.

    .venv/bin/python benchmarks/bench_chaos.py --minutes 5 --seed 7
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _chaos import KINDS, Chaos, build_repository

from tensorgate.testing import ServerProcess

OUT = Path(__file__).resolve().parent / "out"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--faults-per-minute", type=float, default=len(KINDS) / 2, help="of all kinds together")
    args = parser.parse_args()
    duration_s = args.minutes * 60
    per_kind = max(1, round(args.faults_per_minute * args.minutes / len(KINDS)))
    with tempfile.TemporaryDirectory(prefix="tensorgate-chaos-") as tmp:
        root = Path(tmp)
        repo, _ = build_repository(root)
        arguments = ("--model-repository", str(repo), "--model-control", "poll", "--repository-poll-secs", "1")
        with ServerProcess(*arguments, "--no-access-log") as server:
            run = Chaos(
                root,
                server.url,
                server.grpc_address,
                server.metrics_url,
                server.process.pid,
                args.seed,
                duration_s,
                per_kind,
            )
            report = asyncio.run(run.run())
    lines = [
        f"## Chaos: faults at random times under mixed traffic ({Path(__file__).name})",
        "",
        "An ONNX model (dynamic batching), a Python model in three worker processes and their pipeline, "
        "served with default fault settings; 16 clients (6 HTTP, 6 gRPC unary, 4 gRPC streams) while a driver "
        "seeded as below injects each fault kind at random times. Every 2xx answer is checked against the "
        "models run in-process; every failure is classed by cause.",
        "",
        "| | |",
        "|---|---|",
        *report.table(),
        "",
    ]
    lines += [f"- VIOLATION: {v}" for v in report.violations]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "bench_chaos.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
