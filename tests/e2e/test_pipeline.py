"""``backend: pipeline`` end to end over HTTP and gRPC: steps run in order through their own
schedulers (batching visible in each step's statistics), a failing step is named in the error, a
conditional step is taken or skipped, and the deadline covers the whole pipeline."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import yaml
from model_builders import write_python_model

from tensorgate.testing import ServerProcess

NEGATE = """
from tensorgate import PythonModel


class Negate(PythonModel):
    def execute(self, inputs):
        return {"OUTPUT": -inputs["INPUT"]}
"""
X = {"name": "INPUT", "datatype": "FP32", "shape": [-1, 4]}


def _pipeline(repo: Path, name: str, steps: list[dict[str, Any]], inputs: list[Any], outputs: list[Any]) -> None:
    (repo / name / "1").mkdir(parents=True)
    config = {"backend": "pipeline", "inputs": inputs, "outputs": outputs, "steps": steps}
    (repo / name / "config.yaml").write_text(yaml.safe_dump(config))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("pipeline-repo")
    batching = {"max_queue_delay_ms": 50}
    off = {"enabled": False}
    write_python_model(repo, "add", parameters={"delay_ms": 30}, dynamic_batching=batching, health_check=off)
    write_python_model(repo, "negate", code=NEGATE, health_check=off)
    write_python_model(repo, "slow", parameters={"delay_ms": 300}, health_check=off)
    out = {"datatype": "FP32", "shape": [-1, 4]}
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


def test_a_failing_step_is_named(server: ServerProcess) -> None:
    answer = httpx.post(f"{server.url}/v2/models/twice/infer", json=_body([[-1e7, 0, 0, 0]]))
    assert answer.status_code >= 400
    assert "pipeline 'twice' step 1 ('add')" in answer.json()["error"]
    wrong = httpx.post(
        f"{server.url}/v2/models/twice/infer",
        json={"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]},
    )
    assert wrong.status_code == 400  # checked against the pipeline's own inputs, before any step
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
