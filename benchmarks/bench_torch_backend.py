"""The torch backend against torch in-process, beside the ONNX path, on the ResNet-18-shaped model.

One network (``_models.resnet_module``, seed 0) saved twice: traced to TorchScript (``model.pt``,
``backend: torch``) and exported to ONNX (``backend: onnxruntime``). Both servers are up at once
and take turns, the order rotated per round; each served run (``tensorgate bench --protocol
v2-binary -c 10``) is compared with its own runtime's in-process ceiling, measured right before and
right after it:

- torch: the TorchScript module under ``torch.inference_mode()`` in a tight loop, at batch 1 and
  at batch 8 with torch's default threads; the ratio uses whichever has the higher median;
- onnxruntime: ``_ceiling.Ceiling``, as every ResNet figure of these benchmarks.

Run: ``python benchmarks/bench_torch_backend.py [--seconds 10] [--rounds 3]``; writes
``benchmarks/out/bench_torch_backend.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).parent))

from _ceiling import RESNET_INSTANCES, Ceiling
from _models import export_resnet, trace_resnet
from bench_protocols import CEILING_S, Measured, tensorgate_bench
from bench_serving import write_onnx_model

from tensorgate.testing import ServerProcess

OUT = Path(__file__).parent / "out"
STEM = Path(__file__).stem
BATCHING = {"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_ms": 5}}
TORCH_CONFIG: dict[str, Any] = {
    "backend": "torch",
    **BATCHING,
    "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 224, 224]}],
    "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 1000]}],
}
SERVED = ("torch", "onnxruntime")


class TorchCeiling:
    """Images/s of the TorchScript module in this process, at batch 1 and at batch 8."""

    def __init__(self, path: Path, seconds: float) -> None:
        import torch

        self._torch = torch
        self._module = torch.jit.load(str(path)).eval()
        rng = np.random.default_rng(0)
        self._batches = {
            size: torch.from_numpy(rng.standard_normal((size, 3, 224, 224)).astype(np.float32)) for size in (1, 8)
        }
        self._seconds = seconds
        self.samples: list[dict[int, float]] = []

    def measure(self) -> dict[int, float]:
        sample = {size: self._rate(batch) for size, batch in self._batches.items()}
        self.samples.append(sample)
        return sample

    def best(self) -> int:
        """The batch size with the higher median over every sample so far."""
        return max(self._batches, key=lambda size: statistics.median(s[size] for s in self.samples))

    def _rate(self, batch: Any) -> float:
        with self._torch.inference_mode():
            self._module(batch)  # warm
            count, started = 0, time.perf_counter()
            while time.perf_counter() - started < self._seconds:
                self._module(batch)
                count += len(batch)
        return count / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    served: dict[str, list[Measured]] = {name: [] for name in SERVED}
    fractions: dict[str, list[float]] = {name: [] for name in SERVED}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        onnx_path = export_resnet(work / "resnet18.onnx", 18)
        script_path = trace_resnet(work / "resnet18.pt", 18)
        torch_repo, onnx_repo = work / "torch_repo", work / "onnx_repo"
        (torch_repo / "resnet" / "1").mkdir(parents=True)
        (torch_repo / "resnet" / "1" / "model.pt").write_bytes(script_path.read_bytes())
        (torch_repo / "resnet" / "config.yaml").write_text(yaml.safe_dump(TORCH_CONFIG))
        write_onnx_model(onnx_repo, "resnet", onnx_path.read_bytes(), {**BATCHING, **RESNET_INSTANCES})
        torch_ceiling = TorchCeiling(script_path, CEILING_S)
        onnx_ceiling = Ceiling(onnx_path, CEILING_S)
        repos = {"torch": torch_repo, "onnxruntime": onnx_repo}
        servers = {
            name: ServerProcess("--model-repository", str(repo), "--log-level", "warning").__enter__()
            for name, repo in repos.items()
        }
        try:
            for index in range(args.rounds):
                order = SERVED if index % 2 == 0 else SERVED[::-1]
                for name in order:
                    label = f"round {index + 1}, {name}"

                    def run(n: str = name, text: str = label) -> Measured:
                        return tensorgate_bench(servers[n], "v2-binary", "resnet", ("-c", "10"), args.seconds, text)

                    if name == "torch":
                        before = torch_ceiling.samples[-1] if torch_ceiling.samples else torch_ceiling.measure()
                        measured = run()
                        after = torch_ceiling.measure()
                        size = torch_ceiling.best()
                        fraction = measured.result.rps / statistics.fmean([before[size], after[size]])
                    else:
                        measured, bracket = onnx_ceiling.around(run)
                        fraction = measured.result.rps / onnx_ceiling.of(bracket)
                    served[name].append(measured)
                    fractions[name].append(fraction)
                    print(f"{label}: {measured.result.rps:.1f} images/s, {fraction:.2f} of its ceiling", flush=True)
        finally:
            for server in servers.values():
                server.__exit__(None, None, None)

    def median(values: list[float]) -> str:
        return f"{statistics.median(values):.2f} (rounds {min(values):.2f}-{max(values):.2f})"

    torch_over_onnx = [a.result.rps / b.result.rps for a, b in zip(served["torch"], served["onnxruntime"], strict=True)]
    best = torch_ceiling.best()
    torch_rates = [s[best] for s in torch_ceiling.samples]
    rows = [
        f"| {name} | {statistics.median(m.result.rps for m in runs):.1f} "
        f"| {statistics.median(m.result.p50_ms for m in runs):.1f} "
        f"| {statistics.median(m.result.p99_ms for m in runs):.1f} "
        f"| {sum(m.result.errors for m in runs)} | {median(fractions[name])} |"
        for name, runs in served.items()
    ]
    lines = [
        f"## The torch backend against torch in-process, beside the ONNX path ({STEM}.py)",
        "",
        "The ResNet-18-shaped model (one network, random weights) as TorchScript behind `backend: torch` "
        "(one instance, torch's default threads) and as ONNX behind onnxruntime (the served arrangement of "
        f"every ResNet figure here), both servers up at once; {args.rounds} rounds of "
        f"`tensorgate bench --protocol v2-binary -c 10 -z {args.seconds:g}s`, the order alternating. Each run "
        "against its own runtime's in-process ceiling, measured right before and after it. Medians over rounds.",
        "",
        "| backend | images/s | P50 ms | P99 ms | errors | of its in-process ceiling |",
        "|---|---:|---:|---:|---:|---:|",
        *rows,
        "",
        f"- torch's ceiling: batch {best} in a tight loop, {statistics.median(torch_rates):.1f} images/s "
        f"(between {min(torch_rates):.1f} and {max(torch_rates):.1f}).",
        f"- served images/s, torch / onnxruntime: {median(torch_over_onnx)}.",
        "",
    ]
    text = "\n".join(lines)
    (OUT / f"{STEM}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
