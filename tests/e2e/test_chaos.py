"""The chaos run's short form (benchmarks/_chaos.py): 40 seconds of traffic from 16 clients over
HTTP, gRPC and gRPC streaming on an ONNX model, a Python model in worker processes and a pipeline,
while one of each fault lands at a time drawn from a fixed seed: kill -9 of a worker, a hung
instance, a slow one, poison requests, clients that hang up mid-request, a hot swap, a burst past
the queue bound. Every answer is checked against the models run in-process, and every failure
must be one the faults promise (the poison requests, the burst's 503s)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from _chaos import KINDS, Chaos, build_repository

from tensorgate.testing import ServerProcess

SEED = 11
DURATION_S = 40.0


def test_a_seeded_chaos_run_loses_no_request(tmp_path: Path) -> None:
    repo, _ = build_repository(tmp_path)
    arguments = ("--model-repository", str(repo), "--model-control", "poll", "--repository-poll-secs", "1")
    with ServerProcess(*arguments, "--no-access-log") as server:
        chaos = Chaos(
            tmp_path, server.url, server.grpc_address, server.metrics_url, server.process.pid, SEED, DURATION_S
        )
        report = asyncio.run(chaos.run())
    table = "\n".join(report.table())
    assert report.violations == [], table
    assert all(report.faults[kind] == 1 for kind in KINDS), table
    causes = report.by_cause()
    assert causes["poison"] == 3 and causes["wrong"] == 0 and causes["failed"] == 0, table
    assert causes["ok"] > 1000, table  # the clients kept being answered throughout
    assert report.disconnects == 2
