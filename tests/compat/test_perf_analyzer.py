"""Triton's perf_analyzer, the C++ load tool teams run first, against ``tensorgate serve`` unchanged.

Every mode must finish with exit 0 and no error: HTTP and gRPC at concurrency 1 to 4 with batches of
8, system shared memory over both (perf_analyzer cleans CUDA regions up too), gRPC streaming, and
JSON tensors over HTTP. perf_analyzer reads the model's metadata and configuration, the server's
extensions and its statistics between windows, so each run also checks those answers as its parser
reads them. The tool comes from ``fetch_perf_analyzer.sh`` (``make test`` runs it first); the
windows are short (300 ms, stability not asked for: the host is shared and this is no benchmark).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tensorgate.testing import ServerProcess

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tensorgate-tests" / "perf-analyzer"
PERF_ANALYZER = CACHE / "perf_analyzer"
WINDOWS = ["-p", "300", "--max-trials", "5", "--stability-percentage", "1000"]


@pytest.fixture(scope="module")
def perf_analyzer() -> Path:
    if not PERF_ANALYZER.exists():
        pytest.skip(
            f"perf_analyzer is not set up at {PERF_ANALYZER}: tests/compat/fetch_perf_analyzer.sh fetches it "
            "(make test runs it; it needs PyPI and the Debian mirror)"
        )
    return PERF_ANALYZER


@pytest.mark.parametrize(
    ("protocol", "extra"),
    [
        ("http", []),
        ("grpc", []),
        ("http", ["--shared-memory", "system"]),
        ("grpc", ["--shared-memory", "system"]),
        ("grpc", ["--streaming"]),
        ("http", ["--input-tensor-format", "json", "--output-tensor-format", "json"]),
    ],
    ids=["http", "grpc", "http-shm", "grpc-shm", "grpc-streaming", "http-json"],
)
def test_perf_analyzer_runs_every_mode_without_an_error(
    perf_analyzer: Path, triton_server: ServerProcess, protocol: str, extra: list[str]
) -> None:
    url = triton_server.http_address if protocol == "http" else triton_server.grpc_address
    command = [str(perf_analyzer), "-m", "simple", "-u", url, "-i", protocol, "-b", "8"]
    command += ["--concurrency-range", "1:4", *WINDOWS, *extra]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False)
    report = done.stdout + done.stderr
    assert done.returncode == 0, report[-3000:]
    assert "rror" not in report, report[-3000:]  # "Error" / "error" anywhere is a failed run
    throughput = re.findall(r"Concurrency: (\d+), throughput: ([\d.]+) infer/sec", done.stdout)
    assert [int(c) for c, _ in throughput] == [1, 2, 3, 4], done.stdout[-3000:]
    assert all(float(rate) > 0 for _, rate in throughput)
    # Its server-side view comes from the statistics extension, read between windows.
    assert re.search(r"Server:\s+Inference count: [1-9]", done.stdout), done.stdout[-3000:]
