"""Goodput at 1.5x overload with deadlines: deadline admission and earliest-deadline-first order
against FIFO with timeouts, in one run.

One server, two copies of one model (one instance of a Python model that sleeps 10 ms a request:
100 requests/s), every request with a deadline of 100 ms (``default_timeout_ms``):

- ``fifo``: the default queue; a request waits its turn and times out (504) when its deadline
  passes, in the queue or while it runs;
- ``admitted``: ``dynamic_batching: {order: deadline, deadline_admission: true}``; a request the
  queue ahead of it says cannot make its deadline is refused at once (503 + Retry-After).

Each is sent 150 requests/s (Poisson, ``tensorgate bench --rate``), in rounds alternating the
order. Goodput is the fraction of the requests sent that were answered within their deadline.
Bar: the admitted model's goodput at least 1.3x FIFO's (median of the per-round ratios, with its
90 % bootstrap interval).

Run: ``python benchmarks/bench_deadline_admission.py [--quick]``; writes
``benchmarks/out/bench_deadline_admission.md``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

from bench_security import HEADER, Run, bench, ratio_line, rows
from model_builders import write_python_model

from tensorgate.testing import ServerProcess

OUT = Path(__file__).parent / "out"
SERVICE_MS = 10
DEADLINE_MS = 100
CAPACITY = 1000 // SERVICE_MS
RATE = CAPACITY * 3 // 2


def goodput(run: Run, seconds: float) -> float:
    sent = run.rps * seconds + sum(run.errors.values())
    return run.rps * seconds / sent if sent else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer, shorter runs")
    args = parser.parse_args()
    seconds, rounds = (3.0, 3) if args.quick else (5.0, 5)
    runs: dict[str, list[Run]] = {"fifo": [], "admitted": []}
    with tempfile.TemporaryDirectory(prefix="tg-bench-deadline-") as tmp:
        repo = Path(tmp) / "models"
        for name, policy in (("fifo", {}), ("admitted", {"order": "deadline", "deadline_admission": True})):
            batching = {"default_timeout_ms": DEADLINE_MS, "max_queue_size": 1024, **policy}
            write_python_model(
                repo, name, max_batch_size=0, parameters={"delay_ms": SERVICE_MS}, dynamic_batching=batching
            )
        with ServerProcess("--model-repository", str(repo), "--no-access-log", "--log-level", "warning") as server:
            for index in range(rounds):
                order = ["fifo", "admitted"] if index % 2 == 0 else ["admitted", "fifo"]
                for name in order:
                    load = ("--rate", str(RATE))
                    runs[name].append(bench(server.url, name, "v2-json", load, seconds, key=None, ca=None))
    fifo = [goodput(r, seconds) for r in runs["fifo"]]
    admitted = [goodput(r, seconds) for r in runs["admitted"]]
    ratios = [a / f for a, f in zip(admitted, fifo, strict=True)]

    def errors(run: Run) -> str:
        return ", ".join(f"{kind} {count}" for kind, count in sorted(run.errors.items())) or "none"

    lines = [
        "## Deadline admission at 1.5x overload",
        "",
        f"`benchmarks/bench_deadline_admission.py`: one instance of a Python model taking {SERVICE_MS} ms a "
        f"request ({CAPACITY} requests/s), sent {RATE} requests/s (Poisson, {seconds:g} s runs), each with a "
        f"deadline of {DEADLINE_MS} ms; FIFO with timeouts against `order: deadline` with `deadline_admission`, "
        f"{rounds} rounds, the order alternating. Goodput: the fraction of requests sent answered within "
        "their deadline.",
        "",
        ratio_line("goodput with deadline admission over FIFO's", ratios, 1.3),
        "",
        "| round | FIFO goodput | admitted goodput | FIFO errors | admitted errors |",
        "|---|---:|---:|---|---|",
        *(
            f"| {i + 1} | {f:.3f} | {a:.3f} | {errors(rf)} | {errors(ra)} |"
            for i, (f, a, rf, ra) in enumerate(zip(fifo, admitted, runs["fifo"], runs["admitted"], strict=True))
        ),
        "",
        *HEADER,
        *rows("FIFO", runs["fifo"]),
        *rows("admitted", runs["admitted"]),
        "",
        "FIFO's errors are 504s, requests that waited out their deadline (some on the instance, its time "
        "spent for nothing); with admission they are 503s, refused at once, and the instance's time goes to "
        "requests that make it.",
        "",
    ]
    OUT.mkdir(exist_ok=True)
    (OUT / "bench_deadline_admission.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
