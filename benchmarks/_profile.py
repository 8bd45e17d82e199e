"""Where a server's event loop spends its time: a py-spy sample of it, summed by stage of the request path.

``py-spy record --format raw`` gives one line per distinct stack with its sample count. Each
sample of the event-loop thread (every stack not rooted in a ``threading`` bootstrap) is put in
the stage of its deepest frame that belongs to one; samples where uvloop's ``run_forever`` is the
leaf (waiting in epoll, or reading and writing sockets in C) are counted apart. Compiled (mypyc)
functions are invisible to py-spy, so the picture is only complete on pure Python: ``pure_copy``
makes a copy of the package's sources without any compiled module, for a server started with
``pure_env`` (whatever build is installed), and ``compiled_code_in`` checks the running server.
"""

from __future__ import annotations

import collections
import json
import os
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


def pure_copy(dest: Path) -> Path:
    """The ``tensorgate`` package's sources and package data copied under ``dest``, without any compiled
    module (or the mypyc build's manifest, replaced by one that says pure); returns ``dest``."""
    import tensorgate

    source = Path(tensorgate.__file__).parent
    skip = shutil.ignore_patterns("*.so", "*.pyd", "*.c", "__pycache__", "_build.json")
    shutil.copytree(source, dest / "tensorgate", ignore=skip)
    (dest / "tensorgate" / "_build.json").write_text(json.dumps({"compiled": {}, "pure": True}))
    return dest


def pure_env(copy: Path) -> dict[str, str]:
    """The environment that makes a child Python import ``tensorgate`` from ``copy``: first on the path,
    and no working directory in front of it (``PYTHONSAFEPATH``: ``python -m`` run from the repository
    root would otherwise import the checkout, compiled modules and all)."""
    path = [str(copy), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    return {"PYTHONPATH": os.pathsep.join(path), "PYTHONSAFEPATH": "1"}


def imported_from(env: dict[str, str]) -> str:
    """Where a child Python started with ``env`` imports ``tensorgate`` (and its server) from."""
    probe = "import tensorgate, tensorgate.server; print(tensorgate.__file__)"
    done = subprocess.run(
        [sys.executable, "-c", probe], env={**os.environ, **env}, capture_output=True, text=True, timeout=120
    )
    return done.stdout.strip() or done.stderr.strip()[-300:]


def compiled_code_in(pid: int) -> list[str]:
    """The mypyc-compiled libraries of tensorgate mapped into a running process (none on pure Python)."""
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    found = {line.split()[-1] for line in maps if "mypyc" in line or ("/tensorgate/" in line and ".so" in line)}
    return sorted(found)


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


def summary(raw: Path, loop_us: float) -> str:
    """One sentence from the figures: the largest stages, as shares of the Python time and as µs per
    request (the event loop's measured CPU per request split in proportion to the thread's samples:
    an estimate, as py-spy also counts a thread that is runnable but waiting for a core)."""
    counts, in_uvloop = stages(raw)
    active = sum(counts.values())
    if not active:
        return "py-spy took no samples of the event loop."
    total = active + in_uvloop
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:3]
    parts = [f"**{name}** {n / active:.0%} (about {loop_us * n / total:.0f} µs)" for name, n in top]
    return (
        f"In short: the event loop spent {loop_us:.0f} µs of CPU per request; the largest stages of its Python "
        f"time are {', '.join(parts[:-1])} and {parts[-1]}, together {sum(n for _, n in top) / active:.0%}; "
        f"uvloop's C code (socket reads and writes, epoll) had {in_uvloop / total:.0%} of the samples (about "
        f"{loop_us * in_uvloop / total:.0f} µs). The µs split the measured CPU per request in proportion to "
        "the samples, an estimate."
    )


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
