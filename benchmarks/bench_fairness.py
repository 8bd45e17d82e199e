"""Fair sharing between tenants under a flood, in one run.

A model whose capacity is known and small beside the event loop's (four instances of a Python
model that sleeps 40 ms a request, about a ResNet-50 row on a CPU: 100 requests/s), so the queue,
not the HTTP path, is what the tenants share. A steady tenant sends 25 requests/s (Poisson,
``tensorgate bench --rate``), half its fair share; a flooding tenant sends 500/s, ten times its
fair share of 50/s. Both clients run on the server's host: the flood's parsing and its 503s take
CPU from the same cores, which no queue order gives back (with 20 ms a request, twice the
traffic for the same ratios, the steady P99 ratio was 2.5x, the difference being that CPU).

Three cases, runs alternating in rounds: the steady tenant alone; beside the flood on a server
with fair queuing (the default); beside the flood on a server with ``fair_queuing: false``, where
one FIFO queue holds both. Bar: the steady tenant's P99 beside the flood, with fairness, at most
1.5x its P99 alone (median of the per-round ratios, with its 90 % bootstrap interval). Without
fairness the same flood shows the starvation.

Run: ``python benchmarks/bench_fairness.py [--quick]``; writes ``benchmarks/out/bench_fairness.md``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

from bench_security import HEADER, Run, bench, ratio_line, rows
from model_builders import write_python_model

from tensorgate.testing import ServerProcess

OUT = Path(__file__).parent / "out"
SERVICE_MS = 40
INSTANCES = 4
STEADY_RATE = 25
FLOOD_RATE = 500


def start(work: Path, stack: ExitStack, fair: bool) -> ServerProcess:
    repo = work / ("fair" if fair else "fifo") / "models"
    write_python_model(
        repo,
        "shared",
        max_batch_size=0,
        parameters={"delay_ms": SERVICE_MS},
        instance_group=[{"count": INSTANCES, "kind": "cpu"}],
        dynamic_batching={"max_queue_size": 1024},
    )
    config = repo.parent / "server.yaml"
    config.write_text(f"server: {{model_repository: {repo}, fair_queuing: {str(fair).lower()}, log_level: warning}}\n")
    return stack.enter_context(ServerProcess("--config", str(config), "--no-access-log"))


def steady(server: ServerProcess, seconds: float, flood: bool) -> tuple[Run, Run | None]:
    """The steady tenant's run, with the flooding tenant's alongside (started first, ended last)."""
    load = ("--rate", str(STEADY_RATE))
    if not flood:
        return bench(server.url, "shared", "v2-json", load, seconds, key=None, ca=None, tenant="steady"), None
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "flood.json"
        command = [sys.executable, "-m", "tensorgate", "bench", "shared", "-u", server.url, "--rate", str(FLOOD_RATE)]
        command += ["-z", f"{seconds + 2:g}s", "--tenant", "flood", "--json", str(report)]
        with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as loud:
            run = bench(server.url, "shared", "v2-json", load, seconds, key=None, ca=None, tenant="steady")
            loud.wait(timeout=seconds + 120)
        [flooded] = json.loads(report.read_text())["runs"]
    return run, Run(flooded["successes"] / flooded["elapsed_s"], float("nan"), float("nan"), flooded["errors"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer, shorter runs")
    args = parser.parse_args()
    seconds, rounds = (3.0, 3) if args.quick else (5.0, 5)
    alone: list[Run] = []
    fair: list[Run] = []
    fifo: list[Run] = []
    floods: dict[str, list[Run]] = {"fair": [], "fifo": []}
    with tempfile.TemporaryDirectory(prefix="tg-bench-fairness-") as tmp, ExitStack() as stack:
        servers = {"fair": start(Path(tmp), stack, True), "fifo": start(Path(tmp), stack, False)}
        cases = [("alone", "fair", False), ("fair", "fair", True), ("fifo", "fifo", True)]
        for index in range(rounds):
            for label, server, flood in cases if index % 2 == 0 else cases[::-1]:
                run, flooded = steady(servers[server], seconds, flood)
                {"alone": alone, "fair": fair, "fifo": fifo}[label].append(run)
                if flooded is not None:
                    floods[label].append(flooded)
    fair_ratios = [f.p99_ms / a.p99_ms for a, f in zip(alone, fair, strict=True)]
    fifo_ratios = [f.p99_ms / a.p99_ms for a, f in zip(alone, fifo, strict=True)]
    capacity = INSTANCES * 1000 // SERVICE_MS
    lines = [
        "## Fair sharing between tenants",
        "",
        f"`benchmarks/bench_fairness.py`: a Python model of {INSTANCES} instances taking {SERVICE_MS} ms a request "
        f"({capacity} requests/s). A steady tenant at {STEADY_RATE}/s (Poisson, {seconds:g} s runs) alone, beside a "
        f"tenant flooding at {FLOOD_RATE}/s (ten times its fair share of {capacity // 2}/s) with fair queuing, and "
        f"beside the same flood with `fair_queuing: false`; {rounds} rounds, the order alternating.",
        "",
        ratio_line("the steady tenant's P99 beside the flood, fair queuing, over alone", fair_ratios, 1.5, False),
        ratio_line("the same without fair queuing (FIFO), over alone", fifo_ratios, None),
        "",
        *HEADER,
        *rows("steady alone", alone),
        *rows("steady beside the flood, fair", fair),
        *rows("steady beside the flood, FIFO", fifo),
        *rows("the flood, fair", floods["fair"]),
        *rows("the flood, FIFO", floods["fifo"]),
        "",
        "Errors are the requests answered 503 (the queue full): with fair queuing only the flood's; "
        "without it the steady tenant's too.",
        "",
    ]
    OUT.mkdir(exist_ok=True)
    (OUT / "bench_fairness.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
