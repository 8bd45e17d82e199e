"""Triton's own gRPC client against a real server: health, metadata, config, infer, stream, statistics."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient

from tensorgate.examples import EXAMPLE_MODELS
from tensorgate.testing import ServerProcess


def _reference(repo: Path, model: str, name: str, array: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(repo / model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, {name: array})[0]


@pytest.fixture()
def client(example_server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(example_server.grpc_address)
    yield c
    c.close()


def test_health_and_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("mlp")
    assert client.is_model_ready("cnn", "1")
    # As Triton and as tritonclient.http: an unknown model or version is not ready, not an error.
    assert not client.is_model_ready("nope")
    assert not client.is_model_ready("mlp", "7")
    server = client.get_server_metadata()
    assert server.name == "tensorgate"
    assert "binary_tensor_data" in server.extensions
    meta = client.get_model_metadata("mlp", as_json=True)
    assert meta["inputs"] == [{"name": "features", "datatype": "FP32", "shape": ["-1", "16"]}]
    assert meta["outputs"] == [{"name": "probabilities", "datatype": "FP32", "shape": ["-1", "3"]}]
    assert meta["versions"] == ["1"]
    assert meta["platform"] == "onnxruntime_onnx"


def test_model_config_describes_the_loaded_version(client: grpcclient.InferenceServerClient) -> None:
    config = client.get_model_config("cnn", as_json=True)["config"]
    assert config["name"] == "cnn"
    assert config["platform"] == "onnxruntime_onnx"
    assert config["backend"] == "onnxruntime"
    assert int(config["max_batch_size"]) > 0
    # With a batch dimension, Triton's dims leave it out.
    assert config["input"] == [{"name": "image", "data_type": "TYPE_FP32", "dims": ["3", "32", "32"]}]
    assert config["output"] == [{"name": "probabilities", "data_type": "TYPE_FP32", "dims": ["10"]}]
    assert config["instance_group"] == [{"name": "cpu_instances", "kind": "KIND_CPU", "count": 1}]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == "5000"  # cnn's 5 ms window


def test_infer_raw_contents_matches_onnxruntime(client: grpcclient.InferenceServerClient, example_repo: Path) -> None:
    images = np.random.default_rng(3).standard_normal((3, 3, 32, 32)).astype(np.float32)
    inp = grpcclient.InferInput("image", list(images.shape), "FP32")
    inp.set_data_from_numpy(images)
    out = grpcclient.InferRequestedOutput("probabilities")
    result = client.infer("cnn", [inp], outputs=[out], request_id="req-9", model_version="1")
    got = result.as_numpy("probabilities")
    np.testing.assert_allclose(got, _reference(example_repo, "cnn", "image", images), rtol=1e-5, atol=1e-6)
    response = result.get_response()
    assert response.id == "req-9"
    assert response.model_name == "cnn"
    assert response.model_version == "1"
    assert [o.datatype for o in response.outputs] == ["FP32"]
    assert list(response.outputs[0].shape) == [3, 10]


def test_stream_infer_answers_in_order_and_survives_an_error(
    client: grpcclient.InferenceServerClient, example_repo: Path
) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    rng = np.random.default_rng(5)
    batches = [rng.standard_normal((2, 16)).astype(np.float32) for _ in range(4)]
    try:
        for index, features in enumerate(batches):
            inp = grpcclient.InferInput("features", list(features.shape), "FP32")
            inp.set_data_from_numpy(features)
            client.async_stream_infer("mlp", [inp], request_id=f"s{index}")
            if index == 1:  # a bad request in the middle: its error comes back, the stream goes on
                bad = grpcclient.InferInput("features", [2, 15], "FP32")
                bad.set_data_from_numpy(np.zeros((2, 15), np.float32))
                client.async_stream_infer("mlp", [bad], request_id="bad")
        received = [answers.get(timeout=30) for _ in range(len(batches) + 1)]
    finally:
        client.stop_stream()
    errors = [error for _, error in received if error is not None]
    assert len(errors) == 1
    assert "features" in str(errors[0])
    results = [result for result, error in received if error is None]
    assert [r.get_response().id for r in results] == ["s0", "s1", "s2", "s3"]
    # Every answer is its request's last: clients of decoupled-style streams read until this flag.
    assert all(r.get_response().parameters["triton_final_response"].bool_param for r in results)
    for result, features in zip(results, batches, strict=True):
        expected = _reference(example_repo, "mlp", "features", features)
        np.testing.assert_allclose(result.as_numpy("probabilities"), expected, rtol=1e-5, atol=1e-6)


def test_inference_statistics(client: grpcclient.InferenceServerClient) -> None:
    features = np.ones((4, 16), np.float32)
    inp = grpcclient.InferInput("features", [4, 16], "FP32")
    inp.set_data_from_numpy(features)
    before = client.get_inference_statistics("mlp", as_json=True)["model_stats"][0]
    client.infer("mlp", [inp])
    after = client.get_inference_statistics("mlp", as_json=True)["model_stats"][0]
    assert after["name"] == "mlp"
    assert after["version"] == "1"

    def delta(*path: str) -> int:
        old: object = before
        new: object = after
        for key in path:
            old = old.get(key, {}) if isinstance(old, dict) else {}  # protobuf JSON leaves zeros out
            new = new.get(key, {}) if isinstance(new, dict) else {}
        return int(new or 0) - int(old or 0)  # type: ignore[call-overload]

    # One request of 4 rows, alone on the server: one execution, exactly.
    assert delta("inference_count") == 4 and delta("execution_count") == 1
    for step in ("success", "queue", "compute_infer"):
        assert delta("inference_stats", step, "count") == 1, step
    assert delta("inference_stats", "fail", "count") == 0
    assert delta("inference_stats", "compute_infer", "ns") > 0
    assert any(int(b["batch_size"]) == 4 for b in after["batch_stats"])
    everything = client.get_inference_statistics(as_json=True)["model_stats"]
    assert {s["name"] for s in everything} == EXAMPLE_MODELS


def test_priority_and_timeout_parameters_are_accepted(client: grpcclient.InferenceServerClient) -> None:
    inp = grpcclient.InferInput("features", [1, 16], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 16), np.float32))
    result = client.infer("mlp", [inp], priority=1, timeout=10_000_000)  # uint64 priority, µs timeout
    assert result.as_numpy("probabilities").shape == (1, 3)
    with pytest.raises(grpcclient.InferenceServerException, match="priority 2 is outside"):
        client.infer("mlp", [inp], priority=2)
