"""The chaos run: mixed traffic from 16 clients while a seeded driver injects faults, and every
request's answer checked.

Shared by ``bench_chaos.py`` (minutes, with a report) and ``tests/e2e/test_chaos.py`` (its short,
seeded form). The server is a real ``tensorgate serve`` over a repository built here:

- ``chaos_onnx``: an ONNX graph (``y = 2x + 1``), dynamic batching, two instances in the server;
- ``chaos_py``: a Python model (``y = x + 1``), dynamic batching, three worker processes, a small
  queue bound; it reads fault switches from a control directory on every call;
- ``chaos_pipe``: a pipeline of the two (``y = 2x + 2``).

Clients: HTTP (httpx), gRPC unary and gRPC streaming (tritonclient's asyncio client), each sending
its next request when the last is answered. Faults, at random times from the seed: kill -9 of a
worker process, an instance that hangs, one that turns 10x slow, poison requests (an input the
model refuses), a client that disconnects mid-request, a hot swap to a new version, a burst past
the queue bound. Each 2xx answer is checked against the models run in-process (onnxruntime on the
same graph, the Python model's own class); every failure is classed by its cause, and any failure
the faults do not explain is a violation.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import random
import shutil
import signal
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import yaml
from onnx import TensorProto, helper

WIDTH = 4
QUEUE_BOUND = 24  # chaos_py's max_queue_size: a burst of three times this finds it full
HANG_S = 20.0  # a hung call of chaos_py lasts this long, past the clients' timeout
CLIENT_TIMEOUT_S = 15.0
POISON = -1e7
KINDS = ("kill9", "hang", "slow", "poison", "disconnect", "hot_swap", "burst")

# Adds 1. Fault switches, files in the control directory read on every call: ``hang-<i>`` makes
# instance i sleep HANG_S per call, ``slow-<i>`` makes it ten times slower; an input below -1e6 is
# refused (tensorgate.ModelError: its message reaches the client), on every instance.
CHAOS_MODEL = """
import time
from pathlib import Path

import numpy as np

from tensorgate import ModelError, PythonModel

DELAY_S = 0.002


class Chaos(PythonModel):
    def load(self, context):
        self.control = Path(context.parameters["control"])
        self.index = context.instance.rsplit("_", 1)[-1]
        self.hang_s = float(context.parameters["hang_s"])

    def execute(self, inputs):
        x = inputs["INPUT"]
        if float(np.min(x, initial=0.0)) < -1e6:
            raise ModelError("chaos_py refuses inputs below -1e6")
        if (self.control / f"hang-{self.index}").exists():
            time.sleep(self.hang_s)
        slow = (self.control / f"slow-{self.index}").exists()
        time.sleep(DELAY_S * (10 if slow else 1))
        return {"OUTPUT": (x + 1.0).astype(np.float32)}
