"""perf_analyzer (Triton's load tool) and ``tensorgate bench`` on the same model and server, in one run.

Triton's example model ``simple`` (two INT32 ``[16]`` inputs, ``config.pbtxt`` as Triton ships it,
rebuilt by ``tests/compat/triton_repository.py``) served by ``tensorgate serve``; at concurrency 4,
over HTTP (binary tensors, as perf_analyzer sends them) and gRPC, each client in turn, the order
alternating per round. perf_analyzer's figure is its ``Throughput`` at concurrency 4 (its own
stabilised windows); tensorgate bench's is its counted requests per second over the same length.
The two clients differ (C++ with libcurl and grpc++, Python with its own HTTP/1.1 and HTTP/2
clients), so the ratio says how far one client's figure can be carried to the other's, not which
server is faster.

Run: ``python benchmarks/bench_perf_analyzer.py [--seconds 5] [--rounds 3]``; needs perf_analyzer
set up by ``tests/compat/fetch_perf_analyzer.sh``. Writes ``benchmarks/out/bench_perf_analyzer.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "compat"))

from triton_repository import build_triton_repository  # noqa: E402

from tensorgate.testing import ServerProcess  # noqa: E402

OUT = Path(__file__).parent / "out"
STEM = Path(__file__).stem
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tensorgate-tests" / "perf-analyzer"
PERF_ANALYZER = CACHE / "perf_analyzer"
CONCURRENCY = 4


def perf_analyzer(server: ServerProcess, protocol: str, seconds: float) -> float:
    url = server.http_address if protocol == "http" else server.grpc_address
    window_ms = str(int(seconds * 1000 / 3))  # three windows make one measurement
    command = [str(PERF_ANALYZER), "-m", "simple", "-u", url, "-i", protocol, "--concurrency-range", str(CONCURRENCY)]
    command += ["-p", window_ms, "--max-trials", "6", "--stability-percentage", "20"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds * 10 + 60, check=False)
    found = re.search(r"Concurrency: \d+, throughput: ([\d.]+) infer/sec", done.stdout)
    if done.returncode != 0 or found is None:
        raise RuntimeError(
            f"perf_analyzer {protocol} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    return float(found.group(1))


def tensorgate_bench(server: ServerProcess, protocol: str, seconds: float, report: Path) -> float:
    url = server.url if protocol == "http" else server.grpc_address
    wire = "v2-binary" if protocol == "http" else "grpc"
    command = [sys.executable, "-m", "tensorgate", "bench", "simple", "-u", url, "--protocol", wire]
    command += ["-c", str(CONCURRENCY), "-z", f"{seconds:g}s", "--warmup", "1s", "--json", str(report)]
    subprocess.run(command, capture_output=True, text=True, timeout=seconds + 120, check=True)
    return float(json.loads(report.read_text())["runs"][0]["throughput_rps"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    lines = [f"## perf_analyzer and tensorgate bench, side by side ({STEM}.py)", ""]
    if not PERF_ANALYZER.exists():
        lines += [f"_perf_analyzer is not set up ({PERF_ANALYZER}): run tests/compat/fetch_perf_analyzer.sh._", ""]
        (OUT / f"{STEM}.md").write_text("\n".join(lines))
        return 0
    figures: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        repo = build_triton_repository(Path(tmp) / "repo")
        with ServerProcess("--model-repository", str(repo), "--log-level", "warning", "--no-access-log") as server:
            for round_no in range(args.rounds):
                clients = ["perf_analyzer", "tensorgate bench"]
                if round_no % 2:
                    clients.reverse()
                for protocol in ("http", "grpc"):
                    for client in clients:
                        if client == "perf_analyzer":
                            rate = perf_analyzer(server, protocol, args.seconds)
                        else:
                            rate = tensorgate_bench(server, protocol, args.seconds, Path(tmp) / "report.json")
                        figures.setdefault((protocol, client), []).append(rate)
                        print(f"round {round_no + 1}: {protocol} {client}: {rate:,.0f} infer/s", flush=True)
    lines += [
        f"Triton's `simple` (INT32 add/sub, `config.pbtxt` as shipped, no dynamic batching) on one `tensorgate "
        f"serve`; concurrency {CONCURRENCY}, batch 1; {args.rounds} rounds of about {args.seconds:g} s per client "
        "and protocol, the clients' order alternating; medians, with the rounds' range.",
        "",
        "| protocol | perf_analyzer infer/s | tensorgate bench req/s | perf_analyzer / tensorgate bench |",
        "|---|---:|---:|---:|",
    ]
    for protocol in ("http", "grpc"):
        theirs, ours = figures[(protocol, "perf_analyzer")], figures[(protocol, "tensorgate bench")]
        ratios = [a / b for a, b in zip(theirs, ours, strict=True)]
        lines.append(
            f"| {protocol} | {statistics.median(theirs):,.0f} ({min(theirs):,.0f}-{max(theirs):,.0f}) "
            f"| {statistics.median(ours):,.0f} ({min(ours):,.0f}-{max(ours):,.0f}) "
            f"| {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |"
        )
    lines.append("")
    text = "\n".join(lines)
    (OUT / f"{STEM}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
