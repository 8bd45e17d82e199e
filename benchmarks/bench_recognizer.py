"""The bundled streaming recognizer at real-time pace: how many concurrent streams keep every chunk's
answer within a P99 of 100 ms, against its ceiling, and what keeping the state in the server saves.

Every stream sends a 100 ms chunk of 16 kHz audio (1600 INT16 samples) every 100 ms, as a
microphone would, 50 chunks an utterance, back to back; latency runs from when a chunk was due to
its answer (``tensorgate/bench/sequences.py``: the driver of ``tensorgate bench --sequences``, used
here for every variant, so all are paced and timed alike). The most streams within P99 < 100 ms is
found by the same search as ``tensorgate bench --search`` (doubling, then bisecting to 5 %).

1. **Served, implicit state**: ``tensorgate serve`` with the bundled ``recognizer`` (three sequence
   models, each step's state in the server's sequence table), one gRPC stream per utterance.
   The same search is also run by the command a user would type (``tensorgate bench --sequences
   --search``), in a process of its own, as a cross-check of the in-script client.
2. **Ceiling**: the same three steps in this process, no server: one thread per step (as the
   server has one instance per step), each taking whatever chunks wait for it as one batch (up to
   32, as the steps' ``max_batch_size``), each sequence's state in a dictionary, driven at the same
   pace by the same driver.
3. **State kept by the client**: the same models as plain (non-sequence) models with dynamic
   batching, in a pipeline whose inputs and outputs include every state tensor; the client sends
   each utterance's state with every chunk and keeps what comes back (about 6 KB each way per
   chunk, most of it the transcript buffer). Its search, and per-chunk latency at a fixed count of
   streams in alternating rounds beside implicit state.
4. **PyTriton**: not run; the section says why.

Run: ``python benchmarks/bench_recognizer.py [--seconds 6] [--rounds 3] [--limit 512]``; writes
``benchmarks/out/bench_recognizer.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnxruntime as ort
import yaml

from tensorgate.bench.inputs import Tensor
from tensorgate.bench.job import run_async
from tensorgate.bench.results import RunResult
from tensorgate.bench.sequences import SequenceSpec, run_sequences
from tensorgate.bench.stats import summarize
from tensorgate.bench.stream_search import StreamSearch
from tensorgate.bench.targets.base import Endpoint, Outcome
from tensorgate.bench.targets.grpc_v2 import STREAM_METHOD, is_final, open_channel, stubs
from tensorgate.bench.targets.sequences import GrpcStreamSequences, SequenceTarget
from tensorgate.clock import MonotonicClock
from tensorgate.examples import build_example_repository
from tensorgate.examples.recognizer import ACOUSTIC_MODEL
from tensorgate.examples.recognizer.decode import CAPACITY, CtcDecode
from tensorgate.examples.recognizer.features import TAIL, Features
from tensorgate.testing import ServerProcess

OUT = Path(__file__).parent / "out"
STEM = Path(__file__).stem
CHUNK = 1600  # 100 ms at 16 kHz
INTERVAL_S = 0.1
CHUNKS = 50  # a 5 s utterance
SLO = "p99=100ms"
P99_LIMIT_S = 0.1
MAX_BATCH = 32
# The state of one utterance, per step: name -> (dtype, shape without the batch dimension).
STATES = {
    "pcm_tail": (np.float32, (TAIL,)),
    "conv_state": (np.float32, (2, 40)),
    "gru_state": (np.float32, (128,)),
    "last_token": (np.int32, (1,)),
    "text": (np.int32, (CAPACITY,)),
}
DATATYPES = {np.float32: "FP32", np.int32: "INT32", np.int16: "INT16"}


def _audio() -> np.ndarray:
    """Speech-level noise: the cost of a chunk does not depend on what it says."""
    return np.random.default_rng(0).normal(0, 3000, (1, CHUNK)).clip(-32768, 32767).astype(np.int16)


# -- the repository: the bundled recognizer, and its client-kept-state twin ------------------------


def _explicit_models(repo: Path) -> None:
    """``recognizer_explicit``: the same model files, the state as ordinary inputs and outputs."""
    batching = {"max_queue_delay_ms": 1}

    def tensor(name: str, dtype: Any, shape: Sequence[int]) -> dict[str, Any]:
        return {"name": name, "datatype": DATATYPES[dtype], "shape": [-1, *shape]}

    def state(name: str, direction: str) -> dict[str, Any]:
        dtype, shape = STATES[name]
        return tensor(f"{name}_{direction}", dtype, shape)

    steps = {
        "asr_features_explicit": (
            "asr_features",
            {"backend": "python", "inputs": [tensor("audio", np.int16, [-1]), state("pcm_tail", "in")]},
            {"outputs": [tensor("features", np.float32, [-1, 40]), state("pcm_tail", "out")]},
        ),
        "asr_acoustic_explicit": ("asr_acoustic", {}, {}),
        "asr_decode_explicit": (
            "asr_decode",
            {
                "backend": "python",
                "inputs": [tensor("logits", np.float32, [-1, 29]), state("last_token", "in"), state("text", "in")],
            },
            {
                "outputs": [
                    {"name": "transcript", "datatype": "BYTES", "shape": [-1, 1]},
                    state("last_token", "out"),
                    state("text", "out"),
                ]
            },
        ),
    }
    for name, (source, head, tail) in steps.items():
        (repo / name / "1").mkdir(parents=True)
        for artifact in (repo / source / "1").iterdir():
            (repo / name / "1" / artifact.name).write_bytes(artifact.read_bytes())
        config = {**head, **tail, "max_batch_size": MAX_BATCH, "dynamic_batching": batching}
        (repo / name / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    (repo / "recognizer_explicit" / "1").mkdir(parents=True)
    pipeline = {
        "backend": "pipeline",
        "inputs": [tensor("audio", np.int16, [-1])] + [state(name, "in") for name in STATES],
        "outputs": [{"name": "transcript", "datatype": "BYTES", "shape": [-1, 1]}]
        + [state(name, "out") for name in STATES],
        "steps": [
            {
                "model": "asr_features_explicit",
                "inputs": {"audio": "audio", "pcm_tail_in": "pcm_tail_in"},
                "outputs": {"features": "features", "pcm_tail_out": "pcm_tail_out"},
            },
            {
                "model": "asr_acoustic_explicit",
                "inputs": {"features": "features", "conv_state_in": "conv_state_in", "gru_state_in": "gru_state_in"},
                "outputs": {"logits": "logits", "conv_state_out": "conv_state_out", "gru_state_out": "gru_state_out"},
            },
            {
                "model": "asr_decode_explicit",
                "inputs": {"logits": "logits", "last_token_in": "last_token_in", "text_in": "text_in"},
                "outputs": {"transcript": "transcript", "last_token_out": "last_token_out", "text_out": "text_out"},
            },
        ],
    }
    (repo / "recognizer_explicit" / "config.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))


class ExplicitStateTarget:
    """A gRPC stream per utterance, as the bench's; each chunk carries the utterance's state, and
    the state in the answer is kept for the next chunk (zeros at an utterance's start)."""

    def __init__(self, endpoint: Endpoint, audio: np.ndarray) -> None:
        self._endpoint = endpoint
        self._pb = stubs()[0]
        self._audio = audio
        self._channels: list[Any] = []
        self._streams: list[Any] = []
        self._states: list[dict[str, np.ndarray]] = []

    async def open(self, slots: int) -> None:
        for _ in range(slots):
            channel = open_channel(self._endpoint, own_connection=True)
            await channel.channel_ready()
            self._channels.append(channel)
            self._streams.append(None)
            self._states.append({})

    def _request(self, state: dict[str, np.ndarray]) -> bytes:
        request = self._pb.ModelInferRequest(model_name="recognizer_explicit")
        tensors = [("audio", self._audio)] + [(f"{name}_in", state[name]) for name in STATES]
        for name, array in tensors:
            entry = request.inputs.add()
            entry.name = name
            entry.datatype = DATATYPES[array.dtype.type]
            entry.shape.extend(array.shape)
            request.raw_input_contents.append(array.tobytes())
        return bytes(request.SerializeToString())

    async def send(self, slot: int, variant: int, sequence_id: int | str, start: bool, end: bool) -> Outcome:
        if start:
            self._states[slot] = {name: np.zeros((1, *shape), dtype) for name, (dtype, shape) in STATES.items()}
        stream = self._streams[slot]
        if stream is None:
            method = self._channels[slot].stream_stream(
                STREAM_METHOD, response_deserializer=self._pb.ModelStreamInferResponse.FromString
            )
            stream = self._streams[slot] = method()
        done = False
        try:
            await stream.write(self._request(self._states[slot]))
            answer = await stream.read()
            if answer is grpc.aio.EOF or not is_final(answer):
                return Outcome("grpc stream ended")
            done = True
            if answer.error_message:
                return Outcome("grpc stream error")
            response = answer.infer_response
            kept = {}
            for output, raw in zip(response.outputs, response.raw_output_contents, strict=True):
                name = output.name.removesuffix("_out")
                if name in STATES:
                    dtype, shape = STATES[name]
                    kept[name] = np.frombuffer(raw, dtype).reshape(1, *shape)
            if set(kept) != set(STATES):
                return Outcome("state missing from the answer")
            self._states[slot] = kept
            return Outcome()
        finally:
            if not done:
                stream.cancel()
                self._streams[slot] = None

    async def aclose(self) -> None:
        for stream in self._streams:
            if stream is not None:
                stream.cancel()
        for channel in self._channels:
            await channel.close()


# -- the ceiling: the three steps in this process ------------------------------------------------


class InProcessTarget:
    """One thread per step, each running whatever chunks wait as one batch (up to 32)."""

    def __init__(self, audio: np.ndarray) -> None:
        self._audio = audio[0]
        self._session = ort.InferenceSession(str(ACOUSTIC_MODEL), providers=["CPUExecutionProvider"])
        self._features, self._decode = Features(), CtcDecode()
        self._queues: list[queue.Queue[Any]] = [queue.Queue() for _ in range(3)]
        self._state: dict[int | str, dict[str, np.ndarray]] = {}
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    async def open(self, slots: int) -> None:
        self._loop = asyncio.get_running_loop()
        stages: list[Callable[[list[Any]], None]] = [self._stage_features, self._stage_acoustic, self._stage_decode]
        for index, stage in enumerate(stages):
            thread = threading.Thread(target=self._worker, args=(index, stage), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _worker(self, index: int, stage: Callable[[list[Any]], None]) -> None:
        source = self._queues[index]
        while True:
            first = source.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < MAX_BATCH:
                try:
                    item = source.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    source.put(None)
                    break
                batch.append(item)
            stage(batch)

    def _stage_features(self, batch: list[Any]) -> None:
        for item in batch:
            if item["start"]:
                self._state[item["id"]] = {name: np.zeros(shape, dtype) for name, (dtype, shape) in STATES.items()}
        states = [self._state[item["id"]] for item in batch]
        out = self._features.execute(
            {"audio": np.stack([self._audio] * len(batch)), "pcm_tail_in": np.stack([s["pcm_tail"] for s in states])}
        )
        for i, item in enumerate(batch):
            states[i]["pcm_tail"] = out["pcm_tail_out"][i]
            item["features"] = out["features"][i]
        for item in batch:
            self._queues[1].put(item)

    def _stage_acoustic(self, batch: list[Any]) -> None:
        states = [self._state[item["id"]] for item in batch]
        logits, conv, gru = self._session.run(
            None,
            {
                "features": np.stack([item["features"] for item in batch]),
                "conv_state_in": np.stack([s["conv_state"] for s in states]),
                "gru_state_in": np.stack([s["gru_state"] for s in states]),
            },
        )
        for i, item in enumerate(batch):
            states[i]["conv_state"], states[i]["gru_state"] = conv[i], gru[i]
            item["logits"] = logits[i]
        for item in batch:
            self._queues[2].put(item)

    def _stage_decode(self, batch: list[Any]) -> None:
        states = [self._state[item["id"]] for item in batch]
        out = self._decode.execute(
            {
                "logits": np.stack([item["logits"] for item in batch]),
                "last_token_in": np.stack([s["last_token"] for s in states]),
                "text_in": np.stack([s["text"] for s in states]),
            }
        )
        assert self._loop is not None
        for i, item in enumerate(batch):
            states[i]["last_token"], states[i]["text"] = out["last_token_out"][i], out["text_out"][i]
            if item["end"]:
                del self._state[item["id"]]
            self._loop.call_soon_threadsafe(_resolve, item["done"])

    async def send(self, slot: int, variant: int, sequence_id: int | str, start: bool, end: bool) -> Outcome:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queues[0].put({"id": sequence_id, "start": start, "end": end, "done": done})
        await done
        return Outcome()

    async def aclose(self) -> None:
        for source in self._queues:
            source.put(None)
        for thread in self._threads:
            await asyncio.to_thread(thread.join, 10.0)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


# -- runs and searches ---------------------------------------------------------------------------


def _run(make_target: Callable[[], SequenceTarget], count: int, seconds: float, first_id: int) -> RunResult:
    spec = SequenceSpec(
        slots=count, chunks=CHUNKS, interval_s=INTERVAL_S, duration_s=seconds, warmup_s=1.0, first_id=first_id
    )

    async def go() -> RunResult:
        target = make_target()
        try:
            return await run_sequences(target, spec, MonotonicClock())
        finally:
            await target.aclose()

    return run_async(go)


class Ids:
    """Sequence ids apart from run to run (the server remembers recently ended ones)."""

    def __init__(self) -> None:
        self.next = int.from_bytes(os.urandom(5), "big") + 1

    def take(self) -> int:
        value = self.next
        self.next += 2**32
        return value


def _passes(result: RunResult) -> bool:
    return not result.errors and result.successes > 0 and summarize(result.latencies).get(99.0) <= P99_LIMIT_S


def _searches(
    variants: dict[str, Callable[[], SequenceTarget]], seconds: float, limit: int, ids: Ids, start: int
) -> tuple[dict[str, StreamSearch], list[str]]:
    """Every variant's search in lockstep: each step runs each variant's next count in turn, so the
    variants meet the same host (a shared one whose load moves) at the same time."""
    searches = {label: StreamSearch(start=start, limit=limit) for label in variants}
    rows: dict[str, list[str]] = {label: [] for label in variants}
    while True:
        step = [(label, search.next()) for label, search in searches.items()]
        step = [(label, count) for label, count in step if count is not None]
        if not step:
            break
        for label, count in step:
            assert count is not None
            result = _run(variants[label], count, seconds, ids.take())
            ok = _passes(result)
            searches[label].record(count, ok)
            rows[label].append(_row(label, count, result, ok))
            print(rows[label][-1], flush=True)
    return searches, [row for label in variants for row in rows[label]]


def _row(label: str, count: int, result: RunResult, ok: bool | None = None) -> str:
    summary = summarize(result.latencies)
    errors = sum(result.errors.values())
    verdict = "" if ok is None else (" | yes" if ok else " | no")
    return (
        f"| {label} | {count} | {result.completed} | {errors} | {summary.get(50.0) * 1e3:.1f} | "
        f"{summary.get(90.0) * 1e3:.1f} | {summary.get(99.0) * 1e3:.1f} | {summary.tail_ratio:.2f}{verdict} |"
    )


def _cli_search(server: ServerProcess, seconds: float, limit: int, start: int, work: Path) -> dict[str, Any]:
    """``tensorgate bench --sequences --search`` as a user runs it, in its own process."""
    report = work / "cli-search.json"
    command = [sys.executable, "-m", "tensorgate", "bench", "recognizer", "-u", server.grpc_address]
    command += ["--shape", "audio=1,1600", "--sequences", str(start), "--search", "--max-sequences", str(limit)]
    command += ["--chunks-per-sequence", str(CHUNKS), "--chunk-interval-ms", str(INTERVAL_S * 1000)]
    command += ["-z", f"{seconds}s", "--warmup", "1s", "--slo", SLO, "--json", str(report)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    print(done.stdout, done.stderr, flush=True)
    document: dict[str, Any] = json.loads(report.read_text())
    return document


def _check_same_transcripts(server: ServerProcess, audio: np.ndarray) -> bool:
    """One utterance through both pipelines: the client-kept state gives the same transcript."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_address)
    state = {name: np.zeros((1, *shape), dtype) for name, (dtype, shape) in STATES.items()}
    same = True
    for index in range(20):
        chunk = np.roll(audio, index * 97, axis=1)
        tensor = grpcclient.InferInput("audio", [1, CHUNK], "INT16")
        tensor.set_data_from_numpy(chunk)
        implicit = client.infer(
            "recognizer", [tensor], sequence_id=7_777_777, sequence_start=index == 0, sequence_end=index == 19
        )
        inputs = [tensor]
        for name, array in state.items():
            entry = grpcclient.InferInput(f"{name}_in", list(array.shape), DATATYPES[array.dtype.type])
            entry.set_data_from_numpy(array)
            inputs.append(entry)
        explicit = client.infer("recognizer_explicit", inputs)
        state = {name: explicit.as_numpy(f"{name}_out") for name in STATES}
        same = same and implicit.as_numpy("transcript")[0, 0] == explicit.as_numpy("transcript")[0, 0]
    return same


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="counted seconds per run (after 1 s of warm-up)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds at a fixed count")
    parser.add_argument("--limit", type=int, default=512, help="the most streams a search tries")
    parser.add_argument("--start", type=int, default=8, help="the count a search starts from")
    args = parser.parse_args()
    audio = _audio()
    ids = Ids()
    load_before = os.getloadavg()
    lines = [
        "## The streaming recognizer at real-time pace",
        "",
        f"Each stream: a {CHUNK}-sample (100 ms) INT16 chunk every {INTERVAL_S * 1000:g} ms, {CHUNKS} chunks an "
        f"utterance, utterances back to back; {args.seconds:g} s counted per run after 1 s of warm-up. Latency per "
        "chunk from when it was due to its answer. The most streams within P99 < 100 ms (and no error) is found "
        "by doubling from "
        f"{args.start}, then bisecting to 5 % (at most {args.limit}). `benchmarks/bench_recognizer.py`.",
        "",
        "| variant | streams | chunks | errors | P50 ms | P90 ms | P99 ms | P99/P50 | P99 < 100 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    summary: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-recognizer-") as tmp:
        work = Path(tmp)
        repo = build_example_repository(work / "repo")
        _explicit_models(repo)
        env = {"OMP_NUM_THREADS": "1"}
        with ServerProcess("--model-repository", str(repo), env=env) as server:
            same = _check_same_transcripts(server, audio)
            endpoint = Endpoint("127.0.0.1", server.ports["grpc"], "")
            chunk = [(Tensor("audio", "INT16", audio),)]

            def implicit() -> SequenceTarget:
                return GrpcStreamSequences(endpoint, "recognizer", None, chunk)

            def explicit() -> SequenceTarget:
                return ExplicitStateTarget(endpoint, audio)

            variants = {
                "served, implicit state": implicit,
                "served, state kept by the client": explicit,
                "in-process ceiling": lambda: InProcessTarget(audio),
            }
            searches, rows = _searches(variants, args.seconds, args.limit, ids, args.start)
            lines += rows
            served, served_failed = (
                searches["served, implicit state"].sustained,
                searches["served, implicit state"].failed,
            )
            kept, kept_failed = (
                searches["served, state kept by the client"].sustained,
                searches["served, state kept by the client"].failed,
            )
            ceiling, ceiling_failed = searches["in-process ceiling"].sustained, searches["in-process ceiling"].failed
            cli = _cli_search(server, args.seconds, args.limit, args.start, work)
            for run in cli["runs"]:
                latency = run["latency_s"]
                lines.append(
                    f"| `tensorgate bench --search` (implicit) | {run['level']:g} | {run['requests']} | "
                    f"{sum(run['errors'].values())} | {latency['p50'] * 1e3:.1f} | {latency['p90'] * 1e3:.1f} | "
                    f"{latency['p99'] * 1e3:.1f} | {run['p99_p50_ratio']:.2f} | "
                    f"{'yes' if all(s['met'] for s in run['slos']) and not run['errors'] else 'no'} |"
                )
            # The state round trip at one count, in alternating rounds.
            fixed = max(1, served // 2) if served else args.start
            rounds: dict[str, list[RunResult]] = {"implicit": [], "client": []}
            for _ in range(args.rounds):
                rounds["implicit"].append(_run(implicit, fixed, args.seconds, ids.take()))
                rounds["client"].append(_run(explicit, fixed, args.seconds, ids.take()))
    lines += [""]

    def most(found: int, failed: int | None) -> str:
        return f"{found}" + (f" ({failed} did not)" if failed is not None else f" (the limit, {args.limit})")

    cli_most = most(cli["search"]["sustained"], cli["search"]["first_failed"])
    summary += [
        "| | most concurrent real-time streams with P99 < 100 ms |",
        "|---|---|",
        f"| served, implicit state (the in-script client) | {most(served, served_failed)} |",
        f"| served, implicit state (`tensorgate bench --search`) | {cli_most} |",
        f"| served, state kept by the client | {most(kept, kept_failed)} |",
        f"| in-process ceiling (same steps, same batching, no server) | {most(ceiling, ceiling_failed)} |",
        "",
        f"Served / ceiling: {served / ceiling:.2f}." if ceiling else "Served / ceiling: no ceiling found.",
        f"Client-kept state / implicit state: {kept / served:.2f} of the streams." if served else "",
        "",
        f"State round trip at {fixed} streams, alternating rounds (per-chunk ms; ratio client-kept over implicit):",
        "",
        "| round | implicit P50 | client-kept P50 | ratio | implicit P99 | client-kept P99 | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for index, (a, b) in enumerate(zip(rounds["implicit"], rounds["client"], strict=True), start=1):
        sa, sb = summarize(a.latencies), summarize(b.latencies)
        summary.append(
            f"| {index} | {sa.get(50.0) * 1e3:.2f} | {sb.get(50.0) * 1e3:.2f} | {sb.get(50.0) / sa.get(50.0):.2f} | "
            f"{sa.get(99.0) * 1e3:.2f} | {sb.get(99.0) * 1e3:.2f} | {sb.get(99.0) / sa.get(99.0):.2f} |"
        )
    summary += [
        "",
        f"The two pipelines give the same transcripts chunk by chunk (checked on one utterance): {same}.",
        "",
        "PyTriton was not run beside it: PyTriton has no sequence batcher. Its model configuration offers "
        "only Triton's dynamic batcher (`TritonModelConfig.batcher` is a `DynamicBatcher`, as checked in "
        "PyTriton 0.7.0, the version `_peers.py` installs for `bench_workloads.py`), its maintainers say it "
        "passes no sequence information to the model (triton-inference-server/pytriton#50), and the "
        "`tritonserver` it bundles carries only the Python backend. Serving this model under Triton's own "
        "sequence batcher would be a Triton installation, not PyTriton; none is available on this host.",
        "",
        f"The host's load average (1, 5, 15 min) was {', '.join(f'{v:.1f}' for v in load_before)} when the "
        f"run began and {', '.join(f'{v:.1f}' for v in os.getloadavg())} when it ended (other work shares "
        "this host).",
        "",
        "Every variant shares the host's two cores with the client that drives it (and, served, with "
        "the server). The server runs as shipped (access log on) with the bundled repository's "
        "configuration: one instance per step, onnxruntime's default threads, up to 1 ms waited for "
        "batch mates; the ceiling's steps take whatever waits, without that millisecond.",
    ]
    OUT.mkdir(parents=True, exist_ok=True)
    text = [*lines[:4], *summary, "", "Every run:", "", *lines[4:]]
    (OUT / f"{STEM}.md").write_text("\n".join([*text, ""]))
    print("\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