"""


def _onnx_graph() -> bytes:
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["INPUT", "two"], ["doubled"]),
            helper.make_node("Add", ["doubled", "one"], ["OUTPUT"]),
        ],
        "chaos_onnx",
        [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, ["batch", WIDTH])],
        [
            helper.make_tensor("two", TensorProto.FLOAT, [1], [2.0]),
            helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def build_repository(root: Path) -> tuple[Path, Path]:
    """The three models under ``root/models``; the fault switches in ``root/control``."""
    repo, control = root / "models", root / "control"
    control.mkdir(parents=True, exist_ok=True)
    tensor = {"datatype": "FP32", "shape": [-1, WIDTH]}
    (repo / "chaos_onnx" / "1").mkdir(parents=True)
    (repo / "chaos_onnx" / "1" / "model.onnx").write_bytes(_onnx_graph())
    onnx_config = {
        "max_batch_size": 16,
        "dynamic_batching": {"max_queue_delay_ms": 1},
        "instance_group": [{"count": 2}],
    }
    (repo / "chaos_onnx" / "config.yaml").write_text(yaml.safe_dump(onnx_config))
    (repo / "chaos_py" / "1").mkdir(parents=True)
    (repo / "chaos_py" / "1" / "model.py").write_text(CHAOS_MODEL)
    py_config = {
        "backend": "python",
        "max_batch_size": 16,
        "inputs": [{"name": "INPUT", **tensor}],
        "outputs": [{"name": "OUTPUT", **tensor}],
        "parameters": {"control": str(control), "hang_s": HANG_S},
        "instance_group": [{"count": 3, "isolation": "process"}],
        "dynamic_batching": {"max_queue_delay_ms": 1, "max_queue_size": QUEUE_BOUND},
    }
    (repo / "chaos_py" / "config.yaml").write_text(yaml.safe_dump(py_config))
    (repo / "chaos_pipe" / "1").mkdir(parents=True)
    pipe_config = {
        "backend": "pipeline",
        "inputs": [{"name": "INPUT", **tensor}],
        "outputs": [{"name": "OUTPUT", **tensor}],
        "steps": [
            {"model": "chaos_onnx", "inputs": {"INPUT": "INPUT"}, "outputs": {"OUTPUT": "doubled"}},
            {"model": "chaos_py", "inputs": {"INPUT": "doubled"}, "outputs": {"OUTPUT": "OUTPUT"}},
        ],
    }
    (repo / "chaos_pipe" / "config.yaml").write_text(yaml.safe_dump(pipe_config))
    return repo, control


class Reference:
    """The models run in-process: the graph through onnxruntime, the Python model through its class."""

    def __init__(self, repo: Path) -> None:
        import onnxruntime

        self._session = onnxruntime.InferenceSession(
            str(repo / "chaos_onnx" / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
        )
        spec = importlib.util.spec_from_file_location("chaos_reference", repo / "chaos_py" / "1" / "model.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        self._python = module.Chaos.__new__(module.Chaos)
        self._python.control = repo / "no-faults-here"
        self._python.index = "reference"
        self._python.hang_s = 0.0

    def onnx(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self._session.run(["OUTPUT"], {"INPUT": x})[0])

    def python(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self._python.execute({"INPUT": x})["OUTPUT"])

    def expected(self, model: str, x: np.ndarray) -> np.ndarray:
        if model == "chaos_onnx":
            return self.onnx(x)
        if model == "chaos_py":
            return self.python(x)
        return self.python(self.onnx(x))


@dataclass(frozen=True, slots=True)
class Outcome:
    lane: str  # http, grpc, stream, burst, poison
    model: str
    cause: str  # ok, wrong, poison, queue_full, failed
    detail: str = ""
    seconds: float = 0.0


@dataclass
class Report:
    seed: int
    duration_s: float
    faults: Counter[str] = field(default_factory=Counter)
    outcomes: list[Outcome] = field(default_factory=list)
    disconnects: int = 0
    violations: list[str] = field(default_factory=list)
    resources: dict[str, tuple[float, float]] = field(default_factory=dict)  # name: (after warm-up, at end)
    ready_after_s: float | None = None  # from the last fault's end to ready with every instance healthy

    def by_cause(self) -> Counter[str]:
        return Counter(o.cause for o in self.outcomes)

    def table(self) -> list[str]:
        causes = self.by_cause()
        lanes = Counter(o.lane for o in self.outcomes)
        slowest = max((o.seconds for o in self.outcomes if o.cause == "ok"), default=0.0)
        lines = [
            f"| seed | {self.seed} |",
            f"| traffic | {self.duration_s:.0f} s, 16 clients (HTTP, gRPC unary, gRPC streaming) |",
            "| faults injected | " + ", ".join(f"{k} {self.faults[k]}" for k in KINDS) + " |",
            f"| requests answered | {len(self.outcomes)} ("
            + ", ".join(f"{k} {v}" for k, v in sorted(lanes.items()))
            + ") |",
            f"| correct 2xx | {causes['ok']} (slowest {slowest:.2f} s) |",
            f"| poison refused (500, the model's message) | {causes['poison']} |",
            f"| queue bound (503) | {causes['queue_full']} |",
            f"| wrong answers | {causes['wrong']} |",
            f"| other failures | {causes['failed']} |",
            f"| clients that disconnected mid-request | {self.disconnects} |",
        ]
        for name, (before, after) in self.resources.items():
            lines.append(f"| {name} after warm-up / at end | {before:g} / {after:g} |")
        if self.ready_after_s is not None:
            lines.append(f"| ready, every instance healthy, after the faults | {self.ready_after_s:.1f} s |")
        lines.append(f"| invariants | {'all held' if not self.violations else '; '.join(self.violations[:5])} |")
        return lines


def _classify(
    model: str, x: np.ndarray, status: int, body: str, output: np.ndarray | None, reference: Reference
) -> str:
    poisoned = bool((x <= POISON).any())
    if 200 <= status < 300 and output is not None:
        if poisoned:
            return "wrong"
        return "ok" if np.allclose(output, reference.expected(model, x), rtol=1e-5) else "wrong"
    if poisoned and status == 500 and "failed to execute the request: chaos_py refuses" in body:
        return "poison"
    if status == 503 and "queue is full" in body:
        return "queue_full"
    return "failed"


class Chaos:
    """One run: ``await Chaos(...).run()`` returns its report."""

    def __init__(
        self,
        root: Path,
        http_url: str,
        grpc_address: str,
        metrics_url: str,
        server_pid: int,
        seed: int,
        duration_s: float,
        per_kind: int = 1,
    ) -> None:
        self.repo, self.control = root / "models", root / "control"
        self.http_url = http_url
        self.grpc_address = grpc_address
        self.metrics_url = metrics_url
        self.server = psutil.Process(server_pid)
        self.rng = random.Random(seed)
        self.report = Report(seed, duration_s)
        self.duration_s = duration_s
        self.per_kind = per_kind
        self.reference = Reference(self.repo)
        self._stop = asyncio.Event()
        self._version = 1  # chaos_py's newest version

    # -- traffic -------------------------------------------------------------------------------

    def _request(self, rng: random.Random) -> tuple[str, np.ndarray]:
        model = rng.choices(["chaos_onnx", "chaos_py", "chaos_pipe"], [4, 4, 2])[0]
        x = np.array([[rng.uniform(0, 10) for _ in range(WIDTH)] for _ in range(rng.randint(1, 2))], np.float32)
        return model, x

    async def _http_once(self, client: httpx.AsyncClient, lane: str, model: str, x: np.ndarray) -> None:
        body = {"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}
        started = time.monotonic()
        try:
            response = await client.post(f"{self.http_url}/v2/models/{model}/infer", json=body)
        except httpx.HTTPError as exc:
            self._record(Outcome(lane, model, "failed", repr(exc), time.monotonic() - started))
            return
        output = None
        if response.status_code == 200:
            data = response.json()["outputs"][0]
            output = np.asarray(data["data"], np.float32).reshape(data["shape"])
        cause = _classify(model, x, response.status_code, response.text, output, self.reference)
        self._record(Outcome(lane, model, cause, response.text[:200], time.monotonic() - started))

    async def _http_client(self, index: int) -> None:
        rng = random.Random(self.rng.random())
        async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S) as client:
            while not self._stop.is_set():
                await self._http_once(client, "http", *self._request(rng))

    async def _grpc_client(self, index: int) -> None:
        import tritonclient.grpc.aio as grpcclient
        from tritonclient.utils import InferenceServerException

        rng = random.Random(self.rng.random())
        client = grpcclient.InferenceServerClient(self.grpc_address)
        try:
            while not self._stop.is_set():
                model, x = self._request(rng)
                tensor = grpcclient.InferInput("INPUT", list(x.shape), "FP32")
                tensor.set_data_from_numpy(x)
                started = time.monotonic()
                try:
                    result = await client.infer(model, [tensor], client_timeout=CLIENT_TIMEOUT_S)
                except InferenceServerException as exc:
                    status = {"StatusCode.INTERNAL": 500, "StatusCode.UNAVAILABLE": 503}.get(str(exc.status()), 0)
                    cause = _classify(model, x, status, exc.message() or "", None, self.reference)
                    self._record(
                        Outcome(
                            "grpc", model, cause, f"{exc.status()} {exc.message()}"[:200], time.monotonic() - started
                        )
                    )
                    continue
                cause = _classify(model, x, 200, "", result.as_numpy("OUTPUT"), self.reference)
                self._record(Outcome("grpc", model, cause, "", time.monotonic() - started))
        finally:
            await client.close()

    async def _stream_client(self, index: int) -> None:
        """One bidirectional stream, one request in flight at a time: every id must come back once."""
        import tritonclient.grpc.aio as grpcclient

        rng = random.Random(self.rng.random())
        client = grpcclient.InferenceServerClient(self.grpc_address)
        sent: dict[str, tuple[str, np.ndarray, float]] = {}
        turn = asyncio.Event()
        turn.set()

        async def requests() -> AsyncIterator[dict[str, Any]]:
            number = 0
            while not self._stop.is_set():
                await turn.wait()
                turn.clear()
                if self._stop.is_set():
                    return
                model, x = self._request(rng)
                tensor = grpcclient.InferInput("INPUT", list(x.shape), "FP32")
                tensor.set_data_from_numpy(x)
                request_id = f"{index}-{number}"
                number += 1
                sent[request_id] = (model, x, time.monotonic())
                yield {"model_name": model, "inputs": [tensor], "request_id": request_id}

        try:
            responses = client.stream_infer(requests(), stream_timeout=self.duration_s + 120)
            async for result, error in responses:
                if error is not None:  # an error carries no id: it answers the one request in flight
                    if len(sent) != 1:
                        self.report.violations.append(f"stream {index}: an error with {len(sent)} requests in flight")
                        break
                    model, x, started = sent.popitem()[1]
                    message = error.message() or ""
                    status = 503 if "queue is full" in message else 500
                    cause = _classify(model, x, status, message, None, self.reference)
                    self._record(Outcome("stream", model, cause, message[:200], time.monotonic() - started))
                    turn.set()
                    continue
                request_id = result.get_response().id
                if request_id not in sent:
                    self.report.violations.append(f"stream {index}: an answer to {request_id!r}, not in flight")
                    break
                model, x, started = sent.pop(request_id)
                cause = _classify(model, x, 200, "", result.as_numpy("OUTPUT"), self.reference)
                self._record(Outcome("stream", model, cause, "", time.monotonic() - started))
                turn.set()
                if self._stop.is_set():
                    break
        except Exception as exc:
            self.report.violations.append(f"stream {index} broke: {exc!r}"[:300])
        finally:
            turn.set()
            await client.close()

    def _record(self, outcome: Outcome) -> None:
        self.report.outcomes.append(outcome)

    # -- faults --------------------------------------------------------------------------------

    def _schedule(self) -> list[tuple[float, str]]:
        """Each kind ``per_kind`` times, at random times inside the run (not in its first or last
        few seconds: warm-up, and time for the last fault to show)."""
        start, end = min(5.0, self.duration_s / 6), self.duration_s * 0.8
        events = [(self.rng.uniform(start, end), kind) for kind in KINDS for _ in range(self.per_kind)]
        return sorted(events)

    async def _driver(self) -> None:
        began = time.monotonic()
        tasks: set[asyncio.Task[None]] = set()
        for at, kind in self._schedule():
            await asyncio.sleep(max(0.0, began + at - time.monotonic()))
            self.report.faults[kind] += 1
            task = asyncio.create_task(getattr(self, f"_inject_{kind}")())
            tasks.add(task)
        await asyncio.gather(*tasks)

    def _workers(self) -> list[psutil.Process]:
        return [c for c in self.server.children() if c.is_running()]

    async def _inject_kill9(self) -> None:
        workers = self._workers()
        if workers:
            with contextlib.suppress(psutil.NoSuchProcess):
                os.kill(self.rng.choice(workers).pid, signal.SIGKILL)

    async def _switch(self, name: str, hold_s: float) -> None:
        switch = self.control / name
        switch.touch()
        await asyncio.sleep(hold_s)
        switch.unlink(missing_ok=True)

    async def _inject_hang(self) -> None:
        await self._switch(f"hang-{self.rng.randrange(3)}", 5.0)

    async def _inject_slow(self) -> None:
        await self._switch(f"slow-{self.rng.randrange(3)}", 5.0)

    async def _inject_poison(self) -> None:
        """Three requests the model refuses, sent among the others (over HTTP and gRPC at once)."""
        import tritonclient.grpc.aio as grpcclient
        from tritonclient.utils import InferenceServerException

        x = np.full((1, WIDTH), POISON, np.float32)
        async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S) as client:
            await asyncio.gather(*(self._http_once(client, "poison", "chaos_py", x) for _ in range(2)))
        grpc_client = grpcclient.InferenceServerClient(self.grpc_address)
        tensor = grpcclient.InferInput("INPUT", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        try:
            await grpc_client.infer("chaos_py", [tensor], client_timeout=CLIENT_TIMEOUT_S)
            self._record(Outcome("poison", "chaos_py", "wrong", "a poison request was answered"))
        except InferenceServerException as exc:
            status = 500 if str(exc.status()) == "StatusCode.INTERNAL" else 0
            cause = _classify("chaos_py", x, status, exc.message() or "", None, self.reference)
            self._record(Outcome("poison", "chaos_py", cause, str(exc)[:200]))
        finally:
            await grpc_client.close()

    async def _inject_disconnect(self) -> None:
        """One client sends half a body and hangs up; another sends a whole request and hangs up
        before the answer."""
        host, port = self.http_url.removeprefix("http://").rsplit(":", 1)
        x = np.ones((1, WIDTH), np.float32)
        body = json.dumps(
            {"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, WIDTH], "data": x.ravel().tolist()}]}
        ).encode()
        head = (
            f"POST /v2/models/chaos_py/infer HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        for cut in (len(body) // 2, len(body)):
            with socket.create_connection((host, int(port)), timeout=5) as sock:
                sock.sendall(head + body[:cut])
            self.report.disconnects += 1

    async def _inject_hot_swap(self) -> None:
        self._version += 1
        source = self.repo / "chaos_py" / "1" / "model.py"
        staging = self.repo.parent / f"staging-{self._version}"
        staging.mkdir()
        shutil.copy(source, staging / "model.py")
        staging.rename(self.repo / "chaos_py" / str(self._version))  # appears whole to the poller

    async def _inject_burst(self) -> None:
        """Three times the queue bound at once: the ones past it get 503, at once."""
        limits = httpx.Limits(max_connections=QUEUE_BOUND * 3)
        async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S, limits=limits) as client:
            x = np.ones((1, WIDTH), np.float32)
            await asyncio.gather(*(self._http_once(client, "burst", "chaos_py", x) for _ in range(QUEUE_BOUND * 3)))

    # -- the run -------------------------------------------------------------------------------

    def _resources(self) -> dict[str, float]:
        memory = self.server.memory_info().rss / 2**20
        return {"server RSS (MiB)": round(memory, 1), "server open files": float(self.server.num_fds())}

    async def _instances_healthy(self) -> list[tuple[dict[str, str], float]]:
        """``tensorgate_instance_healthy`` of every instance of the versions now served (an unloaded
        version's instances keep their last value)."""
        from prometheus_client.parser import text_string_to_metric_families

        async with httpx.AsyncClient(timeout=5) as client:
            text = (await client.get(self.metrics_url)).text
        samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
        return [
            (s.labels, s.value)
            for s in samples
            if s.name == "tensorgate_instance_healthy"
            and (s.labels["model"] != "chaos_py" or s.labels["version"] == str(self._version))
        ]

    async def _recovered(self, timeout_s: float) -> float | None:
        """Seconds until the server is ready and every instance healthy; None if never."""
        began = time.monotonic()
        async with httpx.AsyncClient(timeout=5) as client:
            while time.monotonic() - began < timeout_s:
                ready = (await client.get(f"{self.http_url}/v2/health/ready")).status_code == 200
                healthy = await self._instances_healthy()
                if ready and len(healthy) == 5 and all(v == 1.0 for _, v in healthy) and len(self._workers()) == 3:
                    return time.monotonic() - began
                await asyncio.sleep(0.25)
        self.report.violations.append(f"at the end: ready {ready}, instances {healthy}, workers {len(self._workers())}")
        return None

    async def run(self) -> Report:
        clients = [
            *(asyncio.create_task(self._http_client(i)) for i in range(6)),
            *(asyncio.create_task(self._grpc_client(i)) for i in range(6)),
            *(asyncio.create_task(self._stream_client(i)) for i in range(4)),
        ]
        warm_s = min(5.0, self.duration_s / 6)
        await asyncio.sleep(warm_s * 0.8)
        before = self._resources()
        driver = asyncio.create_task(self._driver())
        await asyncio.sleep(self.duration_s - warm_s * 0.8)
        await driver
        self._stop.set()
        await asyncio.gather(*clients)
        self.report.ready_after_s = await self._recovered(90.0)
        after = self._resources()
        self.report.resources = {name: (before[name], after[name]) for name in before}
        self._check()
        return self.report

    def _check(self) -> None:
        report = self.report
        causes = report.by_cause()
        for outcome in report.outcomes:
            if outcome.cause in ("wrong", "failed"):
                report.violations.append(f"{outcome.lane} {outcome.model}: {outcome.cause}: {outcome.detail}"[:300])
        poison_sent = sum(1 for o in report.outcomes if o.lane == "poison")
        if causes["poison"] != poison_sent:
            report.violations.append(
                f"{poison_sent} poison requests, {causes['poison']} refused with the model's message"
            )
        queue_full_outside_bursts = sum(1 for o in report.outcomes if o.cause == "queue_full" and o.lane != "burst")
        if report.faults["burst"] == 0 and queue_full_outside_bursts:
            report.violations.append(f"{queue_full_outside_bursts} queue-full answers with no burst")
        if report.ready_after_s is None:
            report.violations.append("the server did not end ready with every instance healthy")
        rss_before, rss_after = report.resources["server RSS (MiB)"]
        if rss_after - rss_before > max(64.0, 0.25 * rss_before):
            report.violations.append(f"server memory grew from {rss_before} MiB to {rss_after} MiB")
        fds_before, fds_after = report.resources["server open files"]
        if fds_after - fds_before > 16:
            report.violations.append(f"server open files grew from {fds_before:g} to {fds_after:g}")
