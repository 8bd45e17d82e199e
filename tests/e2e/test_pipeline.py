"""``backend: pipeline`` end to end over HTTP and gRPC: steps run in order through their own
schedulers (batching visible in each step's statistics, and across two pipelines that share a
step), a failing step is named in the error with its own status, a conditional step is taken or
skipped, the deadline covers the whole pipeline, and pipelines whose steps reach themselves or a
missing model fail to load instead of recursing."""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import yaml
from model_builders import metric, wait_until, write_python_model
from tritonclient.utils import InferenceServerException

from tensorgate.testing import ServerProcess

NEGATE = """
from tensorgate import PythonModel


class Negate(PythonModel):
    def execute(self, inputs):
        return {"OUTPUT": -inputs["INPUT"]}
"""
# Adds 1; while the file ``hold`` exists each batch waits for it to go (up to 30 s), and the file
# ``running`` exists while a batch runs: a test holds the model busy while requests queue behind it.
GATE = """
import time
from pathlib import Path

from tensorgate import PythonModel


class Gate(PythonModel):
    def load(self, context):
        self.hold = Path(context.parameters["hold"])
        self.running = Path(context.parameters["running"])

    def execute(self, inputs):
        self.running.touch()
        try:
            deadline = time.monotonic() + 30.0
            while self.hold.exists() and time.monotonic() < deadline:
                time.sleep(0.005)
            return {"OUTPUT": inputs["INPUT"] + 1.0}
        finally:
            self.running.unlink()
"""
X = {"name": "INPUT", "datatype": "FP32", "shape": [-1, 4]}


