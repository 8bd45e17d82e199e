"""Where a server's event loop spends its time: a py-spy sample of it, summed by stage of the request path.

``py-spy record --format raw`` gives one line per distinct stack with its sample count. Each
sample of the event-loop thread (every stack not rooted in a ``threading`` bootstrap) is put in
the stage of its deepest frame that belongs to one; samples where uvloop's ``run_forever`` is the
leaf (waiting in epoll, or reading and writing sockets in C) are counted apart. Compiled (mypyc)
functions are invisible to py-spy, so the picture is only complete on the pure-Python build
(``TENSORGATE_PURE_PYTHON=1 make install``).
"""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

STAGES = (
    ("decode the request (V2 JSON to tensors)", r"v2_codec\.py|tensor_codec\.py|json_tensors\.py"),
    ("validate inputs", r"validation\.py"),
    ("queue, batch and schedule", r"tensorgate/scheduling/"),
    ("hand batches to the instance thread", r"thread_instance\.py|batch_tensors\.py"),
    ("metrics, access log, tracing", r"tensorgate/observability/|metrics"),
    ("model service, router, version", r"tensorgate/models/"),
    ("security gate", r"tensorgate/security/"),
    ("HTTP protocol: uvicorn and its subclass", r"listener\.py|uvicorn/"),
    ("HTTP app: routing, body, response", r"tensorgate/protocols/http/"),
    ("asyncio", r"asyncio/"),
)
_LINE = re.compile(r":\d+\)$")


def py_spy() -> str | None:
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


def record(pid: int, seconds: float, out: Path, load: Callable[[], object]) -> bool:
    """Sample ``pid`` while ``load()`` runs; False when py-spy is missing or cannot attach."""
    spy = py_spy()
    if spy is None:
        return False
    command = [spy, "record", "-p", str(pid), "-d", f"{seconds:g}", "-r", "250", "-f", "raw", "-o", str(out)]
    sampler = subprocess.Popen([*command, "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    load()
    return sampler.wait(timeout=seconds + 60) == 0 and out.exists()


def stages(raw: Path) -> tuple[dict[str, int], int]:
    """Samples per stage of the event-loop thread's active time, and the samples spent inside uvloop."""
    counts: collections.Counter[str] = collections.Counter()
    in_uvloop = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or "Thread._bootstrap" in stack:
            continue
        frames = [_LINE.sub(")", f) for f in stack.split(";")]
        if frames[-1].startswith("Runner.run"):
            in_uvloop += int(n)
            continue
        stage = next(
            (name for frame in reversed(frames) for name, pattern in STAGES if re.search(pattern, frame)), "other"
        )
        counts[stage] += int(n)
    return dict(counts), in_uvloop


def table(raw: Path) -> list[str]:
    counts, in_uvloop = stages(raw)
    active = sum(counts.values())
    if not active:
        return ["_py-spy took no samples of the event loop._"]
    lines = ["| stage (deepest frame) | share of the event loop's Python time |", "|---|---:|"]
    lines += [f"| {name} | {n / active:.0%} |" for name, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    lines += [
        "",
        f"{active} samples in Python; another {in_uvloop} ({in_uvloop / (active + in_uvloop):.0%} of the "
        "thread's) with uvloop's `run_forever` as the leaf: waiting in epoll, or socket reads and writes in C.",
    ]
    return lines
