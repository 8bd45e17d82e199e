"""tensorgate's HTTP/2 transport against the h2 library's and grpcio's server, behind the same servicers.

``tensorgate/protocols/grpc/http2/`` replaces both: h2 (the I/O-free HTTP/2 state machine; the
same calls on the event loop, ``_h2_connection.py``) and grpcio's server (``grpc.aio``, which reads
sockets on threads of its own). The h2 and grpcio servers are ``tensorgate serve`` with its gRPC
port served by ``_grpc_peer.py`` instead. The three servers are up at once over one repository and
take turns, the order rotated per round:

1. the MLP at 64 clients (``tensorgate bench --protocol grpc -c 64``): requests/s, latency, and
   the server's event-loop and total CPU per request;
2. the ResNet-18-shaped model at 10 clients as a fraction of the in-process ceiling measured right
   before and after each run (``_ceiling.py``).

The home-made transport stays the default only where it wins by more than the rounds' own spread.
Run: ``python benchmarks/bench_grpc_transport.py [--seconds 5] [--rounds 3]``; writes
``benchmarks/out/bench_grpc_transport.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _ceiling import RESNET_INSTANCES, Ceiling
from _models import export_resnet
from bench_protocols import CEILING_S, Measured, per_request, tensorgate_bench
from bench_serving import write_onnx_model

from tensorgate.examples.build import mlp_model
from tensorgate.testing import ServerProcess

OUT = Path(__file__).parent / "out"
PEER = Path(__file__).parent / "_grpc_peer.py"
STEM = Path(__file__).stem
TRANSPORTS = ("native", "h2", "grpcio")


def rotated(round_index: int) -> list[str]:
    shift = round_index % len(TRANSPORTS)
    return [*TRANSPORTS[shift:], *TRANSPORTS[:shift]]


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f} (rounds {min(values):.2f}-{max(values):.2f})"


def verdict(ratios: list[float], other: str) -> str:
    """native / ``other`` per round: a win counts only when every round agrees."""
    if min(ratios) > 1:
        return "native wins in every round"
    if max(ratios) < 1:
        return f"**{other} wins in every round**"
    return "within the rounds' spread"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    mlp: dict[str, list[Measured]] = {t: [] for t in TRANSPORTS}
    resnet: dict[str, list[float]] = {t: [] for t in TRANSPORTS}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        repo = work / "repo"
        write_onnx_model(
            repo,
            "mlp",
            mlp_model().SerializeToString(),
            {"max_batch_size": 64, "dynamic_batching": {"max_queue_delay_ms": 2}},
        )
        onnx_path = export_resnet(work / "resnet18.onnx", 18)
        config = {"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_ms": 5}, **RESNET_INSTANCES}
        write_onnx_model(repo, "resnet", onnx_path.read_bytes(), config)
        servers: dict[str, ServerProcess] = {}
        try:
            for transport in TRANSPORTS:
                command = None if transport == "native" else [sys.executable, str(PEER), transport]
                servers[transport] = ServerProcess(
                    "--model-repository", str(repo), "--log-level", "warning", command=command
                ).__enter__()
            for index in range(args.rounds):
                for transport in rotated(index):
                    label = f"round {index + 1}, {transport}"
                    mlp[transport].append(
                        tensorgate_bench(servers[transport], "grpc", "mlp", ("-c", "64"), args.seconds, label)
                    )
                    print(f"{label}: mlp {mlp[transport][-1].result.rps:,.0f} req/s", flush=True)
            ceiling = Ceiling(onnx_path, CEILING_S)
            for index in range(args.rounds):
                for transport in rotated(index):
                    label = f"round {index + 1}, {transport}"

                    def run(t: str = transport, name: str = label) -> Measured:
                        return tensorgate_bench(servers[t], "grpc", "resnet", ("-c", "10"), args.seconds * 2, name)

                    measured, bracket = ceiling.around(run)
                    resnet[transport].append(measured.result.rps / ceiling.of(bracket))
                    print(f"{label}: resnet {resnet[transport][-1]:.2f} of the ceiling", flush=True)
        finally:
            for server in servers.values():
                server.__exit__(None, None, None)

    def per_round(figure: Callable[[Measured], float], other: str) -> list[float]:
        return [figure(a) / figure(b) for a, b in zip(mlp["native"], mlp[other], strict=True)]

    def loop_us(m: Measured) -> float:
        return per_request(m, m.cores.loop)

    def server_us(m: Measured) -> float:
        return per_request(m, m.cores.server)

    rows = [
        f"| {transport} | {statistics.median(m.result.rps for m in runs):,.0f} "
        f"| {statistics.median(m.result.p50_ms for m in runs):.2f} "
        f"| {statistics.median(m.result.p99_ms for m in runs):.2f} "
        f"| {statistics.median(loop_us(m) for m in runs):.0f} | {statistics.median(server_us(m) for m in runs):.0f} "
        f"| {sum(m.result.errors for m in runs)} | {statistics.median(resnet[transport]):.2f} |"
        for transport, runs in mlp.items()
    ]
    comparisons = []
    for other in TRANSPORTS[1:]:
        rps_ratio = per_round(lambda m: m.result.rps, other)
        cpu_ratio = per_round(server_us, other)
        ceiling_ratio = [a / b for a, b in zip(resnet["native"], resnet[other], strict=True)]
        comparisons += [
            f"- MLP req/s, native / {other}: {spread(rps_ratio)}: {verdict(rps_ratio, other)}.",
            f"- MLP server CPU per request, native / {other}: {spread(cpu_ratio)} (lower is cheaper).",
            f"- ResNet of the ceiling, native / {other}: {spread(ceiling_ratio)}: {verdict(ceiling_ratio, other)}.",
        ]
    lines = [
        f"## gRPC transports: tensorgate's HTTP/2 against h2's and grpcio's ({STEM}.py)",
        "",
        f"The three servers up at once over one repository; {args.rounds} rounds, the order rotated per round. MLP: "
        f"`tensorgate bench --protocol grpc -c 64 -z {args.seconds:g}s` (max batch 64, 2 ms window). ResNet-18-"
        f"shaped model: `-c 10 -z {args.seconds * 2:g}s`, each run against the in-process ceiling measured "
        "around it. CPU per request: the server's main thread (the event loop) and every thread of it "
        "(grpcio's own polling threads included), over the run. Medians over rounds.",
        "",
        "| transport | MLP req/s | P50 ms | P99 ms | event loop µs/req | server CPU µs/req | errors "
        "| ResNet of ceiling |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        *comparisons,
        "",
    ]
    text = "\n".join(lines)
    (OUT / f"{STEM}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
