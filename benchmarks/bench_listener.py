"""The HTTP listener's stand-ins for uvicorn's code, each against uvicorn's own in one run.

``tensorgate/protocols/http/listener.py`` replaces one piece of uvicorn's request cycle:
``_BodyParts`` keeps a request body as the chunks it came in (uvicorn grows a bytearray and copies
it on every read). Such a part stays only where a benchmark in the same run shows it
paying (a second one, ``_OneWriteCycle``, which wrote a sized response's head and body in one
write, did not pay in this benchmark's run of 2026-12-07 and was dropped: benchmarks/HISTORY.md).
Two ``tensorgate serve`` processes over the same repository are up at once: as shipped, and
without ``_BodyParts`` (the same server with the listener's switch off, started through
``_uvicorn_cycle.py``). Each scenario is driven by ``tensorgate bench`` against each server in
turn, the order rotated per round, every server's event loop pinned to one CPU per round, the CPU
alternating (``_placement.py``):

- the MLP at 64 clients, V2 JSON: small bodies and responses, where the write per response counts;
- the ResNet-shaped input (FP32 [1, 3, 224, 224], 600 KB) on a model that costs next to nothing,
  10 clients, V2 binary: bodies that arrive in many chunks;
- the same input as V2 JSON (about 3 MB a body), 4 clients.

For each run: requests/s, P50 and P99, and the server's CPU and its event loop's CPU per request.
A part pays when, in every round, the event loop's CPU per request is lower with it than without
it (a saving beyond the rounds' spread), and requests/s do not fall.

Run: ``python benchmarks/bench_listener.py [--seconds 5] [--rounds 4] [--quick]``; writes
``benchmarks/out/bench_listener.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).parent))

from _models import resnet_input_stub
from _placement import pin_event_loops
from bench_serving import write_onnx_model

from tensorgate.examples import build_example_repository
from tensorgate.testing import ServerProcess

OUT = Path(__file__).parent / "out"
STEM = Path(__file__).stem
HERE = Path(__file__).parent

SHIPPED = "as shipped"
# Server label -> the part _uvicorn_cycle.py turns off (None: the listener as shipped).
SERVERS: dict[str, str | None] = {SHIPPED: None, "without _BodyParts": "body-parts"}
PARTS = {"_BodyParts": "without _BodyParts"}
STUB_CONFIG = {"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_ms": 5}}


@dataclass(frozen=True)
class Scenario:
    label: str
    model: str
    protocol: str
    concurrency: int


SCENARIOS = (
    Scenario("MLP, V2 JSON, 64 clients", "mlp", "v2-json", 64),
    Scenario("ResNet-shaped input, V2 binary (600 KB), 10 clients", "resnet_stub", "v2-binary", 10),
    Scenario("ResNet-shaped input, V2 JSON (3 MB), 4 clients", "resnet_stub", "v2-json", 4),
)


@dataclass(frozen=True)
class Run:
    scenario: str
    server: str
    rps: float
    p50_ms: float
    p99_ms: float
    server_us: float  # the server's CPU per request, every thread
    loop_us: float  # its event-loop thread's CPU per request
    errors: int


def process_cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def loop_cpu(pid: int) -> float:
    """CPU seconds of a process's main thread (its event loop), from /proc."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drive(server: ServerProcess, scenario: Scenario, seconds: float, out: Path) -> Any:
    """One ``tensorgate bench`` run (no warm-up, so every request served is counted); its JSON run."""
    command = [sys.executable, "-m", "tensorgate", "bench", scenario.model, "-u", server.url]
    command += ["--protocol", scenario.protocol, "-c", str(scenario.concurrency), "-z", f"{seconds:g}s"]
    command += ["--json", str(out)]
    subprocess.run(command, capture_output=True, check=True, timeout=seconds + 60)
    return json.loads(out.read_text())["runs"][0]


def measure(name: str, server: ServerProcess, scenario: Scenario, seconds: float, out: Path) -> Run:
    assert server.process is not None
    pid = server.process.pid
    cpu0, loop0 = process_cpu(pid), loop_cpu(pid)
    run = drive(server, scenario, seconds, out)
    cpu, loop = process_cpu(pid) - cpu0, loop_cpu(pid) - loop0
    served = max(1, run["successes"])
    return Run(
        scenario.label,
        name,
        run["throughput_rps"],
        run["latency_s"]["p50"] * 1000,
        run["latency_s"]["p99"] * 1000,
        cpu / served * 1e6,
        loop / served * 1e6,
        sum(run["errors"].values()),
    )


def write_repository(root: Path) -> Path:
    repo = build_example_repository(root)
    write_onnx_model(repo, "resnet_stub", resnet_input_stub(), STUB_CONFIG)
    return repo


