"""What hot swaps, traffic splits and shadows cost the requests being served, in one run.

1. Hot swap: the bundled MLP in poll mode, 16 clients (``tensorgate bench``), runs without swaps
   alternating with runs during which a new version is copied in every ``duration / 10`` seconds
   (10 swaps a run: each loads and warms a version beside the serving one, switches, drains the
   old). Bar: P99 with swaps within 1.5x of P99 without, and zero errors.
2. Traffic split: one server, three copies of the MLP with two identical versions each: without a
   traffic section, with ``weights: {1: 0, 2: 100}`` (the split's routing alone) and with
   ``weights: {1: 90, 2: 10}``; 64 clients, runs in rounds of three. Bar: the 90/10 split costs
   under 2 % of requests/s (the median of the per-round ratios, with their range); the routing's
   share of that cost is reported beside it.
3. Shadow: one server, a fast Python model with a shadow version that sleeps 1 s per batch
   (``fraction: 0.1``) beside the same model with no shadow; 16 clients, alternating. Reported: the
   served P99 with the shadow over without, and whether the runs' ranges overlap (the shadow runs
   on its own instance and sheds past its cap, so it should be within the host's noise).

Run: ``python benchmarks/bench_lifecycle.py [--quick]``; writes ``benchmarks/out/bench_lifecycle.md``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

from model_builders import VERSION_MODEL, write_python_model

from tensorgate.examples import build_example_repository
from tensorgate.testing import ServerProcess

OUT = Path(__file__).parent / "out"


@dataclass(frozen=True)
class Run:
    label: str
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int


def bench(url: str, model: str, clients: int, seconds: float, label: str) -> Run:
    """One closed-loop run of ``tensorgate bench`` (V2 JSON), read back from its JSON report."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "tensorgate", "bench", "-m", model, "-u", url, "-c", str(clients)]
        command += ["-z", f"{seconds:g}s", "--json", str(report)]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, timeout=seconds + 120)
        [run] = json.loads(report.read_text())["runs"]
    latency = run["latency_s"]
    return Run(label, run["throughput_rps"], latency["p50"] * 1000, latency["p99"] * 1000, sum(run["errors"].values()))


def row(run: Run) -> str:
    return f"| {run.label} | {run.rps:,.0f} | {run.p50_ms:.2f} | {run.p99_ms:.2f} | {run.errors} |"


HEADER = ["| run | req/s | P50 ms | P99 ms | errors |", "|---|---:|---:|---:|---:|"]


def verdict(met: bool) -> str:
    return "**met**" if met else "**not met**"


def placed(met: bool, this: list[float], baseline: list[float]) -> str:
    """``verdict``, except that a miss whose runs' range overlaps the baseline runs' range is one the
    host's noise cannot place (one slow run on a shared host moves a median of four)."""
    if met or max(min(this), min(baseline)) > min(max(this), max(baseline)):
        return verdict(met)
    return (
        f"**within the host's noise**: the runs range {min(this):.1f}-{max(this):.1f} ms against "
        f"{min(baseline):.1f}-{max(baseline):.1f} ms without, so this run cannot place it"
    )


