"""The seeds' workloads served for real, side by side with Triton (PyTriton) and MLServer, in one run.

Workloads (``tensorgate examples --workloads``: real architectures, random weights): a YOLOv8s detector
at 640x640, ResNet-50, a BERT-base classifier, and the headline harness's 64-feature MLP. For each:

- the in-process ceiling: the ONNX file alone in a tight loop, at batch 1 and 8 with onnxruntime's
  threads on every core, and one single-thread session per core side by side at batch 1; the best
  arrangement's median decides, and each round's served runs are compared with that round's ceiling;
- tensorgate at the seeds' concurrency (10 clients, closed loop, ``tensorgate bench``) over V2 binary
  and gRPC, with dynamic batching on (max batch 8, 5 ms) and off; the detector also over the seed's V1
  JSON (``POST /v1/models/yolov8:predict``, 10 MB bodies, driven by ``hey``) and through its pipeline
  from an encoded JPEG; ResNet-50 also under torch and through its raw-uint8 pipeline; BERT at one
  length and at mixed lengths (ragged batching: what padding costs), and through its string pipeline;
- Triton (PyTriton) and MLServer serving the same ONNX file with the same onnxruntime threads and the
  same batching (``_peers.py``), driven by the same client over the same protocols, in rounds that
  alternate the servers (the order rotates from round to round): throughput and P99 ratios, each the
  median of the rounds' ratios with a 90 % bootstrap interval;
- warm-up: a fresh server's first request after ``/v2/health/ready`` turns 200 against the steady P50
  at one client, and whether ready ever came before the warm-up ended (the server log's order);
- memory: the server's resident memory with the model loaded against an empty server (per instance),
  and under a 10x overload of the detector (100 clients, a queue of 32): its peak, the 503s, and
  whether the server lived;
- the detect pipeline's cost per image beyond the detector (decode and letterbox, NMS: the steps'
  compute from the server's statistics) and where it ran (the event loop's CPU per request);
- the headline: the MLP (64 features, max batch 8, 5 ms, default server flags) under ``hey -c 64``
  against naive Flask, PyTriton and MLServer in interleaved rounds, and the same server as
  ``bench_front_end.py`` ran it (16 features, ``--log-level warning``, ``OMP_NUM_THREADS=1``) and on a
  pure-Python copy of the sources, to say where the published 8.6x came from.

Run: ``python benchmarks/bench_workloads.py [--seconds 12] [--rounds 3] [--only yolov8,resnet50,bert,mlp]``;
writes ``benchmarks/out/bench_workloads.md``. Client and servers share this host's cores.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import psutil
import yaml

sys.path.insert(0, str(Path(__file__).parent))

from _naive import flask_baseline
from _peers import MLServer, Peer, PyTriton, ensure_venv
from _profile import pure_copy, pure_env, record

from tensorgate.examples.build import mlp_model
from tensorgate.examples.workloads import built, sample_jpeg
from tensorgate.testing import ServerProcess

OUT = Path(__file__).parent / "out"
STEM = Path(__file__).stem
CORES = os.cpu_count() or 1
CLIENTS = 10  # the seeds' concurrency
OVERLOAD = 10 * CLIENTS
BAR_OF_CEILING = 0.85  # the detector over V2 binary and gRPC
BAR_OF_CEILING_V1 = 0.60  # the detector over the seed's V1 JSON
BAR_OF_TRITON = 1.3  # throughput, at a P99 no worse than Triton's
BAR_FIRST_REQUEST = 1.5  # the first request after ready, over the steady P50
SIZE = ["full"]  # the workloads' size (--size test: the slim builds, to try this script quickly)
BATCHING = "max_batch_size: 8\ndynamic_batching: {max_queue_delay_ms: 5, max_queue_size: %d}\n"


# -- measuring -----------------------------------------------------------------------------------


@dataclass
class Run:
    label: str
    server: str
    protocol: str
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    errors: int
    requests: int = 0
    ceiling: float = float("nan")  # the round's in-process ceiling, requests/s
    extra: dict[str, float] = field(default_factory=dict)


def tg_bench(
    label: str,
    server: str,
    url: str,
    model: str,
    protocol: str,
    seconds: float,
    concurrency: int = CLIENTS,
    input_file: Path | None = None,
    requests: int | None = None,
) -> Run:
    """One closed-loop run of ``tensorgate bench`` (the same client for every server)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        command = [sys.executable, "-m", "tensorgate", "bench", model, "-u", url, "--protocol", protocol]
        command += ["-c", str(concurrency), "--json", str(out), "--timeout", "120"]
        command += ["-n", str(requests)] if requests else ["-z", f"{seconds:g}s", "--warmup", "1"]
        if input_file is not None:
            command += ["--input-file", str(input_file)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 300, check=False)
        if not out.exists():
            raise RuntimeError(f"tensorgate bench failed ({label}): {done.stderr[-1500:]}")
        run = json.loads(out.read_text())["runs"][0]
    latency = run["latency_s"]

    def ms(key: str) -> float:
        value = latency.get(key)
        return float("nan") if value is None else value * 1000

    return Run(
        label,
        server,
        protocol,
        run["throughput_rps"] or 0.0,
        ms("p50"),
        ms("p90"),
        ms("p99"),
        ms("mean"),
        sum(run["errors"].values()),
        run["requests"],
    )


