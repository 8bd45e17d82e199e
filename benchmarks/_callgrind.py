"""Instructions per request of a served model, counted by callgrind: a cost this host's noise cannot move.

Timings on this shared 2-core host swing 10-15 % from one second to the next, so a cost near 5 % of
throughput takes dozens of runs to place, and even then lands anywhere from 3 % to 9 %. Callgrind
counts the instructions the server executes instead: repeatable to about half a percent (its
threads run one at a time, so batches form a little differently from run to run), whatever else
the machine is doing. The server runs under it with instrumentation off through start-up and a
warm-up, on for exactly ``requests`` requests from ``hey``, then off again.

What it does not see: cache misses and stalls (instructions, not cycles), and the rate. Under
callgrind the server is ~30x slower, so work done once per flush interval or per millisecond (the
access log's write and its timestamp) is shared by fewer requests than at full speed, and the
figure overstates those parts.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
from pathlib import Path

from bench_serving import hey_outcomes

from tensorgate.testing import ServerProcess

WARMUP_REQUESTS = 500


def available() -> bool:
    return shutil.which("valgrind") is not None and shutil.which("callgrind_control") is not None


def instructions_per_request(
    args: list[str], out: Path, url: str, body: Path, requests: int, concurrency: int
) -> tuple[float, int]:
    """Serve with ``args`` under callgrind; returns (instructions per successful request, errors).

    ``url`` is a path (``/v2/models/m/infer``), joined to the server's address. ``requests`` should
    be a multiple of ``concurrency``: ``hey -n`` sends an equal share per worker, rounded down.
    """
    wrapper = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    with ServerProcess(*args, wrapper=wrapper, ready_timeout_s=600.0) as server:
        assert server.process is not None
        pid = str(server.process.pid)
        _hey(server.url + url, body, WARMUP_REQUESTS, concurrency)
        subprocess.run(["callgrind_control", "-i", "on", pid], check=True, capture_output=True)
        ok, errors = _hey(server.url + url, body, requests, concurrency)
        subprocess.run(["callgrind_control", "-i", "off", pid], check=True, capture_output=True)
        # SIGINT, not the SIGTERM drain: nothing is in flight, and callgrind writes its file at exit.
        server.process.send_signal(signal.SIGINT)
        server.process.wait(120)
    match = re.search(r"^totals: (\d+)", out.read_text(), re.MULTILINE)
    if match is None or ok == 0:
        raise RuntimeError(f"callgrind counted nothing ({ok} requests answered); see {out}")
    return int(match.group(1)) / ok, errors


def _hey(url: str, body: Path, requests: int, concurrency: int) -> tuple[int, int]:
    """Exactly ``requests`` requests (``-n``), where ``bench_serving.hey`` runs for a duration."""
    command = ["hey", "-n", str(requests), "-c", str(concurrency), "-m", "POST", "-T", "application/json"]
    output = subprocess.run([*command, "-D", str(body), url], capture_output=True, text=True, timeout=900).stdout
    return hey_outcomes(output)
