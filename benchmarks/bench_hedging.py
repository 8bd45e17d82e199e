"""Hang detection: what it costs when nothing is wrong, and how soon a hang's requests are answered.

1. **Cost.** The bundled ``mlp`` served twice side by side, once as shipped (hang detection on, the
   default) and once with ``health_check.hang_detection: false``; ``hey`` drives each with 64
   connections in alternating rounds. The ratio of req/s (on over off) per round: hang detection
   arms and cancels one timer per batch and keeps each instance's durations, and nothing more.
2. **Time to answer.** A Python model (2 ms a call) in four worker processes under six clients;
   one instance starts sleeping 20 s per call. Each request the hung instance took is answered by
   another once its batch is suspect: the latency of those requests is the time from the hang's
   start to their answer.

Run: ``python benchmarks/bench_hedging.py [--seconds 5] [--rounds 4]``; writes
``benchmarks/out/bench_hedging.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).parent))

from _chaos import CHAOS_MODEL, WIDTH
from bench_client_vs_hey import ensure_hey, run_hey
from bench_front_end import Endpoint, Run, measure

from tensorgate.bench.inputs import Tensor
from tensorgate.bench.targets.http_tensor import v2_json_body
from tensorgate.examples import build_example_repository
from tensorgate.testing import ServerProcess

OUT = Path(__file__).parent / "out"
STEM = Path(__file__).stem
CLIENTS = 64
SETTINGS = ("on", "off")


def cost(seconds: float, rounds: int, work: Path) -> list[str]:
    hey, note = ensure_hey()
    if hey is None:
        return [f"_{note}_"]
    repos = {setting: build_example_repository(work / f"repo-{setting}") for setting in SETTINGS}
    config_path = repos["off"] / "mlp" / "config.yaml"
    config = yaml.safe_load(config_path.read_text())
    config["health_check"] = {"hang_detection": False}
    config_path.write_text(yaml.safe_dump(config))
    rng = np.random.default_rng(0)
    body_path = work / "body.json"
    body_path.write_bytes(v2_json_body((Tensor("features", "FP32", rng.uniform(-1, 1, (1, 16)).astype(np.float32)),)))
    env = {"OMP_NUM_THREADS": "1"}
    runs: list[tuple[int, str, Run]] = []
    with (
        ServerProcess("--model-repository", str(repos["on"]), "--log-level", "warning", env=env) as on,
        ServerProcess("--model-repository", str(repos["off"]), "--log-level", "warning", env=env) as off,
    ):
        servers = {"on": on, "off": off}
        for server in servers.values():  # warm both
            run_hey([], hey, f"{server.url}/v2/models/mlp/infer", body_path, 1, CLIENTS)
        for round_no in range(rounds):
            for setting in SETTINGS if round_no % 2 == 0 else SETTINGS[::-1]:
                server = servers[setting]
                assert server.process is not None
                pid = server.process.pid
                url = f"{server.url}/v2/models/mlp/infer"
                endpoint = Endpoint(setting, url, lambda pid=pid: [pid], pid)
                drive = lambda url=url: run_hey([], hey, url, body_path, seconds, CLIENTS)  # noqa: E731
                runs.append((round_no, setting, measure(endpoint, "hey", CLIENTS, drive)))
    ratios = []
    for round_no in range(rounds):
        pair = {s: r for n, s, r in runs if n == round_no}
        ratios.append(pair["on"].measure.rps / pair["off"].measure.rps)
    lines = [
        f"The bundled `mlp`, hang detection on (the default) and off, side by side; {rounds} rounds of "
        f"{seconds:g} s, order alternating, `hey` with {CLIENTS} connections (V2 JSON over HTTP).",
        "",
        "| hang detection | req/s (median) | P99 ms | server CPU µs/req | errors |",
        "|---|---:|---:|---:|---:|",
    ]
    for setting in SETTINGS:
        mine = sorted((r for _, s, r in runs if s == setting), key=lambda r: r.measure.rps)
        mid = mine[len(mine) // 2]
        errors = sum(r.measure.errors for r in mine)
        lines.append(
            f"| {setting} | {mid.measure.rps:,.0f} | {mid.measure.p99_ms:.2f} | {mid.server_us:.0f} | {errors} |"
        )
    within = min(ratios) <= 1.0 <= max(ratios)
    verdict = "within the host's noise" if within else ("faster" if min(ratios) > 1 else "slower")
    lines += [
        "",
        f"On over off, req/s: {statistics.median(ratios):.3f}x (rounds {min(ratios):.3f}x to {max(ratios):.3f}x): "
        f"**{verdict}**.",
    ]
    return lines


async def time_to_answer(work: Path, seconds_after: float = 8.0) -> list[str]:
    repo, control = work / "hang-repo", work / "control"
    control.mkdir()
    (repo / "m" / "1").mkdir(parents=True)
    (repo / "m" / "1" / "model.py").write_text(CHAOS_MODEL)
    tensor = {"datatype": "FP32", "shape": [-1, WIDTH]}
    config = {
        "backend": "python",
        "max_batch_size": 16,
        "inputs": [{"name": "INPUT", **tensor}],
        "outputs": [{"name": "OUTPUT", **tensor}],
        "parameters": {"control": str(control), "hang_s": 20.0},
        "instance_group": [{"count": 4, "isolation": "process"}],
        "dynamic_batching": {"max_queue_delay_ms": 1},
    }
    (repo / "m" / "config.yaml").write_text(yaml.safe_dump(config))
    body = {"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, WIDTH], "data": [1.0] * WIDTH}]}
    latencies: list[tuple[float, float, int]] = []  # (sent, seconds, status)
    stop = asyncio.Event()
    with ServerProcess("--model-repository", str(repo), "--log-level", "warning") as server:

        async def client() -> None:
            async with httpx.AsyncClient(timeout=15.0) as http:
                while not stop.is_set():
                    sent = time.monotonic()
                    try:
                        response = await http.post(f"{server.url}/v2/models/m/infer", json=body)
                        status = response.status_code
                    except httpx.HTTPError:
                        status = 0
                    latencies.append((sent, time.monotonic() - sent, status))

        tasks = [asyncio.create_task(client()) for _ in range(6)]
        await asyncio.sleep(3.0)  # each instance learns its pace
        hang_at = time.monotonic()
        (control / "hang-2").touch()
        await asyncio.sleep(seconds_after)
        stop.set()
        await asyncio.gather(*tasks)
    after = [(s, d, c) for s, d, c in latencies if s + d >= hang_at]
    before = sorted(d for s, d, _ in latencies if s + d < hang_at)
    hedged = sorted(d for _, d, _ in after if d > 0.5)
    failed = sum(1 for _, _, c in after if c != 200)
    p99_before = before[int(0.99 * (len(before) - 1))] * 1000 if before else 0.0
    lines = [
        "A Python model (2 ms a call) in four worker processes, six clients; one instance starts sleeping "
        "20 s per call. The requests it took are answered by another instance once their batch runs "
        "past its pace (1 s floor, the default).",
        "",
        f"- before the hang: P99 {p99_before:.1f} ms over {len(before)} requests;",
        f"- after it: {len(after)} requests, {failed} failed; {len(hedged)} took the hung instance and were "
        + (
            f"answered elsewhere after {min(hedged):.2f} to {max(hedged):.2f} s (median "
            f"{statistics.median(hedged):.2f} s) from being sent."
            if hedged
            else "none was slower than 0.5 s."
        ),
    ]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        lines = [f"## Hang detection ({STEM}.py)", "", "### Its cost when nothing is wrong", ""]
        lines += cost(args.seconds, args.rounds, work)
        lines += ["", "### From a hang to its requests answered", ""]
        lines += asyncio.run(time_to_answer(work))
    (OUT / f"{STEM}.md").write_text("\n".join([*lines, ""]))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
