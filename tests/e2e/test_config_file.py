"""The single-file server config (DESIGN §4) served for real, and config errors at the command line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tensorgate.cli.main import main
from tensorgate.examples.build import mlp_model
from tensorgate.testing import ServerProcess


def _fixed_batch_model() -> bytes:
    """A model exported with batch 1 fixed: image [1, 3, 8, 8] -> mean [1, 3]."""
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["image"], ["mean"], axes=[2, 3], keepdims=0)],
        "fixed",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("mean", TensorProto.FLOAT, [1, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _records(server: ServerProcess) -> list[dict[str, Any]]:
    records = []
    for line in server.log_path.read_text(errors="replace").splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("flat")
    (base / "models").mkdir()
    (base / "models" / "mlp.onnx").write_bytes(mlp_model().SerializeToString())
    (base / "models" / "mlp_v2.onnx").write_bytes(mlp_model(seed=11).SerializeToString())
    fixed = base / "elsewhere" / "fixed.onnx"
    fixed.parent.mkdir()
    fixed.write_bytes(_fixed_batch_model())
    config = base / "server.yaml"
    config.write_text(
        f"""\
server: {{http_port: 8080, grpc_port: 8081, metrics_port: 9090}}
models:
  - name: mlp
    version: 1
    model_path: models/mlp.onnx
    input_shape: [1, 16]
    dynamic_batching: {{max_batch_size: 8, max_delay_ms: 5}}
    device_id: 0
  - name: mlp
    version: 2
    model_path: models/mlp_v2.onnx
    input_shape: [1, 16]
    dynamic_batching: {{max_batch_size: 8, max_delay_ms: 5}}
    device_id: 0
  - name: fixed
    version: 1
    model_path: {fixed}
    input_shape: [1, 3, 8, 8]
    dynamic_batching: {{max_batch_size: 8, max_delay_ms: 5}}
    device_id: 0
  - name: yolov8
    version: 1
    model_path: /models/yolov8/1/model.om
    input_shape: [1, 3, 640, 640]
    dynamic_batching: {{max_batch_size: 8, max_delay_ms: 5}}
    device_id: 0