def _pipeline(repo: Path, name: str, steps: list[dict[str, Any]], inputs: list[Any], outputs: list[Any]) -> None:
    (repo / name / "1").mkdir(parents=True)
    config = {"backend": "pipeline", "inputs": inputs, "outputs": outputs, "steps": steps}
    (repo / name / "config.yaml").write_text(yaml.safe_dump(config))


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the gated model looks for its ``hold`` file and keeps its ``running`` marker."""
    return tmp_path_factory.mktemp("gate")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, gate: Path) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("pipeline-repo")
    batching = {"max_queue_delay_ms": 50}
    off = {"enabled": False}
    write_python_model(repo, "add", parameters={"delay_ms": 30}, dynamic_batching=batching, health_check=off)
    write_python_model(repo, "negate", code=NEGATE, health_check=off)
    write_python_model(repo, "slow", parameters={"delay_ms": 300}, health_check=off)
    write_python_model(repo, "narrow", width=3, health_check=off)
    gated = {"hold": str(gate / "hold"), "running": str(gate / "running")}
    write_python_model(repo, "gated", code=GATE, parameters=gated, dynamic_batching=batching, health_check=off)
    out = {"datatype": "FP32", "shape": [-1, 4]}
    for name in ("left", "right"):  # two pipelines whose one step is the same model
        step = {"model": "gated", "inputs": {"INPUT": "INPUT"}, "outputs": {"OUTPUT": name}}
        _pipeline(repo, name, [step], [X], [{"name": name, **out}])
    _pipeline(
        repo,
        "mismatch",  # its step takes 3 values a row, and it hands the step 4
        [{"model": "narrow", "inputs": {"INPUT": "INPUT"}, "outputs": {"OUTPUT": "narrowed"}}],
        [X],
        [{"name": "narrowed", "datatype": "FP32", "shape": [-1, 3]}],
    )
    _pipeline(
        repo,
        "twice",
        [
            {"model": "add", "inputs": {"INPUT": "INPUT"}, "outputs": {"OUTPUT": "once"}},
            {"model": "add", "inputs": {"INPUT": "once"}, "outputs": {"OUTPUT": "twice"}},
        ],
        [X],
        [{"name": "twice", **out}, {"name": "once", **out}],
    )
    _pipeline(
        repo,
        "route",
        [
            {
                "model": "add",
                "inputs": {"INPUT": "INPUT"},
                "outputs": {"OUTPUT": "result"},
                "when": {"input": "MODE", "equals": "plus"},
            },
            {
                "model": "negate",
                "inputs": {"INPUT": "INPUT"},
                "outputs": {"OUTPUT": "result"},
                "when": {"input": "MODE", "equals": "minus"},
            },
        ],
        [X, {"name": "MODE", "datatype": "BYTES", "shape": [-1, 1]}],
        [{"name": "result", **out}],
    )
    _pipeline(
        repo,
        "slow_twice",
        [
            {"model": "slow", "inputs": {"INPUT": "INPUT"}, "outputs": {"OUTPUT": "a"}},
            {"model": "slow", "inputs": {"INPUT": "a"}, "outputs": {"OUTPUT": "b"}},
        ],
        [X],
        [{"name": "b", **out}],
    )
    with ServerProcess("--model-repository", str(repo), "--log-level", "warning") as server:
        yield server


def _body(values: list[list[float]], **extra: Any) -> dict[str, Any]:
    tensor = {"name": "INPUT", "datatype": "FP32", "shape": [len(values), 4], "data": values}
    return {"inputs": [tensor, *extra.pop("inputs", [])], **extra}


def _outputs(answer: httpx.Response) -> dict[str, list[float]]:
    assert answer.status_code == 200, answer.text
    return {o["name"]: o["data"] for o in answer.json()["outputs"]}


def test_steps_run_in_order_and_metadata_is_the_pipelines(server: ServerProcess) -> None:
    answer = httpx.post(f"{server.url}/v2/models/twice/infer", json=_body([[1, 2, 3, 4]]))
    assert _outputs(answer) == {"twice": [3, 4, 5, 6], "once": [2, 3, 4, 5]}
    only = httpx.post(f"{server.url}/v2/models/twice/infer", json=_body([[1, 2, 3, 4]], outputs=[{"name": "twice"}]))
    assert _outputs(only) == {"twice": [3, 4, 5, 6]}
    meta = httpx.get(f"{server.url}/v2/models/twice").json()
    assert meta["platform"] == "ensemble"
    assert [t["name"] for t in meta["inputs"]] == ["INPUT"]
    assert sorted(t["name"] for t in meta["outputs"]) == ["once", "twice"]


def test_over_grpc_and_batched_in_the_steps(server: ServerProcess) -> None:
    before = httpx.get(f"{server.url}/v2/models/add/stats").json()["model_stats"][0]
    rows = np.arange(32, dtype=np.float32).reshape(8, 1, 4)

    def infer(x: np.ndarray) -> np.ndarray:
        with grpcclient.InferenceServerClient(server.grpc_address) as client:
            request = grpcclient.InferInput("INPUT", [1, 4], "FP32")
            request.set_data_from_numpy(x)
            return np.asarray(client.infer("twice", [request]).as_numpy("twice"))

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(infer, rows))
    for x, answer in zip(rows, answers, strict=True):
        np.testing.assert_array_equal(answer, x + 2)
    after = httpx.get(f"{server.url}/v2/models/add/stats").json()["model_stats"][0]
    assert after["inference_count"] - before["inference_count"] == 16  # two steps per request
    assert after["execution_count"] - before["execution_count"] < 16  # requests shared the step's batches
    mine = httpx.get(f"{server.url}/v2/models/twice/stats").json()["model_stats"][0]
    assert mine["inference_stats"]["success"]["count"] >= 8


def test_a_conditional_step_is_taken_or_skipped(server: ServerProcess) -> None:
    def route(mode: str) -> httpx.Response:
        selector = {"name": "MODE", "datatype": "BYTES", "shape": [1, 1], "data": [mode]}
        return httpx.post(f"{server.url}/v2/models/route/infer", json=_body([[1, -2, 3, 0]], inputs=[selector]))

    assert _outputs(route("plus")) == {"result": [2, -1, 4, 1]}
    assert _outputs(route("minus")) == {"result": [-1, 2, -3, 0]}
    assert _outputs(route("neither")) == {}  # both skipped: the output is absent, not an error


def test_two_pipelines_sharing_a_step_batch_together(server: ServerProcess, gate: Path) -> None:
    """The shared model is held busy while one request of each pipeline queues for it: once free,
    it runs both in one batch (each step is scheduled by the step model's own scheduler)."""

    def stats() -> dict[str, Any]:
        found: dict[str, Any] = httpx.get(f"{server.url}/v2/models/gated/stats").json()["model_stats"][0]
        return found

    def pairs(found: dict[str, Any]) -> int:
        return sum(b["compute_infer"]["count"] for b in found["batch_stats"] if b["batch_size"] == 2)

    def post(model: str, value: float) -> httpx.Response:
        return httpx.post(f"{server.url}/v2/models/{model}/infer", json=_body([[value] * 4]), timeout=60)

    before = stats()
    (gate / "hold").touch()
    try:
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            blocker = pool.submit(post, "gated", 0.0)
            wait_until(lambda: (gate / "running").exists() or blocker.done())
            assert not blocker.done(), blocker.result().text
            left, right = pool.submit(post, "left", 1.0), pool.submit(post, "right", 2.0)
            wait_until(lambda: metric(server.metrics_url, "tensorgate_queue_depth", model="gated") == 2)
            (gate / "hold").unlink()
            answers = [blocker.result(), left.result(), right.result()]
    finally:
        (gate / "hold").unlink(missing_ok=True)
    assert _outputs(answers[0]) == {"OUTPUT": [1, 1, 1, 1]}
    assert _outputs(answers[1]) == {"left": [2, 2, 2, 2]}
    assert _outputs(answers[2]) == {"right": [3, 3, 3, 3]}
    after = stats()
    assert after["inference_count"] - before["inference_count"] == 3
    assert after["execution_count"] - before["execution_count"] == 2  # the blocker, then both pipelines' steps
    assert pairs(after) - pairs(before) == 1


@pytest.mark.parametrize(
    ("pipeline", "step", "body", "http_status", "grpc_status"),
    [
        ("twice", "add", [[-1e7, 0, 0, 0]], 500, "StatusCode.INTERNAL"),  # the step's model raised
        ("mismatch", "narrow", [[1, 2, 3, 4]], 400, "StatusCode.INVALID_ARGUMENT"),  # the step refused its input
    ],
)
def test_a_failing_step_is_named_with_its_own_status(
    server: ServerProcess, pipeline: str, step: str, body: list[list[float]], http_status: int, grpc_status: str
) -> None:
    label = f"pipeline '{pipeline}' step 1 ('{step}')"
    alone = httpx.post(f"{server.url}/v2/models/{step}/infer", json=_body(body))
    assert alone.status_code == http_status, alone.text  # what the step model answers by itself
    answer = httpx.post(f"{server.url}/v2/models/{pipeline}/infer", json=_body(body))
    assert answer.status_code == http_status, answer.text
    assert answer.json()["error"].startswith(label + ": "), answer.text
    with grpcclient.InferenceServerClient(server.grpc_address) as client:
        request = grpcclient.InferInput("INPUT", [1, 4], "FP32")
        request.set_data_from_numpy(np.asarray(body, dtype=np.float32))
        with pytest.raises(InferenceServerException) as caught:
            client.infer(pipeline, [request])
    assert caught.value.status() == grpc_status
    assert label in str(caught.value.message())
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200


def test_the_pipelines_own_inputs_are_checked_before_any_step(server: ServerProcess) -> None:
    wrong = httpx.post(
        f"{server.url}/v2/models/twice/infer",
        json={"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]},
    )
    assert wrong.status_code == 400  # checked against the pipeline's own inputs, before any step
    assert "step" not in wrong.json()["error"], wrong.text
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200


def test_the_deadline_covers_the_whole_pipeline(server: ServerProcess) -> None:
    """Two 300 ms steps under a 450 ms timeout: each would fit alone, the pipeline does not."""
    answer = httpx.post(
        f"{server.url}/v2/models/slow_twice/infer", json=_body([[1, 2, 3, 4]], parameters={"timeout": 450_000})
    )
    assert answer.status_code == 504, answer.text
    assert "pipeline 'slow_twice' step" in answer.json()["error"]
    fits = httpx.post(
        f"{server.url}/v2/models/slow_twice/infer", json=_body([[1, 2, 3, 4]], parameters={"timeout": 5_000_000})
    )
    assert _outputs(fits) == {"b": [3, 4, 5, 6]}


def test_the_bundled_image_pipeline_classifies_a_raw_uint8_image(
    example_server: ServerProcess, example_repo: Path
) -> None:
    """preprocess (Python) -> cnn (ONNX) -> topk (Python), against the same three run by hand."""
    import onnxruntime as ort

    image = np.random.default_rng(3).integers(0, 256, (1, 32, 32, 3), dtype=np.uint8)
    mean = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1)
    std = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1)
    pixels = ((image.astype(np.float32).transpose(0, 3, 1, 2) / 255.0 - mean) / std).astype(np.float32)
    session = ort.InferenceSession(str(example_repo / "cnn" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    probabilities = session.run(None, {"image": pixels})[0]
    classes = np.argsort(-probabilities, axis=1, kind="stable")[:, :3]
    with grpcclient.InferenceServerClient(example_server.grpc_address) as client:
        request = grpcclient.InferInput("image", [1, 32, 32, 3], "UINT8")
        request.set_data_from_numpy(image)
        result = client.infer("classify", [request])
    np.testing.assert_array_equal(result.as_numpy("classes"), classes)
    np.testing.assert_allclose(result.as_numpy("scores"), np.take_along_axis(probabilities, classes, 1), rtol=1e-5)


@pytest.fixture(scope="module")
def broken_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Pipelines that reach themselves or a missing model, beside one that is sound (the server
    never turns ready: its models that fail to load count against it)."""
    repo = tmp_path_factory.mktemp("broken-pipelines")
    write_python_model(repo, "add", health_check={"enabled": False})
    out = [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}]

    def one_step(name: str, model: str) -> None:
        _pipeline(repo, name, [{"model": model, "inputs": {"INPUT": "INPUT"}, "outputs": {"OUTPUT": "y"}}], [X], out)

    one_step("sound", "add")
    one_step("itself", "itself")
    one_step("ping", "pong")
    one_step("pong", "ping")
    one_step("dangling", "nowhere")
    with ServerProcess("--model-repository", str(repo), "--log-level", "info", wait_ready=False) as server:
        server.wait_loaded()
        yield server


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("itself", "pipeline 'itself' step 1 names model 'itself', which closes a cycle (itself -> itself)"),
        ("ping", "pipeline 'pong' step 1 names model 'ping', which closes a cycle (ping -> pong -> ping)"),
        ("pong", "pipeline 'ping' step 1 names model 'pong', which closes a cycle (pong -> ping -> pong)"),
        ("dangling", "pipeline 'dangling' step 1 names model 'nowhere', which is not in the model repository"),
    ],
)
def test_a_pipeline_that_reaches_itself_or_a_missing_model_fails_to_load(
    broken_server: ServerProcess, model: str, reason: str
) -> None:
    [status] = httpx.get(f"{broken_server.url}/v1/models/{model}").json()["model_version_status"]
    assert status["state"] == "END" and reason in status["status"]["error_message"], status
    answer = httpx.post(f"{broken_server.url}/v2/models/{model}/infer", json=_body([[1, 2, 3, 4]]))
    assert answer.status_code == 503 and reason in answer.json()["error"], answer.text  # never a recursion
    sound = httpx.post(f"{broken_server.url}/v2/models/sound/infer", json=_body([[1, 2, 3, 4]]))
    assert _outputs(sound) == {"y": [2, 3, 4, 5]}
    assert httpx.get(f"{broken_server.url}/v2/health/live").status_code == 200


def test_the_docs_tritonclient_example_calls_classify_as_written(
    example_server: ServerProcess, example_repo: Path, tmp_path: Path
) -> None:
    """docs/model-repository.md's tritonclient call of the bundled pipeline, with only the address changed."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "model-repository.md").read_text(encoding="utf-8")
    section = page[page.index("### Calling the bundled `classify` pipeline") :]
    example = section[section.index("```python\n") + len("```python\n") : section.index("```\n", 10)]
    script = tmp_path / "classify.py"
    script.write_text(example.replace("localhost:8080", example_server.http_address))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    printed = result.stdout.replace("[", " ").replace("]", " ").split()
    classes, scores = [int(v) for v in printed[:3]], [float(v) for v in printed[3:]]
    assert len(scores) == 3 and all(0 <= c < 10 for c in classes) and len(set(classes)) == 3
    assert scores == sorted(scores, reverse=True) and 0.0 < sum(scores) <= 1.0 + 1e-6