def hey_run(label: str, server: str, url: str, body: Path, seconds: float, concurrency: int) -> Run:
    command = ["hey", "-c", str(concurrency), "-z", f"{seconds:g}s", "-m", "POST", "-T", "application/json"]
    output = subprocess.run(
        [*command, "-D", str(body), url], capture_output=True, text=True, check=True, timeout=seconds + 300
    ).stdout

    def grab(pattern: str) -> float:
        found = re.search(pattern, output)
        return float(found.group(1)) if found else float("nan")

    # hey leaves out a percentile it has no sample for (a few slow responses): then the slowest bounds it.
    p99 = grab(r"99%+ in ([\d.]+) secs")
    if p99 != p99:
        p99 = grab(r"Slowest:\s+([\d.]+) secs")
    statuses = re.findall(r"\[(\d+)\]\s+(\d+) responses", output)
    errors = sum(int(n) for code, n in statuses if code != "200") + len(re.findall(r"Error distribution", output))
    return Run(
        label,
        server,
        "v2-json" if "/v2/" in url else "v1-json",
        grab(r"Requests/sec:\s+([\d.]+)"),
        grab(r"50%+ in ([\d.]+) secs") * 1000,
        grab(r"90%+ in ([\d.]+) secs") * 1000,
        p99 * 1000,
        grab(r"Average:\s+([\d.]+) secs") * 1000,
        errors,
        sum(int(n) for _, n in statuses),
    )


def median_interval(values: list[float], level: float = 0.90, resamples: int = 4000) -> tuple[float, float]:
    """A percentile-bootstrap interval for the median (seeded); NaN for fewer than three values."""
    values = [v for v in values if v == v]
    if len(values) < 3:
        return float("nan"), float("nan")
    draws = np.random.default_rng(0).choice(np.asarray(values), size=(resamples, len(values)))
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(np.median(draws, axis=1), [tail, 100 - tail])
    return float(low), float(high)


def ratio_text(values: list[float]) -> str:
    values = [v for v in values if v == v]
    if not values:
        return "n/a"
    low, high = median_interval(values)
    interval = "" if low != low else f" ({low:.2f}-{high:.2f})"
    return f"{statistics.median(values):.2f}{interval}"


def verdict(values: list[float], bar: float, higher: bool = True) -> str:
    """Met, missed, or within noise: where the bar falls against the median's interval."""
    values = [v for v in values if v == v]
    if not values:
        return "not measured"
    low, high = median_interval(values)
    median = statistics.median(values)
    if low != low:
        return "met" if (median >= bar) == higher else "**missed**"
    if (low >= bar) if higher else (high <= bar):
        return "met"
    if (high < bar) if higher else (low > bar):
        return "**missed**"
    return "within noise (the interval straddles the bar)"


# -- the in-process ceiling ----------------------------------------------------------------------


