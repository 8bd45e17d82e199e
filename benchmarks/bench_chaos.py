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
    print("| chaos run | |")
    print("|---|---|")
    print("\n".join(report.table()))
    for violation in report.violations:
        print("VIOLATION:", violation)
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
