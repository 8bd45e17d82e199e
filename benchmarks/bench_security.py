"""What authentication, TLS and rate limits cost the requests being served, in one run.

1. API keys: the bundled MLP at 64 clients (V2 JSON, ``tensorgate bench``), a server that checks an
   API key on every request against one with no authentication, both up at once, runs alternating
   in pairs (plain-keyed, keyed-plain, ...). Bar: keyed keeps at least 0.97 of plain's requests/s
   (the median of the per-pair ratios, with its 90 % bootstrap interval).
2. TLS: the same pairs against a server with TLS (and no authentication): the MLP at 64 clients and
   a ResNet-18-shaped model (random weights) at 10 clients, V2 binary over HTTP and gRPC. Reported,
   no bar: the client's handshakes and record encryption run on the same two cores as the server,
   so the figure is what TLS costs the host, not only the server.
3. A noisy tenant: a quiet key at 100 requests/s (open loop, Poisson) alone, alternating with the
   same while a second key limited to 100 requests/s sends 1,000 (ten times its rate, the rest
   answered 429 before any body is decoded). Bar: the quiet client's P99 with the noisy one at most
   1.5x its P99 alone (median of the per-pair ratios).

Run: ``python benchmarks/bench_security.py [--quick]``; writes ``benchmarks/out/bench_security.md``.
"""

from __future__ import annotations

import argparse
import functools
import json
import resource
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

from _ceiling import RESNET_INSTANCES
from _models import export_resnet18
from bench_protocols import median_interval, span
from bench_serving import write_onnx_model
from tls_material import Authority, key_line

from tensorgate.examples import build_example_repository
from tensorgate.testing import ServerProcess

OUT = Path(__file__).parent / "out"
QUIET_KEY = "quiet-client-key-0123456789"
NOISY_KEY = "noisy-client-key-0123456789"
QUIET_RATE = 100
NOISY_LIMIT = 100  # requests/s the noisy key is allowed (burst as large)
NOISY_RATE = 10 * NOISY_LIMIT
WARMUP_S = 0.5


@dataclass(frozen=True)
class Run:
    rps: float  # successful requests per second
    p50_ms: float
    p99_ms: float
    errors: dict[str, int]
    answered: float = 0.0  # requests answered, the warm-up's counted at the run's rate
    server_us: float = float("nan")  # the server's CPU per answered request, warm-up included
    client_us: float = float("nan")  # the client's, likewise


def cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def with_cpu(server: ServerProcess, run: Callable[[], Run]) -> Run:
    """``run()``, with the server's and the client's CPU per request over it."""
    assert server.process is not None
    server0, client0 = cpu_s(server.process.pid), children_cpu_s()
    result = run()
    answered = result.answered or 1
    return replace(
        result,
        server_us=(cpu_s(server.process.pid) - server0) / answered * 1e6,
        client_us=(children_cpu_s() - client0) / answered * 1e6,
    )


