"""Triton's own HTTP client against a real server: JSON and binary tensors, metadata, readiness."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient

from tensorgate.examples import EXAMPLE_MODELS
from tensorgate.testing import ServerProcess


def _reference(repo: Path, model: str, name: str, array: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(repo / model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, {name: array})[0]


@pytest.fixture()
def client(example_server: ServerProcess) -> httpclient.InferenceServerClient:
    c = httpclient.InferenceServerClient(example_server.http_address)
    yield c
    c.close()


def test_health_and_metadata(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("mlp")
    meta = client.get_model_metadata("mlp")
    assert meta["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [-1, 16]}]
    assert meta["outputs"][0]["name"] == "probabilities"
    assert client.get_server_metadata()["name"] == "tensorgate"


@pytest.mark.parametrize("binary_in", [False, True])
@pytest.mark.parametrize("binary_out", [False, True])
def test_infer_matches_onnxruntime(
    client: httpclient.InferenceServerClient, example_repo: Path, binary_in: bool, binary_out: bool
) -> None:
    rng = np.random.default_rng(1)
    images = rng.standard_normal((3, 3, 32, 32)).astype(np.float32)
    inp = httpclient.InferInput("image", list(images.shape), "FP32")
    inp.set_data_from_numpy(images, binary_data=binary_in)
    out = httpclient.InferRequestedOutput("probabilities", binary_data=binary_out)
    result = client.infer("cnn", [inp], outputs=[out], request_id="req-7")
    got = result.as_numpy("probabilities")
    np.testing.assert_allclose(got, _reference(example_repo, "cnn", "image", images), rtol=1e-5, atol=1e-6)
    response = result.get_response()
    assert response["id"] == "req-7"
    assert response["model_version"] == "1"


def test_model_config_is_the_same_over_http_and_grpc(
    client: httpclient.InferenceServerClient, example_server: ServerProcess
) -> None:
    """Triton's model configuration extension: what tritonclient.http reads, field for field what
    the ModelConfig RPC answers."""
    import tritonclient.grpc as grpcclient
    from google.protobuf import json_format

    config = client.get_model_config("mlp")
    assert config["input"] == [{"name": "features", "data_type": "TYPE_FP32", "dims": [16]}]
    assert config["max_batch_size"] == 64
    policy = config["dynamic_batching"]["default_queue_policy"]
    assert policy["max_queue_size"] == 1024  # the example's config.yaml
    assert client.get_model_config("mlp", "1") == config
    rpc = grpcclient.InferenceServerClient(example_server.grpc_address)
    try:
        answer = rpc.get_model_config("mlp").config
    finally:
        rpc.close()
    assert json_format.ParseDict(config, type(answer)()) == answer


def test_unknown_model_is_an_error(client: httpclient.InferenceServerClient) -> None:
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as caught:
        client.get_model_metadata("nope")
    # What Triton's example clients look for: ex.message().startswith("Request for unknown model")
    assert caught.value.message().startswith("Request for unknown model: 'nope' is not found")
    assert caught.value.status() == "404"


def test_inference_statistics_count_exactly_what_ran(client: httpclient.InferenceServerClient) -> None:
    """Triton's statistics extension over HTTP, read by tritonclient's own call."""
    inp = httpclient.InferInput("features", [3, 16], "FP32")
    inp.set_data_from_numpy(np.ones((3, 16), np.float32))
    before = client.get_inference_statistics("mlp")["model_stats"][0]
    for _ in range(2):
        client.infer("mlp", [inp])
    after = client.get_inference_statistics("mlp")["model_stats"][0]
    assert (after["name"], after["version"]) == ("mlp", "1")
    assert after["inference_count"] - before["inference_count"] == 6
    assert after["execution_count"] - before["execution_count"] == 2
    stats, old = after["inference_stats"], before["inference_stats"]
    for step in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert stats[step]["count"] - old[step]["count"] == 2, step
    assert stats["fail"]["count"] == old["fail"]["count"]
    assert stats["success"]["ns"] > old["success"]["ns"]
    by_size = {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]}
    before_size = {b["batch_size"]: b["compute_infer"]["count"] for b in before["batch_stats"]}
    assert by_size[3] - before_size.get(3, 0) == 2
    version_stats = client.get_inference_statistics("mlp", model_version="1")["model_stats"]
    assert [s["version"] for s in version_stats] == ["1"]
    assert {s["name"] for s in client.get_inference_statistics()["model_stats"]} == EXAMPLE_MODELS
