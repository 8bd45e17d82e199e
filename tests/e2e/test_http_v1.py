"""V1 predict against a real server: ``instances`` rows and ``inputs`` columns, model status."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tensorgate.examples import build_example_repository
from tensorgate.testing import ServerProcess


def _write(root: Path, name: str, nodes: list[Any], inputs: list[Any], outputs: list[Any]) -> None:
    graph = helper.make_graph(nodes, name, inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.onnx").write_bytes(model.SerializeToString())


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = build_example_repository(tmp_path_factory.mktemp("v1-repo"))
    _write(
        root,
        "add",
        [helper.make_node("Add", ["a", "b"], ["sum"]), helper.make_node("Sub", ["a", "b"], ["diff"])],
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", 2]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", 2]),
        ],
        [
            helper.make_tensor_value_info("sum", TensorProto.FLOAT, ["batch", 2]),
            helper.make_tensor_value_info("diff", TensorProto.FLOAT, ["batch", 2]),
        ],
    )
    _write(
        root,
        "strings",
        [helper.make_node("Identity", ["text"], ["echo"])],
        [helper.make_tensor_value_info("text", TensorProto.STRING, ["batch"])],
        [helper.make_tensor_value_info("echo", TensorProto.STRING, ["batch"])],
    )
    return root


@pytest.fixture(scope="module")
def client(repo: Path) -> Iterator[httpx.Client]:
    with (
        ServerProcess("--model-repository", str(repo), "--log-level", "warning") as server,
        httpx.Client(base_url=server.url, timeout=10.0) as c,
    ):
        yield c


def _mlp(repo: Path, features: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(repo / "mlp" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"features": features})[0])


@pytest.mark.parametrize("path", ["/v1/models/mlp:predict", "/v1/models/mlp/versions/1:predict"])
def test_instances_give_predictions(client: httpx.Client, repo: Path, path: str) -> None:
    features = np.random.default_rng(5).standard_normal((3, 16)).astype(np.float32)
    response = client.post(path, json={"instances": features.tolist()})
    assert response.status_code == 200, response.text
    document = response.json()
    assert set(document) == {"predictions"}
    np.testing.assert_allclose(document["predictions"], _mlp(repo, features), rtol=1e-5, atol=1e-6)


def test_single_tensor_inputs_give_outputs(client: httpx.Client, repo: Path) -> None:
    features = np.random.default_rng(6).standard_normal((2, 16)).astype(np.float32)
    document = client.post("/v1/models/mlp:predict", json={"inputs": features.tolist()}).json()
    assert set(document) == {"outputs"}
    np.testing.assert_allclose(document["outputs"], _mlp(repo, features), rtol=1e-5, atol=1e-6)


def test_named_inputs_give_named_outputs(client: httpx.Client) -> None:
    body = {"inputs": {"a": [[1.0, 2.0], [3.0, 4.0]], "b": [[0.5, 0.5], [1.0, 1.0]]}}
    document = client.post("/v1/models/add:predict", json=body).json()
    assert document == {"outputs": {"sum": [[1.5, 2.5], [4.0, 5.0]], "diff": [[0.5, 1.5], [2.0, 3.0]]}}


def test_instances_of_named_inputs(client: httpx.Client) -> None:
    body = {"instances": [{"a": [1.0, 2.0], "b": [1.0, 1.0]}, {"a": [0.0, 0.0], "b": [2.0, 3.0]}]}
    document = client.post("/v1/models/add:predict", json=body).json()
    assert document == {
        "predictions": [{"sum": [2.0, 3.0], "diff": [0.0, 1.0]}, {"sum": [2.0, 3.0], "diff": [-2.0, -3.0]}]
    }


def test_missing_named_input_is_400(client: httpx.Client) -> None:
    response = client.post("/v1/models/add:predict", json={"inputs": {"a": [[1.0, 2.0]]}})
    assert response.status_code == 400
    assert "missing required inputs ['b']" in response.json()["error"]


def test_bytes_instances_and_b64(client: httpx.Client) -> None:
    encoded = base64.b64encode(b"\x00binary").decode()
    document = client.post("/v1/models/strings:predict", json={"instances": ["hello", {"b64": encoded}]}).json()
    assert document["predictions"][0] == "hello"
    assert len(document["predictions"]) == 2


def test_model_status(client: httpx.Client) -> None:
    for path in ("/v1/models/mlp", "/v1/models/mlp/versions/1"):
        response = client.get(path)
        assert response.status_code == 200
        assert response.json() == {
            "name": "mlp",
            "ready": True,  # KServe V1's field (its SDK's is_model_ready), beside TF Serving's states
            "model_version_status": [
                {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
            ],
        }
    assert client.get("/v1/models/mlp/versions/9").status_code == 404
    assert client.get("/v1/models/nope").status_code == 404


def test_curl_style_form_content_type(client: httpx.Client) -> None:
    """``curl -d`` sends application/x-www-form-urlencoded; the README's V1 example works as written."""
    response = client.post(
        "/v1/models/mlp:predict",
        content=b'{"instances": [[' + b", ".join([b"0.1"] * 16) + b"]]}",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert response.status_code == 200, response.text
    assert len(response.json()["predictions"][0]) == 3