def swap_section(work: Path, seconds: float, rounds: int, lines: list[str]) -> None:
    repo = build_example_repository(work / "swap")
    mlp = repo / "mlp"
    args = ("--model-repository", str(repo), "--model-control", "poll", "--repository-poll-secs", "0.2")
    runs: dict[str, list[Run]] = {"steady": [], "swaps": []}
    swaps_done = 0
    with ServerProcess(*args, "--no-access-log") as server:
        next_version = [2]

        def swap_every(interval: float, count: int, done: threading.Event) -> None:
            for _ in range(count):
                time.sleep(interval)
                staged = work / f"staged-{next_version[0]}"
                shutil.copytree(mlp / "1", staged)
                staged.rename(mlp / str(next_version[0]))
                next_version[0] += 1
            done.set()

        order = ["steady", "swaps", "swaps", "steady"] * rounds
        for index, kind in enumerate(order):
            label = f"{index + 1}: {'10 swaps' if kind == 'swaps' else 'no swap'}"
            if kind == "steady":
                runs[kind].append(bench(server.url, "mlp", 16, seconds, label))
                continue
            done = threading.Event()
            thread = threading.Thread(target=swap_every, args=(seconds / 11, 10, done))
            thread.start()
            runs[kind].append(bench(server.url, "mlp", 16, seconds, label))
            thread.join()
            swaps_done += 10
        ready = httpx_json(f"{server.url}/v2/models/mlp")["versions"]
    steady = statistics.median(r.p99_ms for r in runs["steady"])
    swapping = statistics.median(r.p99_ms for r in runs["swaps"])
    errors = sum(r.errors for rs in runs.values() for r in rs)
    ratio = swapping / steady
    lines += [
        "### 1. Hot swap under load (MLP, 16 clients, poll mode)",
        "",
        f"{len(order)} runs of {seconds:g} s, alternating (no swap, swaps, swaps, no swap); "
        f"{swaps_done} versions copied in during the swap runs; serving version {ready} at the end.",
        "",
        *HEADER,
        *(row(r) for r in sorted(runs["steady"] + runs["swaps"], key=lambda r: int(r.label.split(":")[0]))),
        "",
        f"- P99 with swaps / without (medians): **{ratio:.2f}x** "
        f"(per run: without {', '.join(f'{r.p99_ms:.1f}' for r in runs['steady'])} ms; "
        f"with {', '.join(f'{r.p99_ms:.1f}' for r in runs['swaps'])} ms); errors {errors}.",
        "- Bar (P99 within 1.5x, zero errors): "
        + (
            verdict(False)
            if errors
            else placed(ratio <= 1.5, [r.p99_ms for r in runs["swaps"]], [r.p99_ms for r in runs["steady"]])
        )
        + ".",
        "",
    ]


def httpx_json(url: str) -> dict[str, object]:
    import httpx

    return dict(httpx.get(url, timeout=10.0).json())


# The split's variants: no traffic section (the latest version serves all), every request through
# the split's routing to one version (its cost alone), and 90/10 (two versions batching apart).
SPLITS = {"plain": None, "routed": {"weights": {1: 0, 2: 100}}, "split": {"weights": {1: 90, 2: 10}}}


def split_section(work: Path, seconds: float, rounds: int, lines: list[str]) -> None:
    repo = work / "split"
    source = build_example_repository(work / "split-source") / "mlp"
    for name, traffic in SPLITS.items():
        shutil.copytree(source, repo / name)
        shutil.copytree(source / "1", repo / name / "2")
        config = yaml.safe_load((repo / name / "config.yaml").read_text())
        config["version_policy"] = {"all": True}
        if traffic is not None:
            config["traffic"] = traffic
        (repo / name / "config.yaml").write_text(yaml.safe_dump(config))
    names = list(SPLITS)
    rounds_run: list[dict[str, Run]] = []
    runs: list[Run] = []
    with ServerProcess("--model-repository", str(repo), "--no-access-log") as server:
        for index in range(rounds * 2):  # the order rotates, so no variant always runs first
            order = names[index % 3 :] + names[: index % 3]
            this: dict[str, Run] = {}
            for name in order:
                this[name] = bench(server.url, name, 64, seconds, f"{len(runs) + 1}: {name}")
                runs.append(this[name])
            rounds_run.append(this)
    split_costs = [1 - r["split"].rps / r["plain"].rps for r in rounds_run]
    routed_costs = [1 - r["routed"].rps / r["plain"].rps for r in rounds_run]
    cost, routed = statistics.median(split_costs), statistics.median(routed_costs)
    lines += [
        "### 2. Traffic split (MLP, two identical versions, 64 clients)",
        "",
        f"{len(runs)} runs of {seconds:g} s against one server, in {len(rounds_run)} rounds of three, the order "
        "rotating: *plain* (no traffic section: version 2 serves all), *routed* (weights 0/100: every "
        "request through the split's routing, to one version) and *split* (weights 90/10: both versions "
        "serve, each batching its own requests on its own instance).",
        "",
        *HEADER,
        *(row(r) for r in runs),
        "",
        f"- Cost of the 90/10 split in req/s (median of {len(split_costs)} rounds): **{cost * 100:+.1f} %** "
        f"(rounds ranged {min(split_costs) * 100:+.1f} % to {max(split_costs) * 100:+.1f} %).",
        f"- Of which the routing (weights read, a version drawn, the rollout told): **{routed * 100:+.1f} %** "
        f"(rounds ranged {min(routed_costs) * 100:+.1f} % to {max(routed_costs) * 100:+.1f} %); the rest is "
        "two versions batching apart, on two instances sharing the same cores.",
        f"- Bar (under 2 %): {verdict(cost < 0.02)}"
        + (
            "; the rounds' range spans the bar, so the host's noise cannot place it."
            if min(split_costs) < 0.02 < max(split_costs)
            else "."
        ),
        "",
    ]