class Ceiling:
    """The ONNX file alone, in tight loops: ``threads`` on every core at batch 1 and 8, and one
    single-thread session per core side by side at batch 1. Each loop's rate is its items over its own
    time to the end of its last call."""

    ARRANGEMENTS = {"b1": "batch 1, all cores", "b8": "batch 8, all cores", "pair": "batch 1, a session per core"}

    def __init__(self, path: Path, feeds: Callable[[int], dict[str, np.ndarray]], seconds: float) -> None:
        wide = ort.SessionOptions()
        wide.intra_op_num_threads = CORES
        narrow = ort.SessionOptions()
        narrow.intra_op_num_threads = 1
        self._wide = ort.InferenceSession(str(path), wide, providers=["CPUExecutionProvider"])
        self._narrow = [
            ort.InferenceSession(str(path), narrow, providers=["CPUExecutionProvider"]) for _ in range(CORES)
        ]
        self._one, self._eight = feeds(1), feeds(8)
        self._seconds = seconds
        self.samples: list[dict[str, float]] = []

    def _rate(self, sessions: list[ort.InferenceSession], feed: dict[str, np.ndarray]) -> float:
        rows = next(iter(feed.values())).shape[0]
        for session in sessions:
            session.run(None, feed)
        rates = [0.0] * len(sessions)
        started = time.perf_counter()
        deadline = started + self._seconds

        def loop(index: int) -> None:
            count = 0
            while time.perf_counter() < deadline or count < 2:
                sessions[index].run(None, feed)
                count += rows
            rates[index] = count / (time.perf_counter() - started)

        threads = [threading.Thread(target=loop, args=(i,)) for i in range(len(sessions))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return sum(rates)

    def measure(self) -> float:
        sample = {
            "b1": self._rate([self._wide], self._one),
            "b8": self._rate([self._wide], self._eight),
            "pair": self._rate(self._narrow, self._one),
        }
        self.samples.append(sample)
        return max(sample.values())

    def best(self) -> str:
        return max(self.ARRANGEMENTS, key=lambda k: statistics.median(s[k] for s in self.samples))

    def round_value(self, index: int) -> float:
        return self.samples[index][self.best()]

    def lines(self, unit: str) -> list[str]:
        best = self.best()
        rows = [
            f"| {i} | " + " | ".join(f"{s[k]:.2f}" for k in self.ARRANGEMENTS) + " |"
            for i, s in enumerate(self.samples, 1)
        ]
        chosen = [s[best] for s in self.samples]
        return [
            f"| round | {' | '.join(self.ARRANGEMENTS.values())} |",
            "|---:|" + "---:|" * len(self.ARRANGEMENTS),
            *rows,
            "",
            f"In-process ceiling ({unit}/s): the best arrangement is {self.ARRANGEMENTS[best]}, median "
            f"{statistics.median(chosen):.2f} (between {min(chosen):.2f} and {max(chosen):.2f} over the rounds).",
        ]


# -- servers ---------------------------------------------------------------------------------------


def thread_cpu_s(pid: int) -> float:
    """CPU seconds of a process's main thread (tensorgate's event loop)."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += psutil.Process(pid).memory_info().rss
    return total / 2**20


def tree(pid: int) -> list[int]:
    try:
        return [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        return [pid]


def stats(url: str, model: str) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(f"{url}/v2/models/{model}/stats", timeout=10) as response:
        document = json.loads(response.read())
    return dict(document["model_stats"][0])


def configure(root: Path, model: str, extra: str) -> None:
    """Rewrite a model's configuration for the benchmark: the batching every server gets, the threads."""
    path = root / model / "config.yaml"
    config = yaml.safe_load(path.read_text()) or {}
    config.pop("dynamic_batching", None)
    config.update(yaml.safe_load(extra))
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def copy_model(root: Path, model: str, as_name: str, config: str) -> None:
    """A second copy of a model under another name (its weights hard-linked) with its own configuration."""
    (root / as_name / "1").mkdir(parents=True)
    for path in (root / model / "1").iterdir():
        target = root / as_name / "1" / path.name
        try:
            os.link(path, target)
        except OSError:
            shutil.copyfile(path, target)
    (root / as_name / "config.yaml").write_text(config)


def repository(workload: str, root: Path, size: str) -> Path:
    source = built(workload, size)
    shutil.copytree(source, root, dirs_exist_ok=True, copy_function=os.link)
    for config in root.rglob("config.yaml"):  # edited below: never through a link into the cache
        text = config.read_text()
        config.unlink()
        config.write_text(text)
    return root


THREADS = f"onnxruntime: {{intra_op_threads: {CORES}}}\n"


# -- workloads -----------------------------------------------------------------------------------


@dataclass
class Target:
    """One served configuration a round measures."""

    label: str
    server: str  # tensorgate, pytriton, mlserver
    protocol: str
    drive: Callable[[float], Run]  # a run of that many seconds
    compare: str | None = None  # the tensorgate row this peer row is compared with


@dataclass
class Workload:
    name: str
    unit: str  # what a request carries, for the ceiling
    model: str  # the ONNX model's name in every server
    onnx: Path
    feeds: Callable[[int], dict[str, np.ndarray]]
    signature: dict[str, list[dict[str, object]]]  # MLServer's declared inputs and outputs
    input_files: dict[str, Path] = field(default_factory=dict)


def write_v2_file(path: Path, requests: list[dict[str, np.ndarray]]) -> Path:
    """A ``tensorgate bench --input-file`` of V2 bodies with data (BYTES as base64)."""
    documents = []
    for tensors in requests:
        inputs = []
        for name, array in tensors.items():
            if array.dtype == object:
                inputs.append(
                    {
                        "name": name,
                        "datatype": "BYTES",
                        "shape": list(array.shape),
                        "data_base64": [base64.b64encode(e).decode() for e in array.ravel()],
                    }
                )
            else:
                datatype = {"float32": "FP32", "int64": "INT64", "uint8": "UINT8"}[str(array.dtype)]
                inputs.append(
                    {"name": name, "datatype": datatype, "shape": list(array.shape), "data": array.ravel().tolist()}
                )
        documents.append({"inputs": inputs})
    path.write_text(json.dumps(documents))
    return path


def bert_tokens(length: int, seed: int, rows: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, 900, (rows, length)).astype(np.int64)
    ids[:, 0], ids[:, -1] = 2, 3
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


BERT_LENGTH = 64  # tokens, the same-length runs
BERT_LENGTHS = [8 + (7 * i * i + 3 * i) % 113 for i in range(32)]  # 8..120, mean about 64


def section_workload(
    work: Path,
    name: str,
    peers_python: Path | None,
    seconds: float,
    rounds: int,
    lines: list[str],
    summary: dict[str, Any],
) -> None:
    root = repository(name, work / f"repo-{name}", SIZE[0])
    queue = {"yolov8": 32, "resnet50": 64, "bert": 256}[name]
    model = name
    configure(root, model, BATCHING % queue + THREADS)
    copy_model(root, model, f"{model}_nobatch", f"max_batch_size: 8\n{THREADS}")
    if name == "resnet50":
        configure(root, "resnet50_torch", BATCHING % queue + f"torch: {{intra_op_threads: {CORES}}}\n")
    onnx = root / model / "1" / "model.onnx"
    files = work / f"inputs-{name}"
    files.mkdir()
    rng = np.random.default_rng(0)
    if name == "yolov8":
        feeds = lambda n: {"images": rng.uniform(0, 1, (n, 3, 640, 640)).astype(np.float32)}  # noqa: E731
        signature = {
            "inputs": [{"name": "images", "datatype": "FP32", "shape": [-1, 3, 640, 640]}],
            "outputs": [
                {"name": "detection_boxes", "datatype": "FP32", "shape": [-1, 8400, 4]},
                {"name": "detection_scores", "datatype": "FP32", "shape": [-1, 8400, 80]},
            ],
        }
        tensors = write_v2_file(files / "tensor.json", [feeds(1)])
        jpeg = write_v2_file(files / "jpeg.json", [{"image": np.array([sample_jpeg()], dtype=object)}])
        v1 = files / "v1.json"
        v1.write_bytes(json.dumps({"inputs": {"images": feeds(1)["images"].tolist()}}).encode())
    elif name == "resnet50":
        feeds = lambda n: {"image": rng.standard_normal((n, 3, 224, 224)).astype(np.float32)}  # noqa: E731
        signature = {
            "inputs": [{"name": "image", "datatype": "FP32", "shape": [-1, 3, 224, 224]}],
            "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 1000]}],
        }
        tensors = write_v2_file(files / "tensor.json", [feeds(1)])
        pixels = write_v2_file(
            files / "uint8.json", [{"image": rng.integers(0, 256, (1, 224, 224, 3), dtype=np.uint8)}]
        )
    else:
        feeds = lambda n: bert_tokens(BERT_LENGTH, 0, n)  # noqa: E731
        io_spec = [
            {"name": n, "datatype": "INT64", "shape": [-1, -1]}
            for n in ("input_ids", "attention_mask", "token_type_ids")
        ]
        signature = {"inputs": io_spec, "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 2]}]}
        tensors = write_v2_file(files / "tensor.json", [bert_tokens(BERT_LENGTH, 0)])
        ragged = write_v2_file(files / "ragged.json", [bert_tokens(n, i) for i, n in enumerate(BERT_LENGTHS)])
        words = (Path(__file__).parent.parent / "tensorgate" / "examples" / "data" / "corpus.txt").read_text().split()
        texts = [" ".join(words[i * 7 : i * 7 + 40]).encode() for i in range(32)]
        strings = write_v2_file(files / "strings.json", [{"text": np.array([t], dtype=object)} for t in texts])

    lines += [f"### {name}", ""]
    ceiling = Ceiling(onnx, feeds, max(4.0, seconds / 3))

    # Warm-up and memory first, on fresh servers with the cores to themselves.
    # The model alone (one instance), so the server's memory over an empty one is that instance's.
    alone = work / f"alone-{name}"
    shutil.copytree(root / model, alone / model, copy_function=os.link)
    (alone / model / "config.yaml").unlink()
    (alone / model / "config.yaml").write_text((root / model / "config.yaml").read_text())
    first, steady, early_ready, rss_model = warm_start(alone, model, tensors, seconds)
    summary.setdefault("warmup", []).append((name, first, steady, early_ready, rss_model))

    peers: list[Peer] = []
    with ServerProcess("--model-repository", str(root), "--log-level", "warning", ready_timeout_s=600) as tg:
        grpc_url = tg.grpc_address
        targets = [
            Target(
                "tensorgate, V2 binary",
                "tensorgate",
                "v2-binary",
                lambda s: tg_bench(
                    "tensorgate, V2 binary", "tensorgate", tg.url, model, "v2-binary", s, input_file=tensors
                ),
            ),
            Target(
                "tensorgate, gRPC",
                "tensorgate",
                "grpc",
                lambda s: tg_bench("tensorgate, gRPC", "tensorgate", grpc_url, model, "grpc", s, input_file=tensors),
            ),
            Target(
                "tensorgate, V2 binary, batching off",
                "tensorgate",
                "v2-binary",
                lambda s: tg_bench(
                    "tensorgate, V2 binary, batching off",
                    "tensorgate",
                    tg.url,
                    f"{model}_nobatch",
                    "v2-binary",
                    s,
                    input_file=tensors,
                ),
            ),
        ]
        if name == "yolov8":
            targets += [
                Target(
                    "tensorgate, V1 JSON (hey)",
                    "tensorgate",
                    "v1-json",
                    lambda s: hey_run(
                        "tensorgate, V1 JSON (hey)", "tensorgate", f"{tg.url}/v1/models/yolov8:predict", v1, s, CLIENTS
                    ),
                ),
                Target(
                    "tensorgate, detect pipeline from a JPEG, V2 binary",
                    "tensorgate",
                    "v2-binary",
                    lambda s: tg_bench(
                        "tensorgate, detect pipeline from a JPEG, V2 binary",
                        "tensorgate",
                        tg.url,
                        "detect",
                        "v2-binary",
                        s,
                        input_file=jpeg,
                    ),
                ),
            ]
        if name == "resnet50":
            targets += [
                Target(
                    "tensorgate, torch backend, V2 binary",
                    "tensorgate",
                    "v2-binary",
                    lambda s: tg_bench(
                        "tensorgate, torch backend, V2 binary",
                        "tensorgate",
                        tg.url,
                        "resnet50_torch",
                        "v2-binary",
                        s,
                        input_file=tensors,
                    ),
                ),
                Target(
                    "tensorgate, raw uint8 pipeline, V2 binary",
                    "tensorgate",
                    "v2-binary",
                    lambda s: tg_bench(
                        "tensorgate, raw uint8 pipeline, V2 binary",
                        "tensorgate",
                        tg.url,
                        "classify_resnet50",
                        "v2-binary",
                        s,
                        input_file=pixels,
                    ),
                ),
            ]
        if name == "bert":
            targets += [
                Target(
                    "tensorgate, V2 binary, mixed lengths (ragged)",
                    "tensorgate",
                    "v2-binary",
                    lambda s: tg_bench(
                        "tensorgate, V2 binary, mixed lengths (ragged)",
                        "tensorgate",
                        tg.url,
                        model,
                        "v2-binary",
                        s,
                        input_file=ragged,
                    ),
                ),
                Target(
                    "tensorgate, strings through the tokenizer pipeline",
                    "tensorgate",
                    "v2-binary",
                    lambda s: tg_bench(
                        "tensorgate, strings through the tokenizer pipeline",
                        "tensorgate",
                        tg.url,
                        "classify_text",
                        "v2-binary",
                        s,
                        input_file=strings,
                    ),
                ),
            ]
        if peers_python is not None:
            triton = PyTriton(peers_python, onnx, model, CORES)
            mlserver = MLServer(peers_python, onnx, model, CORES, signature)
            peers = [triton, mlserver]
            try:
                for peer in peers:
                    peer.wait_ready(model)
            except (RuntimeError, TimeoutError) as exc:
                lines += [f"_A peer server failed to start: {str(exc)[:800]}_", ""]
                for peer in peers:
                    peer.stop()
                peers = []
            if peers:
                targets += [
                    Target(
                        "Triton (PyTriton), V2 binary",
                        "pytriton",
                        "v2-binary",
                        lambda s: tg_bench(
                            "Triton (PyTriton), V2 binary",
                            "pytriton",
                            triton.url,
                            model,
                            "v2-binary",
                            s,
                            input_file=tensors,
                        ),
                        "tensorgate, V2 binary",
                    ),
                    Target(
                        "Triton (PyTriton), gRPC",
                        "pytriton",
                        "grpc",
                        lambda s: tg_bench(
                            "Triton (PyTriton), gRPC", "pytriton", triton.grpc, model, "grpc", s, input_file=tensors
                        ),
                        "tensorgate, gRPC",
                    ),
                    Target(
                        "MLServer, gRPC",
                        "mlserver",
                        "grpc",
                        lambda s: tg_bench(
                            "MLServer, gRPC", "mlserver", mlserver.grpc, model, "grpc", s, input_file=tensors
                        ),
                        "tensorgate, gRPC",
                    ),
                ]
                if name == "bert":
                    targets.append(
                        Target(
                            "Triton (PyTriton), V2 binary, mixed lengths",
                            "pytriton",
                            "v2-binary",
                            lambda s: tg_bench(
                                "Triton (PyTriton), V2 binary, mixed lengths",
                                "pytriton",
                                triton.url,
                                model,
                                "v2-binary",
                                s,
                                input_file=ragged,
                            ),
                            "tensorgate, V2 binary, mixed lengths (ragged)",
                        )
                    )
        try:
            for target in targets:  # one short run each first: connections, pools, the batcher
                tg_bench_warm(target)
            runs: list[list[Run]] = []
            for index in range(rounds):
                value = ceiling.measure()
                shift = index * len(targets) // max(1, rounds)
                this_round = []
                for target in targets[shift:] + targets[:shift]:
                    run = target.drive(seconds)
                    run.ceiling = value
                    this_round.append(run)
                    print(
                        f"{name} round {index + 1}: {run.label}: {run.rps:.2f} req/s, P99 {run.p99_ms:.0f} ms",
                        flush=True,
                    )
                runs.append(this_round)
            pipeline = pipeline_cost(tg, root) if name == "yolov8" else None
            if name == "yolov8":
                pipeline = (pipeline or []) + v1_profile(tg, v1, seconds)
            overload = overload_run(tg, model, tensors, seconds) if name == "yolov8" else None
        finally:
            for peer in peers:
                peer.stop()
    report_workload(lines, summary, name, ceiling, targets, runs, rounds)
    if pipeline is not None:
        lines += pipeline
    if overload is not None:
        lines += overload


def tg_bench_warm(target: Target) -> None:
    with contextlib.suppress(RuntimeError, subprocess.CalledProcessError):
        target.drive(3)


def warm_start(root: Path, model: str, tensors: Path, seconds: float) -> tuple[float, float, bool, float]:
    """A fresh server: its first request as soon as ready reports 200 (V2 binary, one client), then
    the steady P50 at one client; whether ready came before the warm-up ended; its resident memory."""
    server = ServerProcess("--model-repository", str(root), "--log-format", "json", ready_timeout_s=600)
    with server:
        assert server.process is not None
        rss = rss_mb(tree(server.process.pid))
        first = tg_bench("first", "tensorgate", server.url, model, "v2-binary", 0, 1, tensors, requests=1)
        steady = tg_bench("steady", "tensorgate", server.url, model, "v2-binary", seconds, 1, tensors)
        records = []  # the whole log: ServerProcess.log() keeps only its tail
        for line in server.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                records.append(json.loads(line))
    # The version turns READY only after its warm-up (models/version_loader.py); the server reports
    # ready once every model is READY: a "server ready" line before the model's "is warm" line would
    # be a readiness reported early.
    order = [str(r.get("message", "")) for r in records]
    warm_at = next((i for i, m in enumerate(order) if m.startswith(f"model {model} version 1 is warm")), None)
    ready_at = next((i for i, m in enumerate(order) if m.startswith("server ready")), None)
    early = warm_at is None or ready_at is None or ready_at < warm_at
    return first.p50_ms, steady.p50_ms, early, rss


def empty_server_rss() -> float:
    with tempfile.TemporaryDirectory() as tmp, ServerProcess("--model-repository", tmp) as server:
        assert server.process is not None
        return rss_mb(tree(server.process.pid))


def pipeline_cost(tg: ServerProcess, root: Path) -> list[str]:
    """The detect pipeline's cost per image beyond the detector: its steps' compute per image from the
    server's statistics, one client at a time, and the event loop's CPU per request with and without."""
    assert tg.process is not None
    pid = tg.process.pid
    files = Path(tempfile.mkdtemp())
    try:
        rng = np.random.default_rng(1)
        tensor = write_v2_file(files / "t.json", [{"images": rng.uniform(0, 1, (1, 3, 640, 640)).astype(np.float32)}])
        jpeg = write_v2_file(files / "j.json", [{"image": np.array([sample_jpeg()], dtype=object)}])
        results = {}
        for label, model, path in (("detector alone", "yolov8", tensor), ("detect pipeline", "detect", jpeg)):
            before = {m: stats(tg.url, m) for m in ("letterbox", "nms")}
            loop = thread_cpu_s(pid)
            run = tg_bench(label, "tensorgate", tg.url, model, "v2-binary", 0, 1, path, requests=12)
            loop_ms = (thread_cpu_s(pid) - loop) / max(1, run.requests) * 1000
            after = {m: stats(tg.url, m) for m in ("letterbox", "nms")}
            steps = {}
            for m in ("letterbox", "nms"):
                count = (
                    after[m]["inference_stats"]["compute_infer"]["count"]
                    - before[m]["inference_stats"]["compute_infer"]["count"]
                )
                ns = (
                    after[m]["inference_stats"]["compute_infer"]["ns"]
                    - before[m]["inference_stats"]["compute_infer"]["ns"]
                )
                steps[m] = ns / count / 1e6 if count else float("nan")
            results[label] = (run, loop_ms, steps)
    finally:
        shutil.rmtree(files, ignore_errors=True)
    alone, with_steps = results["detector alone"], results["detect pipeline"]
    return [
        "#### The detect pipeline's cost per image (one client, 12 requests each)",
        "",
        "| request | P50 ms | event loop CPU per request (ms) | letterbox compute per image (ms) | NMS compute per image (ms) |",  # noqa: E501
        "|---|---:|---:|---:|---:|",
        f"| yolov8 alone, a letterboxed tensor (4.9 MB) | {alone[0].p50_ms:.0f} | {alone[1]:.2f} | | |",
        f"| detect, a 1280x720 JPEG ({len(sample_jpeg()) // 1024} KB) | {with_steps[0].p50_ms:.0f} | {with_steps[1]:.2f} "  # noqa: E501
        f"| {with_steps[2]['letterbox']:.1f} | {with_steps[2]['nms']:.1f} |",
        "",
        f"Beyond the detector, the pipeline adds {with_steps[0].p50_ms - alone[0].p50_ms:+.0f} ms at the median "
        f"(decode and letterbox {with_steps[2]['letterbox']:.1f} ms, NMS {with_steps[2]['nms']:.1f} ms of compute per "
        "image). Both steps are Python models on instance threads, never the event loop: the loop's CPU "
        f"per request is {with_steps[1]:.2f} ms for the pipeline against {alone[1]:.2f} ms for the detector alone, "
        "whose request carries a 4.9 MB tensor where the pipeline's carries the JPEG.",
        "",
    ]


def v1_profile(tg: ServerProcess, body: Path, seconds: float) -> list[str]:
    """Where a V1 JSON request's time goes: py-spy on the server while hey sends the seed's 10 MB bodies."""
    assert tg.process is not None
    raw = Path(tempfile.mkdtemp()) / "v1.txt"
    url = f"{tg.url}/v1/models/yolov8:predict"
    try:
        if not record(tg.process.pid, seconds, raw, lambda: hey_run("v1", "tensorgate", url, body, seconds, CLIENTS)):
            return ["_py-spy could not sample the server: the V1 profile is missing._", ""]
        loop: dict[str, int] = {}
        threads: dict[str, int] = {}
        for line in raw.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack:
                continue
            leaf = re.sub(r":\d+\)$", ")", stack.split(";")[-1])
            leaf = re.sub(r"\(/.*/(site-packages|lib/python3\.\d+|tensorgate)/", "(", leaf)
            into = threads if "_bootstrap" in stack else loop
            into[leaf] = into.get(leaf, 0) + int(count)
    finally:
        shutil.rmtree(raw.parent, ignore_errors=True)
    total = sum(loop.values()) + sum(threads.values())
    if not total:
        return ["_py-spy took no samples._", ""]
    lines = [
        f"#### Where a V1 JSON request's time goes (py-spy at 250 Hz on the server, hey -c {CLIENTS}, {seconds:g} s)",
        "",
        f"The event loop's thread had {sum(loop.values()) / total:.0%} of the samples and the instance and "
        f"runtime threads {sum(threads.values()) / total:.0%}. The event loop's deepest Python frames (the "
        "compiled modules are invisible to py-spy: their time counts in the nearest Python frame that calls "
        "them, `run_asgi` for the HTTP app, where the V1 body is parsed into a tensor and the answer encoded):",
        "",
        "| frame (event loop) | share of all samples |",
        "|---|---:|",
    ]
    for frame, count in sorted(loop.items(), key=lambda kv: -kv[1])[:8]:
        lines.append(f"| `{frame}` | {count / total:.1%} |")
    lines.append("")
    return lines


def overload_run(tg: ServerProcess, model: str, tensors: Path, seconds: float) -> list[str]:
    """The seed's OOM story: ten times the clients, more than the queue admits; memory sampled throughout."""
    assert tg.process is not None
    pids = tree(tg.process.pid)
    idle = rss_mb(pids)
    samples: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(rss_mb(pids))
            stop.wait(0.25)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        run = tg_bench("overload", "tensorgate", tg.url, model, "v2-binary", seconds, OVERLOAD, tensors)
    finally:
        stop.set()
        sampler.join()
    alive = tg.process.poll() is None
    third = max(1, len(samples) // 3)
    return [
        f"#### 10x overload: {OVERLOAD} clients against a queue of 32 (V2 binary, {seconds:g} s)",
        "",
        f"- Resident memory of the server: {idle:.0f} MB before, peak {max(samples):.0f} MB, "
        f"{statistics.fmean(samples[:third]):.0f} MB over the first third of the run and "
        f"{statistics.fmean(samples[-third:]):.0f} MB over the last (flat: bounded by the queue and one batch).",
        f"- Answered: {run.requests - run.errors} at {run.rps:.2f} req/s; refused at once with 503: {run.errors}; "
        f"the server {'lived' if alive else '**died**'} (no out-of-memory kill).",
        "",
    ]


def report_workload(
    lines: list[str],
    summary: dict[str, Any],
    name: str,
    ceiling: Ceiling,
    targets: list[Target],
    runs: list[list[Run]],
    rounds: int,
) -> None:
    by_label: dict[str, list[Run]] = {}
    for this_round in runs:
        for run in this_round:
            by_label.setdefault(run.label, []).append(run)
    lines += ceiling.lines("requests")
    lines += [
        "",
        "| served | req/s | mean ms | P50 ms | P90 ms | P99 ms | P99/P50 | errors | of ceiling |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    best = ceiling.best()
    ratios: dict[str, list[float]] = {}
    for target in targets:
        found = by_label.get(target.label, [])
        if not found:
            continue
        of = [r.rps / ceiling.samples[i][best] for i, r in enumerate(found)]
        ratios[target.label] = of

        def med(attr: str, found: list[Run] = found) -> float:
            return statistics.median(getattr(r, attr) for r in found)

        lines.append(
            f"| {target.label} | {med('rps'):.2f} | {med('mean_ms'):.0f} | {med('p50_ms'):.0f} | {med('p90_ms'):.0f} "
            f"| {med('p99_ms'):.0f} | {med('p99_ms') / med('p50_ms'):.2f} | {sum(r.errors for r in found)} "
            f"| {ratio_text(of)} |"
        )
    lines += [
        "",
        f"Medians over {rounds} rounds; `of ceiling`: each round's req/s over that round's ceiling, median (90 % interval).",  # noqa: E501
        "",
    ]
    comparisons = []
    for target in targets:
        if target.compare is None or target.label not in by_label or target.compare not in by_label:
            continue
        ours, theirs = by_label[target.compare], by_label[target.label]
        throughput = [a.rps / b.rps for a, b in zip(ours, theirs, strict=False) if b.rps > 0]
        tails = [a.p99_ms / b.p99_ms for a, b in zip(ours, theirs, strict=False) if b.p99_ms > 0]
        comparisons.append(
            f"| {target.compare} / {target.label} | {ratio_text(throughput)} | {ratio_text(tails)} "
            f"| {verdict(throughput, BAR_OF_TRITON)} | {verdict(tails, 1.0, higher=False)} |"
        )
        summary.setdefault("peers", []).append((name, target.compare, target.label, throughput, tails))
    if comparisons:
        lines += [
            "| ratio (same protocol, same round) | throughput | P99 | throughput bar >= 1.3x | P99 no worse |",
            "|---|---:|---:|---|---|",
            *comparisons,
            "",
        ]
    if name == "yolov8":
        for label, bar in (
            ("tensorgate, V2 binary", BAR_OF_CEILING),
            ("tensorgate, gRPC", BAR_OF_CEILING),
            ("tensorgate, V1 JSON (hey)", BAR_OF_CEILING_V1),
        ):
            if label in ratios:
                lines.append(
                    f"- {label} of the ceiling: {ratio_text(ratios[label])}; bar >= {bar:.2f}: {verdict(ratios[label], bar)}."  # noqa: E501
                )
        lines.append("")
    if (
        name == "bert"
        and "tensorgate, V2 binary" in by_label
        and "tensorgate, V2 binary, mixed lengths (ragged)" in by_label
    ):
        mean_length = statistics.fmean(BERT_LENGTHS)
        same = [r.rps * BERT_LENGTH for r in by_label["tensorgate, V2 binary"]]
        mixed = [r.rps * mean_length for r in by_label["tensorgate, V2 binary, mixed lengths (ragged)"]]
        cost = [m / s for m, s in zip(mixed, same, strict=False)]
        lines += [
            f"- Padding: requests of {min(BERT_LENGTHS)} to {max(BERT_LENGTHS)} tokens (mean {mean_length:.0f}) batched "  # noqa: E501
            f"together, each batch padded to its own longest, against requests all of {BERT_LENGTH} tokens: real tokens/s "  # noqa: E501
            f"mixed over same-length {ratio_text(cost)} (1.0 would be padding for free; padding every batch to the "
            f"longest request, {max(BERT_LENGTHS)}, would do at best about {mean_length / max(BERT_LENGTHS):.2f}).",
            "",
        ]


# -- the headline harness ----------------------------------------------------------------------


MLP_CONFIG = "max_batch_size: 8\ndynamic_batching: {max_queue_delay_ms: 5}\n"


def section_headline(
    work: Path, peers_python: Path | None, seconds: float, rounds: int, lines: list[str], summary: dict[str, Any]
) -> None:
    """hey -c 64 against the MLP served by tensorgate (default flags, and as bench_front_end ran it),
    naive Flask, PyTriton and MLServer, interleaved rounds."""
    rng = np.random.default_rng(0)
    roots = {}
    for features in (64, 16):
        root = work / f"mlp{features}"
        (root / "mlp" / "1").mkdir(parents=True)
        (root / "mlp" / "1" / "model.onnx").write_bytes(mlp_model(in_features=features).SerializeToString())
        (root / "mlp" / "config.yaml").write_text(MLP_CONFIG)
        roots[features] = root
    bodies = {}
    for features in (64, 16):
        body = {
            "inputs": [
                {
                    "name": "features",
                    "shape": [1, features],
                    "datatype": "FP32",
                    "data": rng.uniform(-1, 1, features).tolist(),
                }
            ]
        }
        bodies[features] = work / f"body{features}.json"
        bodies[features].write_text(json.dumps(body))
    pure = pure_copy(work / "pure")
    servers = {
        "tensorgate, default flags": ServerProcess("--model-repository", str(roots[64])),
        "tensorgate, bench_front_end's flags (--log-level warning, OMP_NUM_THREADS=1)": ServerProcess(
            "--model-repository", str(roots[64]), "--log-level", "warning", env={"OMP_NUM_THREADS": "1"}
        ),
        "tensorgate, default flags, pure-Python build": ServerProcess(
            "--model-repository", str(roots[64]), env=pure_env(pure)
        ),
        "tensorgate, bench_front_end's setup (16 features, its flags)": ServerProcess(
            "--model-repository", str(roots[16]), "--log-level", "warning", env={"OMP_NUM_THREADS": "1"}
        ),
    }
    peers: list[Peer] = []
    stack = contextlib.ExitStack()
    with stack:
        for server in servers.values():
            stack.enter_context(server)
        naive64 = stack.enter_context(
            flask_baseline(work / "naive64", mlp_model(in_features=64).SerializeToString(), bodies[64].read_bytes())
        )
        naive16 = stack.enter_context(
            flask_baseline(work / "naive16", mlp_model(in_features=16).SerializeToString(), bodies[16].read_bytes())
        )
        naive64_1 = stack.enter_context(
            flask_baseline(
                work / "naive64-1",
                mlp_model(in_features=64).SerializeToString(),
                bodies[64].read_bytes(),
                ort_threads=1,
            )
        )
        endpoints: dict[str, tuple[str, Path]] = {
            label: (f"{s.url}/v2/models/mlp/infer", bodies[16 if "16" in label else 64]) for label, s in servers.items()
        }
        endpoints["naive Flask (64 features)"] = (naive64, bodies[64])
        endpoints["naive Flask (64 features), onnxruntime on one thread"] = (naive64_1, bodies[64])
        endpoints["naive Flask (16 features, as bench_front_end)"] = (naive16, bodies[16])
        if peers_python is not None:
            onnx = roots[64] / "mlp" / "1" / "model.onnx"
            triton = PyTriton(peers_python, onnx, "mlp", 1)
            signature = {
                "inputs": [{"name": "features", "datatype": "FP32", "shape": [-1, 64]}],
                "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 3]}],
            }
            mlserver = MLServer(peers_python, onnx, "mlp", 1, signature)
            peers = [triton, mlserver]
            stack.callback(lambda: [p.stop() for p in peers])
            try:
                for peer in peers:
                    peer.wait_ready("mlp")
                endpoints["Triton (PyTriton)"] = (f"{triton.url}/v2/models/mlp/infer", bodies[64])
                endpoints["MLServer"] = (f"{mlserver.url}/v2/models/mlp/infer", bodies[64])
            except (RuntimeError, TimeoutError) as exc:
                lines.append(f"_A peer server failed to start: {str(exc)[:600]}_")
        labels = list(endpoints)
        for label in labels:  # warm each once
            hey_run(label, label, endpoints[label][0], endpoints[label][1], 2, 64)
        runs: dict[str, list[Run]] = {label: [] for label in labels}
        for index in range(rounds):
            shift = index * len(labels) // max(1, rounds)
            for label in labels[shift:] + labels[:shift]:
                url, body = endpoints[label]
                run = hey_run(label, label, url, body, seconds, 64)
                runs[label].append(run)
                print(f"headline round {index + 1}: {label}: {run.rps:,.0f} req/s", flush=True)
    lines += [
        "### The headline: the MLP under hey -c 64",
        "",
        "The 64-feature MLP, max batch 8 and a 5 ms window, V2 JSON, `hey -c 64 -z "
        f"{seconds:g}s`, every server up at once and driven in interleaved rounds (the order rotating), "
        "client and servers sharing the host's cores. Besides the neutral configuration, the rows that "
        "differ from it in one way each: how `bench_front_end.py` ran tensorgate for the published 8.6x "
        "(flags, environment, the 16-feature model), a pure-Python build, and the naive server with "
        "onnxruntime on one thread.",
        "",
        "| server | req/s | P50 ms | P99 ms | errors | over naive Flask (64 features), per round |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    naive = runs["naive Flask (64 features)"]
    for label in labels:
        found = runs[label]
        over = [a.rps / b.rps for a, b in zip(found, naive, strict=True)]
        lines.append(
            f"| {label} | {statistics.median(r.rps for r in found):,.0f} | {statistics.median(r.p50_ms for r in found):.1f} "  # noqa: E501
            f"| {statistics.median(r.p99_ms for r in found):.1f} | {sum(r.errors for r in found)} | {ratio_text(over)} |"  # noqa: E501
        )
    summary["headline"] = runs
    lines.append("")


# -- main ------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="each served run (default 8)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="yolov8,resnet50,bert,mlp")
    parser.add_argument(
        "--size", choices=("full", "test"), default="full", help="test: the slim models, to try the script"
    )
    args = parser.parse_args()
    SIZE[0] = args.size
    chosen = [part for part in args.only.split(",") if part]
    OUT.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    peers_python, note = ensure_venv()
    lines = [f"## The seeds' workloads side by side with Triton and MLServer ({STEM}.py)", ""]
    if peers_python is None:
        lines += [f"_Triton and MLServer could not run: {note}_", ""]
    summary: dict[str, Any] = {}
    body: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        baseline = empty_server_rss()
        for name in ("yolov8", "resnet50", "bert"):
            if name in chosen:
                section_workload(work, name, peers_python, args.seconds, args.rounds, body, summary)
        if "mlp" in chosen:
            section_headline(work, peers_python, args.seconds, args.rounds, body, summary)
    lines += summary_lines(summary, baseline, args)
    load = os.getloadavg()
    lines += [
        f"The host's load average (1, 5, 15 min) at the end of the run: {load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f} "
        f"on {CORES} cores: other work shared the cores while this ran, and every figure carries it.",
        "",
    ]
    lines += body
    lines.append(f"_Ran in {(time.monotonic() - started) / 60:.0f} min._")
    (OUT / f"{STEM}.md").write_text("\n".join(lines) + "\n")
    return 0


def summary_lines(summary: dict[str, Any], baseline: float, args: argparse.Namespace) -> list[str]:
    lines = [
        f"Every server serves the same ONNX file with onnxruntime on {CORES} threads and one instance, batching "
        f"at most 8 requests with a 5 ms window; {CLIENTS} clients (the seeds' concurrency), closed loop, "
        f"`tensorgate bench` for every server (`hey` for the V1 JSON rows and the headline), {args.seconds:g} s "
        f"runs, {args.rounds} rounds with the servers' order rotating. No accelerator was lent to this run: "
        "everything is on the host's CPUs, which the client shares.",
        "",
    ]
    if "warmup" in summary:
        lines += [
            "#### Warm-up and memory (fresh servers, the shipped configuration's warm-up)",
            "",
            "| workload | first request after ready, ms | steady P50 at one client, ms | first / P50 (bar <= 1.5) | ready before warm-up ended | resident MB, server | per instance (over an empty server) |",  # noqa: E501
            "|---|---:|---:|---:|---|---:|---:|",
        ]
        for name, first, steady, early, rss in summary["warmup"]:
            ratio = first / steady
            lines.append(
                f"| {name} | {first:.0f} | {steady:.0f} | {ratio:.2f} ({'met' if ratio <= BAR_FIRST_REQUEST else '**missed**'}) "  # noqa: E501
                f"| {'**yes**' if early else 'no'} | {rss:.0f} | {rss - baseline:.0f} |"
            )
        lines += ["", f"An empty server (no model) is {baseline:.0f} MB resident.", ""]
    if "peers" in summary:
        lines += [
            "#### Against Triton and MLServer (tensorgate over the peer, same protocol, same round)",
            "",
            "| workload | rows | throughput | P99 |",
            "|---|---|---:|---:|",
        ]
        for name, ours, theirs, throughput, tails in summary["peers"]:
            lines.append(f"| {name} | {ours} / {theirs} | {ratio_text(throughput)} | {ratio_text(tails)} |")
        lines.append("")
    return lines


if __name__ == "__main__":
    sys.exit(main())