def median(runs: list[Run], attribute: str) -> float:
    return statistics.median(getattr(r, attribute) for r in runs)


def section(runs: list[Run], rounds: int, seconds: float) -> list[str]:
    lines = [
        f"## The HTTP listener's stand-ins for uvicorn's code ({STEM}.py)",
        "",
        "Two `tensorgate serve` processes up at once over one repository: the listener as shipped, and the "
        "same server with `_BodyParts` turned off (uvicorn's bytearray instead). "
        f"{rounds} round(s); in each, every scenario drives each "
        f"server in turn with `tensorgate bench -z {seconds:g}s` (no warm-up: every request served counts), "
        "the server order rotated per round, both event loops pinned to one CPU per round, alternating. "
        f"Client and servers share this machine's {os.cpu_count()} cores. CPU per request: the server's "
        "CPU seconds (every thread) and its event-loop thread's over the run, over the requests it answered. "
        "Medians over the rounds.",
        "",
        "| scenario | server | req/s | P50 ms | P99 ms | server CPU µs/req | event loop µs/req | errors |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for scenario in SCENARIOS:
        for name in SERVERS:
            mine = [r for r in runs if (r.scenario, r.server) == (scenario.label, name)]
            lines.append(
                f"| {scenario.label} | {name} | {median(mine, 'rps'):,.0f} | {median(mine, 'p50_ms'):.2f} "
                f"| {median(mine, 'p99_ms'):.2f} | {median(mine, 'server_us'):,.0f} | {median(mine, 'loop_us'):,.0f} "
                f"| {sum(r.errors for r in mine)} |"
            )
    lines += ["", "Per round, the shipped server's figure over the one without the part (below 1: the part saves):", ""]
    lines += ["| part | scenario | event loop CPU per request | req/s |", "|---|---|---|---|"]
    verdicts = []
    for part, without in PARTS.items():
        pays = []
        for scenario in SCENARIOS:
            by_round = {
                name: [r for r in runs if (r.scenario, r.server) == (scenario.label, name)]
                for name in (SHIPPED, without)
            }
            loop = [a.loop_us / b.loop_us for a, b in zip(by_round[SHIPPED], by_round[without], strict=True)]
            rps = [a.rps / b.rps for a, b in zip(by_round[SHIPPED], by_round[without], strict=True)]
            lines.append(
                f"| {part} | {scenario.label} | **{statistics.median(loop):.3f}** "
                f"({', '.join(f'{x:.3f}' for x in loop)}) | {statistics.median(rps):.3f} "
                f"({', '.join(f'{x:.3f}' for x in rps)}) |"
            )
            if max(loop) < 1 and statistics.median(rps) >= 1:
                pays.append(scenario.label)
        verdicts.append(
            f"- {part}: "
            + (f"**pays** ({'; '.join(pays)})." if pays else "**does not pay** in any scenario of this run.")
        )
    lines += [
        "",
        *verdicts,
        "",
        "A part pays in a scenario when the event loop's CPU per request is lower with it in every round and "
        "the median req/s does not fall.",
        "",
    ]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each run")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="one round of half-second runs (a smoke check)")
    args = parser.parse_args()
    seconds, rounds = (0.5, 1) if args.quick else (args.seconds, args.rounds)
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="tg-bench-") as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        repo = write_repository(work / "repo")
        servers = {
            name: stack.enter_context(
                ServerProcess(
                    "--model-repository",
                    str(repo),
                    "--log-level",
                    "warning",
                    env={"OMP_NUM_THREADS": "1"},
                    wrapper=() if part is None else (sys.executable, str(HERE / "_uvicorn_cycle.py"), part),
                    wait_ready=False,  # both load at once; each is waited for below
                )
            )
            for name, part in SERVERS.items()
        }
        for server in servers.values():
            server.wait_ready()
        names = list(servers)
        pids = [s.process.pid for s in servers.values() if s.process is not None]
        if not args.quick:  # pools, the allocator and the batcher warmed on every server first
            for scenario in SCENARIOS:
                for name in names:
                    drive(servers[name], scenario, 1.0, work / "run.json")
        for round_index in range(rounds):
            cpu = pin_event_loops(pids, round_index)
            for scenario in SCENARIOS:
                shift = round_index % len(names)
                for name in names[shift:] + names[:shift]:
                    started = time.perf_counter()
                    run = measure(name, servers[name], scenario, seconds, work / "run.json")
                    runs.append(run)
                    print(
                        f"round {round_index + 1} (loops on CPU {cpu}): {scenario.label}, {name}: "
                        f"{run.rps:,.0f} req/s, loop {run.loop_us:,.0f} µs/req "
                        f"({time.perf_counter() - started:.1f} s)",
                        flush=True,
                    )
    text = "\n".join(section(runs, rounds, seconds))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{STEM}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