def bench(
    url: str,
    model: str,
    protocol: str,
    load: Sequence[str],
    seconds: float,
    *,
    key: str | None,
    ca: Path | None,
    tenant: str | None = None,
) -> Run:
    """One run of ``tensorgate bench``, read back from its JSON report."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "tensorgate", "bench", model, "-u", url, "--protocol", protocol, *load]
        command += ["-z", f"{seconds:g}s", "--warmup", f"{WARMUP_S:g}s", "--json", str(report)]
        command += [] if key is None else ["--api-key", key]
        command += [] if ca is None else ["--cacert", str(ca)]
        command += [] if tenant is None else ["--tenant", tenant]
        done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 120)
        if done.returncode not in (0, 1) or not report.exists():
            raise RuntimeError(f"tensorgate bench failed ({done.returncode}):\n{done.stderr[-4000:]}")
        [run] = json.loads(report.read_text())["runs"]
    latency = run["latency_s"]
    rps = run["successes"] / run["elapsed_s"] if run["elapsed_s"] else float("nan")
    return Run(
        rps,
        (latency.get("p50") or float("nan")) * 1000,
        (latency.get("p99") or float("nan")) * 1000,
        run["errors"],
        rps * (run["elapsed_s"] + WARMUP_S),
    )


@dataclass
class Servers:
    plain: ServerProcess
    keyed: ServerProcess  # API keys, no TLS
    tls: ServerProcess  # TLS, no authentication
    ca: Path

    def url(self, server: ServerProcess, protocol: str) -> str:
        if protocol.startswith("grpc"):
            scheme = "grpc" if server.tls_ca is None else "grpcs"
            return f"{scheme}://{server.grpc_address}"
        return server.url


def start(work: Path, stack: ExitStack, resnet: bool) -> Servers:
    repo = build_example_repository(work / "repo")
    if resnet:
        onnx_path = export_resnet18(work / "resnet18.onnx")
        config = {"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_ms": 5}, **RESNET_INSTANCES}
        write_onnx_model(repo, "resnet", onnx_path.read_bytes(), config)
    authority = Authority(work / "pki")
    cert = authority.issue("server")
    keys = work / "api-keys"
    noisy_limits = [f"rate={NOISY_LIMIT}", f"burst={NOISY_LIMIT}"]
    keys.write_text(key_line(QUIET_KEY, "quiet", "infer") + "\n" + key_line(NOISY_KEY, "noisy", "infer", *noisy_limits))
    common = ("--model-repository", str(repo), "--log-level", "warning")
    plain = stack.enter_context(ServerProcess(*common))
    keyed = stack.enter_context(ServerProcess(*common, "--api-keys-file", str(keys)))
    tls = stack.enter_context(
        ServerProcess(*common, "--tls-cert", str(cert.cert), "--tls-key", str(cert.key), tls_ca=authority.cert)
    )
    return Servers(plain, keyed, tls, authority.cert)


def ratio_line(name: str, ratios: list[float], bar: float | None, higher_is_better: bool = True) -> str:
    median = statistics.median(ratios)
    interval = median_interval(ratios)
    head = f"- {name}: **{median:.3f}** (90 % interval of the median {span(interval)}, {len(ratios)} pairs)"
    if bar is None:
        return head + "."
    met = median >= bar if higher_is_better else median <= bar
    low, high = interval
    if low != low:
        reading = "too few pairs for an interval"
    elif (low >= bar) if higher_is_better else (high <= bar):
        reading = "the whole interval clears the bar"
    elif (high < bar) if higher_is_better else (low > bar):
        reading = "the whole interval misses the bar"
    else:
        reading = "the interval straddles the bar: these runs cannot tell a pass from a miss"
    sign = ">=" if higher_is_better else "<="
    return f"{head}; bar {sign} {bar:g}: {'**met**' if met else '**not met**'}, {reading}."


def paired(
    servers: Servers, base: ServerProcess, other: ServerProcess, model: str, protocol: str, load: Sequence[str],
    seconds: float, pairs: int, key: str | None,
) -> tuple[list[Run], list[Run]]:  # fmt: skip
    """``pairs`` runs on each server, the order alternating pair by pair (AB, BA, ...)."""
    runs: dict[str, list[Run]] = {"base": [], "other": []}
    for index in range(pairs):
        order = [("base", base), ("other", other)]
        for side, server in order if index % 2 == 0 else order[::-1]:
            side_key = key if server is servers.keyed else None
            ca = servers.ca if server.tls_ca is not None else None
            url = servers.url(server, protocol)
            run = functools.partial(bench, url, model, protocol, load, seconds, key=side_key, ca=ca)
            runs[side].append(with_cpu(server, run))
    return runs["base"], runs["other"]


HEADER = ["| run | req/s | P50 ms | P99 ms | errors |", "|---|---:|---:|---:|---:|"]


def median_of(runs: list[Run], figure: str) -> float:
    return statistics.median(getattr(r, figure) for r in runs)


def rows(label: str, runs: list[Run]) -> list[str]:
    return [
        f"| {label} {i + 1} | {r.rps:,.0f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | {sum(r.errors.values())} |"
        for i, r in enumerate(runs)
    ]


def keys_section(servers: Servers, seconds: float, pairs: int, lines: list[str]) -> None:
    plain, keyed = paired(
        servers, servers.plain, servers.keyed, "mlp", "v2-json", ("-c", "64"), seconds, pairs, QUIET_KEY
    )
    ratios = [k.rps / p.rps for p, k in zip(plain, keyed, strict=True)]
    lines += ["## Security: what auth, TLS and rate limits cost", "", "### API key on every request", ""]
    lines += [
        f"The MLP at 64 clients (V2 JSON, {seconds:g} s runs after 0.5 s of warm-up), a server checking an API "
        "key (SHA-256 digest, constant-time compare, token bucket per identity) against one without "
        "authentication, both up at once, the order alternating pair by pair.",
        "",
        ratio_line("requests/s with a key over without", ratios, 0.97),
        f"- CPU per request, median over runs: the server {median_of(keyed, 'server_us'):.1f} µs with a key "
        f"against {median_of(plain, 'server_us'):.1f} µs without; the client {median_of(keyed, 'client_us'):.1f} "
        f"against {median_of(plain, 'client_us'):.1f} µs (the two share this host's cores).",
        "",
        *HEADER,
        *rows("no auth", plain),
        *rows("API key", keyed),
        "",
    ]


def tls_section(
    servers: Servers, cases: list[tuple[str, str, str]], seconds: float, pairs: int, lines: list[str]
) -> None:
    lines += ["### TLS against plain text", ""]
    lines += [
        "Both servers up at once, pairs alternating; TLS 1.3 (the client's default), ECDHE and AES-GCM. "
        "The client (`tensorgate bench`, one process) decrypts on the same two cores as the server, so "
        "each ratio is what TLS costs the host. No bar: the issue asks for the cost.",
        "",
    ]
    tables: list[str] = []
    for model, protocol, clients in cases:
        load = ("-c", clients)
        plain, tls = paired(servers, servers.plain, servers.tls, model, protocol, load, seconds, pairs, None)
        ratios = [t.rps / p.rps for p, t in zip(plain, tls, strict=True)]
        p99 = [t.p99_ms / p.p99_ms for p, t in zip(plain, tls, strict=True)]
        name = f"{model}, {protocol}, {clients} clients"
        lines.append(ratio_line(f"{name}: requests/s with TLS over plain", ratios, None))
        lines.append(f"  P99 with TLS over plain: {statistics.median(p99):.2f}x.")
        tables += [f"**{name}**", "", *HEADER, *rows("plain", plain), *rows("TLS", tls), ""]
    lines += ["", *tables]


def noisy_section(servers: Servers, seconds: float, pairs: int, lines: list[str]) -> None:
    url = servers.keyed.url
    quiet_load = ("--rate", str(QUIET_RATE))
    alone: list[Run] = []
    crowded: list[Run] = []
    noisy: list[Run] = []
    for index in range(pairs):
        for with_noise in (False, True) if index % 2 == 0 else (True, False):
            if not with_noise:
                alone.append(bench(url, "mlp", "v2-json", quiet_load, seconds, key=QUIET_KEY, ca=None))
                continue
            with tempfile.TemporaryDirectory() as tmp:
                report = Path(tmp) / "noisy.json"
                command = [sys.executable, "-m", "tensorgate", "bench", "mlp", "-u", url, "--rate", str(NOISY_RATE)]
                command += ["-z", f"{seconds + 1.5:g}s", "--api-key", NOISY_KEY, "--json", str(report)]
                with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as loud:
                    crowded.append(bench(url, "mlp", "v2-json", quiet_load, seconds, key=QUIET_KEY, ca=None))
                    loud.wait(timeout=seconds + 120)
                [run] = json.loads(report.read_text())["runs"]
                noisy.append(Run(run["successes"] / run["elapsed_s"], float("nan"), float("nan"), run["errors"]))
    ratios = [c.p99_ms / a.p99_ms for a, c in zip(alone, crowded, strict=True)]
    refused = statistics.median(n.errors.get("http 429", 0) / (seconds + 1.5) for n in noisy)
    admitted = statistics.median(n.rps for n in noisy)
    lines += ["### A noisy tenant at ten times its rate", ""]
    lines += [
        f"A quiet key at {QUIET_RATE} requests/s (Poisson arrivals, {seconds:g} s runs) alone, alternating with the "
        f"same while a key limited to {NOISY_LIMIT}/s sends {NOISY_RATE}/s to the same server. The noisy key "
        f"was admitted at a median {admitted:,.0f}/s and refused (429) at {refused:,.0f}/s.",
        "",
        ratio_line("the quiet client's P99 with the noisy one over alone", ratios, 1.5, higher_is_better=False),
        "",
        *HEADER,
        *rows("quiet alone", alone),
        *rows("quiet beside noisy", crowded),
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer, shorter runs and no ResNet")
    args = parser.parse_args()
    seconds, pairs = (1.5, 3) if args.quick else (3.0, 6)
    cases = [("mlp", "v2-binary", "64"), ("mlp", "grpc", "64")]
    if not args.quick:
        cases += [("resnet", "v2-binary", "10"), ("resnet", "grpc", "10")]
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="tg-bench-security-") as tmp, ExitStack() as stack:
        servers = start(Path(tmp), stack, resnet=not args.quick)
        keys_section(servers, seconds, pairs, lines)
        tls_section(servers, cases, seconds, max(3, pairs // 2), lines)
        noisy_section(servers, seconds + 1, max(3, pairs // 2), lines)
    OUT.mkdir(exist_ok=True)
    (OUT / "bench_security.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