SHADOW_SLEEP_S = 1.0


def shadow_section(work: Path, seconds: float, rounds: int, lines: list[str]) -> None:
    repo = work / "shadow"
    for name, traffic in (("plain", None), ("shadowed", {"shadow": {"version": 2, "fraction": 0.1}})):
        model_dir = write_python_model(
            repo,
            name,
            code=VERSION_MODEL.format(delay_s=0.0, fail_every=0),
            **({"traffic": traffic} if traffic else {}),
        )
        if traffic is not None:  # the shadow version: the same model, sleeping per batch
            (model_dir / "2").mkdir()
            (model_dir / "2" / "model.py").write_text(VERSION_MODEL.format(delay_s=SHADOW_SLEEP_S, fail_every=0))
    runs: list[Run] = []
    with ServerProcess("--model-repository", str(repo), "--no-access-log") as server:
        for index in range(rounds * 2):
            order = ("plain", "shadowed") if index % 2 == 0 else ("shadowed", "plain")
            for name in order:
                runs.append(bench(server.url, name, 16, seconds, f"{len(runs) + 1}: {name}"))
        shadow = httpx_json(f"{server.url}/v2/models/shadowed/rollout")["shadow"]
    with_plain = [r.p99_ms for r in runs if r.label.endswith("plain")]
    with_shadow = [r.p99_ms for r in runs if r.label.endswith("shadowed")]
    plain, shadowed = statistics.median(with_plain), statistics.median(with_shadow)
    # Within the noise: its median no higher than the slowest run without, or the two ranges overlap.
    within = shadowed <= max(with_plain) or max(min(with_shadow), min(with_plain)) <= min(
        max(with_shadow), max(with_plain)
    )
    lines += [
        f"### 3. Shadow that sleeps {SHADOW_SLEEP_S:g} s per batch (fast Python model, 16 clients)",
        "",
        f"{len(runs)} runs of {seconds:g} s against one server, alternating; the shadow compared "
        f"{shadow['compared']} copies and shed the rest past its cap of 64 in flight.",
        "",
        *HEADER,
        *(row(r) for r in runs),
        "",
        f"- Served P99 with the shadow / without (medians): **{shadowed / plain:.2f}x** "
        f"({shadowed:.2f} against {plain:.2f} ms).",
        f"- Bar (P99 within the host's noise of no shadow): {verdict(within)}: the shadowed runs' P99 "
        f"{min(with_shadow):.1f}-{max(with_shadow):.1f} ms against {min(with_plain):.1f}-{max(with_plain):.1f} ms "
        "without.",
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs, one round")
    args = parser.parse_args()
    seconds, rounds = (4.0, 1) if args.quick else (10.0, 2)
    lines = [
        "## bench_lifecycle",
        "",
        "What hot swaps, a traffic split and a shadow cost the requests being served; every "
        "comparison in one run, alternating. Client: `tensorgate bench` (closed loop, V2 JSON).",
        "",
    ]
    with tempfile.TemporaryDirectory(prefix="bench-lifecycle-") as tmp:
        work = Path(tmp)
        swap_section(work, seconds * 1.5, rounds, lines)
        split_section(work, seconds, rounds, lines)
        shadow_section(work, seconds, rounds, lines)
    OUT.mkdir(exist_ok=True)
    (OUT / "bench_lifecycle.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