"""
    )
    return base, config


@pytest.fixture(scope="module")
def server(setup: tuple[Path, Path]) -> Iterator[ServerProcess]:
    _, config = setup
    with ServerProcess("--config", str(config), "--log-level", "info", wait_ready=False) as process:
        process.wait_loaded()
        yield process


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10.0) as c:
        yield c


def test_batchable_model_from_the_file(client: httpx.Client, setup: tuple[Path, Path]) -> None:
    base, _ = setup
    meta = client.get("/v2/models/mlp").json()
    assert meta["versions"] == ["1", "2"]
    assert meta["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [-1, 16]}]
    features = np.random.default_rng(2).standard_normal((3, 16)).astype(np.float32)
    body = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [3, 16], "data": features.ravel().tolist()}]}
    for version, path in ((1, "mlp.onnx"), (2, "mlp_v2.onnx")):
        response = client.post(f"/v2/models/mlp/versions/{version}/infer", json=body)
        assert response.status_code == 200, response.text
        session = ort.InferenceSession(str(base / "models" / path), providers=["CPUExecutionProvider"])
        want = session.run(None, {"features": features})[0]
        got = np.array(response.json()["outputs"][0]["data"], dtype=np.float32).reshape(3, 3)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert client.post("/v2/models/mlp/infer", json=body).json()["model_version"] == "2"
    too_many = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [9, 16], "data": [0.0] * 144}]}
    response = client.post("/v2/models/mlp/infer", json=too_many)
    assert response.status_code == 400
    assert "inference request batch-size must be <= 8 for 'mlp'" in response.json()["error"]


def test_fixed_batch_model_is_served_unbatched_with_a_warning(client: httpx.Client, server: ServerProcess) -> None:
    assert client.get("/v2/models/fixed/ready").status_code == 200
    assert client.get("/v2/models/fixed").json()["inputs"] == [
        {"name": "image", "datatype": "FP32", "shape": [1, 3, 8, 8]}
    ]
    image = np.arange(192, dtype=np.float32).reshape(1, 3, 8, 8)
    body = {"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 3, 8, 8], "data": image.ravel().tolist()}]}
    response = client.post("/v2/models/fixed/infer", json=body)
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(response.json()["outputs"][0]["data"], image.mean(axis=(2, 3)).ravel())
    warnings = [r for r in _records(server) if r.get("level") == "warning"]
    assert any("fixed" in r["message"] and "unbatched" in r["message"] for r in warnings), warnings


def test_om_model_fails_naming_cann(client: httpx.Client, server: ServerProcess) -> None:
    [status] = client.get("/v1/models/yolov8").json()["model_version_status"]
    assert status["state"] == "END"
    assert "Ascend CANN runtime" in status["status"]["error_message"]
    assert client.get("/v2/models/yolov8/ready").status_code == 400
    body = {"inputs": [{"name": "images", "datatype": "FP32", "shape": [1, 1], "data": [0.0]}]}
    assert client.post("/v2/models/yolov8/infer", json=body).status_code == 503
    assert client.get("/v2/health/live").status_code == 200
    assert client.get("/v2/health/ready").status_code == 400


# -- configuration errors: exit 2, one line on stderr naming file, key and expectation ------------


_FREE_PORTS = ("--http-port", "0", "--grpc-port", "0", "--metrics-port", "0")


def _serve_exits_2(config: Path, timeout_s: float) -> str:
    """Run ``tensorgate serve --config`` as a user would; it must exit 2 without a traceback. Its stderr."""
    result = subprocess.run(
        [sys.executable, "-m", "tensorgate", "serve", "--config", str(config), *_FREE_PORTS],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    return result.stderr


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("models:\n  - {name: m, version: 0, model_path: m.onnx}\n", r"key 'models\.0\.version': .*greater than"),
        ("models:\n  - {name: m}\n", r"key 'models\.0\.model_path': Field required"),
        (
            "models:\n  - {name: m, model_path: m.onnx, dynamic_batching: {max_batch_size: 0}}\n",
            r"key 'models\.0\.dynamic_batching\.max_batch_size': .*greater than",
        ),
        (
            "models:\n  - {name: m, model_path: m.onnx, dynamic_batching: {max_delay: 5}}\n",
            r"key 'models\.0\.dynamic_batching\.max_delay': unknown key",
        ),
        ("server: {http_prot: 80}\n", r"key 'server\.http_prot': unknown key"),
        ("server: {max_body_bytes: lots}\n", r"key 'server\.max_body_bytes': .*integer"),
        ("server: {drain_delay_s: -1}\n", r"key 'server\.drain_delay_s': .*greater than or equal to 0"),
        ("server: {log_level: verbose}\n", r"key 'server\.log_level': .*'debug', 'info'"),
        ("- just\n- a list\n", r"expected a mapping"),
        ("server: [unclosed\n", r"not valid YAML"),
        ("server: {model_repository: no/such/dir}\n", r"key 'server\.model_repository': .* is not a directory"),
    ],
)
def test_config_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str) -> None:
    """The command itself, in this process (fast): exit code 2 and one message on stderr."""
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    # Flags override the file: every port is 0, so a case that wrongly starts a server binds nothing shared.
    code = main(["serve", "--config", str(config), *_FREE_PORTS])
    stderr = capsys.readouterr().err
    assert code == 2, stderr
    assert stderr.startswith(f"tensorgate: configuration error: {config}: ")
    assert re.search(expected, stderr), stderr


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("models:\n  - {name: ../etc, model_path: m.onnx}\n", r"key 'models\.0\.name': .*not a valid model name"),
        (
            "models:\n  - {name: m, model_path: a.onnx}\n  - {name: m, model_path: b.onnx}\n",
            r"key 'models': model 'm' lists a version twice",
        ),
    ],
)
def test_config_errors_from_the_command_line(tmp_path: Path, text: str, expected: str) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    stderr = _serve_exits_2(config, timeout_s=30)
    assert str(config) in stderr
    assert re.search(expected, stderr), stderr


def test_missing_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.yaml"
    assert main(["serve", "--config", str(missing), *_FREE_PORTS]) == 2
    stderr = capsys.readouterr().err
    assert str(missing) in stderr
    assert "cannot read" in stderr


def test_a_model_in_both_the_repository_and_the_file_is_a_config_error(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "m" / "1").mkdir(parents=True)
    (repo / "m" / "1" / "model.onnx").write_bytes(mlp_model().SerializeToString())
    (tmp_path / "m.onnx").write_bytes(mlp_model().SerializeToString())
    config = tmp_path / "both.yaml"
    config.write_text(f"server: {{model_repository: {repo}}}\nmodels:\n  - {{name: m, model_path: m.onnx}}\n")
    assert "also in the model repository" in _serve_exits_2(config, timeout_s=60)
