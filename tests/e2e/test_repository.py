"""The model repository served for real: several models and versions, version policies, specs read
from or checked against the ONNX model, and models that fail alone (bad config, missing provider,
symlink escapes) while the server stays live.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tensorgate.testing import ServerProcess

LEAK = re.compile(r"Traceback|File \"|\.py\b|/tmp/|/root|0x[0-9a-f]{8,}")


def scale_model(factor: float) -> bytes:
    """y = x * factor, x FP32 [-1, 2]: each version answers differently."""
    k = numpy_helper.from_array(np.array([factor], dtype=np.float32), "k")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "k"], ["y"])],
        "scale",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        [k],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _versions(root: Path, name: str, versions: list[int], config: str | None = None) -> Path:
    for v in versions:
        (root / name / str(v)).mkdir(parents=True)
        (root / name / str(v) / "model.onnx").write_bytes(scale_model(float(v)))
    if config is not None:
        (root / name / "config.yaml").write_text(config)
    return root / name


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("repository")
    root, outside = base / "models", base / "outside"
    root.mkdir()
    _versions(root, "all_v", [1, 2, 3], "version_policy: {all: true}\n")
    _versions(root, "latest2", [1, 2, 3], "version_policy: {latest: 2}\n")
    _versions(root, "specific", [1, 2, 3], "version_policy: {specific: [1, 3]}\n")
    default = _versions(root, "default", [1, 2, 10])
    for ignored in ("0", "01", "x"):
        (default / ignored).mkdir()
    _versions(
        root,
        "declared",
        [1],
        "max_batch_size: 4\ninputs: [{name: x, datatype: FP32, shape: [-1, 2]}]\n"
        "outputs: [{name: y, datatype: FP32, shape: [-1, 2]}]\n",
    )
    _versions(root, "pair", [1], "instance_group: [{count: 2, kind: cpu}]\n")
    _versions(root, "contradicts", [1], "inputs: [{name: x, datatype: INT32, shape: [-1, 2]}]\n")
    _versions(root, "wrong_shape", [1], "inputs: [{name: x, datatype: FP32, shape: [-1, 3]}]\n")
    _versions(root, "unknown_key", [1], "max_batch_size: 4\nbatchsize: 3\n")
    _versions(root, "gpu", [1], "instance_group: [{kind: gpu, count: 1}]\n")
    _versions(root, "npu", [1], "instance_group: [{kind: npu, count: 1}]\n")
    (root / "corrupt" / "1").mkdir(parents=True)
    (root / "corrupt" / "1" / "model.onnx").write_bytes(b"this is not an onnx model")
    (root / "empty").mkdir()
    # Escapes: a model directory, a version directory and a model file that point outside the root.
    _versions(outside, "elsewhere", [1])
    (root / "escape_dir").symlink_to(outside / "elsewhere", target_is_directory=True)
    (root / "escape_version").mkdir()
    (root / "escape_version" / "1").symlink_to(outside / "elsewhere" / "1", target_is_directory=True)
    (root / "escape_file" / "1").mkdir(parents=True)
    (root / "escape_file" / "1" / "model.onnx").symlink_to(outside / "elsewhere" / "1" / "model.onnx")
    (root / "escape_config").mkdir()
    _versions(root, "escape_config_m", [1])
    (outside / "config.yaml").write_text("max_batch_size: 2\n")
    (root / "escape_config_m" / "config.yaml").symlink_to(outside / "config.yaml")
    # A symlink that stays inside the root is fine.
    (root / "alias").symlink_to(root / "default", target_is_directory=True)
    # A directory whose name is not a valid model name is skipped.
    _versions(root, "-bad-name", [1])
    return root, outside


@pytest.fixture(scope="module")
def server(layout: tuple[Path, Path]) -> Iterator[ServerProcess]:
    root, _ = layout
    with ServerProcess("--model-repository", str(root), "--log-level", "info", wait_ready=False) as process:
        process.wait_loaded()
        yield process


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10.0) as c:
        yield c


def _log(server: ServerProcess) -> list[dict[str, Any]]:
    records = []
    for line in server.log_path.read_text(errors="replace").splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def _infer(client: httpx.Client, path: str) -> httpx.Response:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}]}
    return client.post(path, json=body)


def test_server_lives_and_is_not_ready_with_failed_models(client: httpx.Client) -> None:
    assert client.get("/v2/health/live").status_code == 200
    assert client.get("/v2/health/ready").status_code == 400


@pytest.mark.parametrize(
    ("model", "served", "absent"),
    [
        ("all_v", [1, 2, 3], []),
        ("latest2", [2, 3], [1]),
        ("specific", [1, 3], [2]),
        ("default", [10], [1, 2]),
        ("alias", [10], [1, 2]),
    ],
)
def test_version_policy(client: httpx.Client, model: str, served: list[int], absent: list[int]) -> None:
    assert client.get(f"/v2/models/{model}").json()["versions"] == [str(v) for v in served]
    assert client.get(f"/v2/models/{model}/ready").status_code == 200
    for v in served:
        assert client.get(f"/v2/models/{model}/versions/{v}/ready").status_code == 200
        response = _infer(client, f"/v2/models/{model}/versions/{v}/infer")
        assert response.status_code == 200, response.text
        document = response.json()
        assert document["model_version"] == str(v)
        assert document["outputs"][0]["data"] == [1.0 * v, 2.0 * v]
    for v in absent:
        assert client.get(f"/v2/models/{model}/versions/{v}/ready").status_code == 404
        assert _infer(client, f"/v2/models/{model}/versions/{v}/infer").status_code == 404
    latest = _infer(client, f"/v2/models/{model}/infer").json()
    assert latest["model_version"] == str(max(served))


def test_specs_read_from_the_model(client: httpx.Client) -> None:
    meta = client.get("/v2/models/default").json()
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}]
    assert meta["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}]


def test_declared_specs_that_agree(client: httpx.Client) -> None:
    assert client.get("/v2/models/declared/ready").status_code == 200
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [5, 2], "data": [0.0] * 10}]}
    response = client.post("/v2/models/declared/infer", json=body)
    assert response.status_code == 400
    assert "inference request batch-size must be <= 4 for" in response.json()["error"]


def _v1_status(client: httpx.Client, model: str) -> list[dict[str, object]]:
    response = client.get(f"/v1/models/{model}")
    assert response.status_code == 200
    statuses: list[dict[str, object]] = response.json()["model_version_status"]
    return statuses


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("contradicts", "contradicts the model"),
        ("wrong_shape", "contradicts the model"),
        ("gpu", "CUDAExecutionProvider"),
        ("npu", "CANNExecutionProvider"),
        ("corrupt", "could not load model.onnx"),
    ],
)
def test_failed_versions(client: httpx.Client, server: ServerProcess, model: str, reason: str) -> None:
    [status] = _v1_status(client, model)
    assert status["state"] == "END"
    message = status["status"]["error_message"]  # type: ignore[index]
    assert reason in message
    assert not LEAK.search(message), message
    assert client.get(f"/v2/models/{model}/ready").status_code == 400
    assert client.get(f"/v2/models/{model}/versions/1/ready").status_code == 400
    response = _infer(client, f"/v2/models/{model}/infer")
    assert response.status_code == 503
    assert "retry-after" in response.headers
    assert not LEAK.search(response.json()["error"])
    versioned = _infer(client, f"/v2/models/{model}/versions/1/infer")
    assert versioned.status_code == 503
    # Metadata of a version that exists but failed: unavailable, not unknown.
    assert client.get(f"/v2/models/{model}/versions/1").status_code == 503
    assert any(reason in r.get("message", "") for r in _log(server) if r.get("level") == "error")
    assert client.get("/v2/health/live").status_code == 200


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("escape_dir", "outside the model repository"),
        ("escape_version", "outside the model repository"),
        ("escape_file", "outside the repository"),
        ("escape_config_m", "outside the model repository"),
        ("unknown_key", "key 'batchsize': unknown key"),
        ("empty", "no version directory"),
    ],
)
def test_models_refused_at_scan(client: httpx.Client, model: str, reason: str) -> None:
    response = client.get(f"/v2/models/{model}")
    assert response.status_code == 503
    error = response.json()["error"]
    assert reason in error
    assert not LEAK.search(error), error
    assert client.get(f"/v2/models/{model}/ready").status_code == 400
    assert _infer(client, f"/v2/models/{model}/infer").status_code == 503
    assert client.get("/v2/health/live").status_code == 200


def test_invalid_directory_names_are_skipped(client: httpx.Client, server: ServerProcess) -> None:
    assert client.get("/v2/models/-bad-name").status_code == 400
    assert any("not a valid model name" in r.get("message", "") for r in _log(server))


def test_one_session_per_instance(client: httpx.Client, server: ServerProcess) -> None:
    """``count: 2`` loads two instances (two ONNX Runtime sessions); both are healthy and serve."""
    metrics = httpx.get(server.metrics_url, timeout=10).text
    healthy = [
        line
        for line in metrics.splitlines()
        if line.startswith("tensorgate_instance_healthy{") and 'model="pair"' in line and line.endswith(" 1.0")
    ]
    assert len(healthy) == 2, healthy
    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda _: _infer(client, "/v2/models/pair/infer").status_code, range(16)))
    assert codes == [200] * 16
