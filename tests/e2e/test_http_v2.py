"""KServe V2 over HTTP against a real server: health, metadata, every datatype in JSON and binary,
requested outputs, ids, the NaN/Inf policy. Outputs are checked against onnxruntime run here.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper

from tensorgate.examples import build_example_repository
from tensorgate.testing import ServerProcess

# V2 datatype -> (ONNX element type, numpy dtype)
DATATYPES: dict[str, tuple[int, Any]] = {
    "BOOL": (TensorProto.BOOL, np.bool_),
    "UINT8": (TensorProto.UINT8, np.uint8),
    "UINT16": (TensorProto.UINT16, np.uint16),
    "UINT32": (TensorProto.UINT32, np.uint32),
    "UINT64": (TensorProto.UINT64, np.uint64),
    "INT8": (TensorProto.INT8, np.int8),
    "INT16": (TensorProto.INT16, np.int16),
    "INT32": (TensorProto.INT32, np.int32),
    "INT64": (TensorProto.INT64, np.int64),
    "FP16": (TensorProto.FLOAT16, np.float16),
    "FP32": (TensorProto.FLOAT, np.float32),
    "FP64": (TensorProto.DOUBLE, np.float64),
    "BYTES": (TensorProto.STRING, np.object_),
}


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: list[Any] | None = None) -> bytes:
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _identity(elem: int) -> bytes:
    return _model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", elem, ["batch", 3])],
        [helper.make_tensor_value_info("y", elem, ["batch", 3])],
    )


def _nan_model() -> bytes:
    """y = x * 0 + [NaN, Inf, -Inf, 1.5]: non-finite outputs from finite inputs."""
    zero = numpy_helper.from_array(np.zeros(4, dtype=np.float32), "zero")
    const = numpy_helper.from_array(np.array([np.nan, np.inf, -np.inf, 1.5], dtype=np.float32), "c")
    return _model(
        [helper.make_node("Mul", ["x", "zero"], ["z"]), helper.make_node("Add", ["z", "c"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [zero, const],
    )


def _two_outputs() -> bytes:
    return _model(
        [helper.make_node("Add", ["x", "x"], ["double"]), helper.make_node("Neg", ["x"], ["negative"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
        [
            helper.make_tensor_value_info("double", TensorProto.FLOAT, ["batch", 2]),
            helper.make_tensor_value_info("negative", TensorProto.FLOAT, ["batch", 2]),
        ],
    )


def _fixed() -> bytes:
    """A model with no batch axis: [2, 2] -> [2, 2], served unbatched."""
    return _model(
        [helper.make_node("Neg", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
    )


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = build_example_repository(tmp_path_factory.mktemp("v2-repo"))
    models = {f"id_{name.lower()}": _identity(elem) for name, (elem, _) in DATATYPES.items()}
    models |= {"nan": _nan_model(), "two": _two_outputs(), "fixed": _fixed()}
    for name, data in models.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.onnx").write_bytes(data)
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    with ServerProcess("--model-repository", str(repo), "--log-level", "warning") as process:
        yield process


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10.0) as c:
        yield c


@pytest.fixture(scope="module")
def triton(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(server.http_address)
    yield c
    c.close()


def _reference(repo: Path, model: str, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(str(repo / model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    return list(session.run(None, feed))


def _sample(datatype: str) -> np.ndarray:
    if datatype == "BYTES":
        return np.array([["a", "héllo", ""], ["x" * 300, "0", "\u2603"]], dtype=object)
    if datatype == "BOOL":
        return np.array([[True, False, True], [False, False, True]])
    dtype = DATATYPES[datatype][1]
    if np.dtype(dtype).kind == "f":
        return np.array([[0.5, -1.25, 3.0], [1e-3, 65504.0, -0.0]], dtype=dtype)
    info = np.iinfo(dtype)
    return np.array([[info.min, info.max, 0], [1, 2, 3]], dtype=dtype)


# -- health and metadata -------------------------------------------------------------------------


def test_health_and_server_metadata(client: httpx.Client) -> None:
    # The Open Inference Protocol's bodies (the KServe SDK parses them), Triton's status codes.
    for path, body in (("/v2/health/live", {"live": True}), ("/v2/health/ready", {"ready": True})):
        response = client.get(path)
        assert response.status_code == 200
        assert response.json() == body and response.headers["content-type"] == "application/json"
        assert client.head(path).status_code == 200
    assert client.get("/v2/models/mlp/ready").json() == {"name": "mlp", "ready": True}
    assert client.get("/v2/models/mlp/versions/1/ready").json() == {"name": "mlp", "ready": True}
    meta = client.get("/v2").json()
    assert meta["name"] == "tensorgate"
    assert "binary_tensor_data" in meta["extensions"]


def test_model_metadata_with_and_without_version(client: httpx.Client) -> None:
    plain = client.get("/v2/models/mlp").json()
    versioned = client.get("/v2/models/mlp/versions/1").json()
    assert plain == versioned
    assert plain == {
        "name": "mlp",
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [-1, 16]}],
        "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 3]}],
    }
    assert client.get("/v2/models/id_bytes").json()["inputs"] == [{"name": "x", "datatype": "BYTES", "shape": [-1, 3]}]
    assert client.get("/v2/models/fixed").json()["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [2, 2]}]


def test_model_readiness(client: httpx.Client) -> None:
    assert client.get("/v2/models/mlp/ready").status_code == 200
    assert client.get("/v2/models/mlp/versions/1/ready").status_code == 200
    assert client.get("/v2/models/mlp/versions/2/ready").status_code == 404
    assert client.get("/v2/models/nope/ready").status_code == 404


# -- inference -----------------------------------------------------------------------------------


@pytest.mark.parametrize("nested", [False, True])
def test_infer_json_matches_onnxruntime(client: httpx.Client, repo: Path, nested: bool) -> None:
    features = np.random.default_rng(3).standard_normal((4, 16)).astype(np.float32)
    data = features.tolist() if nested else features.reshape(-1).tolist()
    body = {"id": "abc-1", "inputs": [{"name": "features", "shape": [4, 16], "datatype": "FP32", "data": data}]}
    response = client.post("/v2/models/mlp/infer", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    document = response.json()
    assert document["id"] == "abc-1"
    assert document["model_name"] == "mlp"
    assert document["model_version"] == "1"
    [output] = document["outputs"]
    assert output["name"] == "probabilities"
    assert output["datatype"] == "FP32"
    assert output["shape"] == [4, 3]
    got = np.array(output["data"], dtype=np.float32).reshape(4, 3)
    np.testing.assert_allclose(got, _reference(repo, "mlp", {"features": features})[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("nested", [False, True])
def test_large_json_body_matches_onnxruntime(client: httpx.Client, repo: Path, nested: bool) -> None:
    """Image-sized bodies: flat data takes the simdjson path, nested the general one; same answers."""
    images = np.random.default_rng(4).standard_normal((8, 3, 32, 32)).astype(np.float32)
    data = images.tolist() if nested else images.reshape(-1).tolist()
    body = {"inputs": [{"name": "image", "shape": [8, 3, 32, 32], "datatype": "FP32", "data": data}]}
    response = client.post("/v2/models/cnn/infer", json=body)
    assert response.status_code == 200, response.text
    [output] = response.json()["outputs"]
    got = np.array(output["data"], dtype=np.float32).reshape(output["shape"])
    np.testing.assert_allclose(got, _reference(repo, "cnn", {"image": images})[0], rtol=1e-5, atol=1e-5)
    data_with_a_string: list[Any] = images.reshape(-1).tolist()
    data_with_a_string[-1] = "oops"
    body["inputs"][0]["data"] = data_with_a_string
    refused = client.post("/v2/models/cnn/infer", json=body)
    assert refused.status_code == 400
    assert "data cannot be read as FP32" in refused.json()["error"]


def test_versioned_infer_names_the_version(client: httpx.Client) -> None:
    body = {"inputs": [{"name": "features", "shape": [1, 16], "datatype": "FP32", "data": [0.0] * 16}]}
    document = client.post("/v2/models/mlp/versions/1/infer", json=body).json()
    assert document["model_version"] == "1"
    assert "id" not in document


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain", None])
def test_curl_style_request(server: ServerProcess, content_type: str | None) -> None:
    """``curl -d '{...}'`` sends form-urlencoded; the README's examples work as written."""
    body = json.dumps({"inputs": [{"name": "features", "shape": [1, 16], "datatype": "FP32", "data": [0.1] * 16}]})
    headers = {"Content-Type": content_type} if content_type else {}
    response = httpx.post(server.url + "/v2/models/mlp/infer", content=body, headers=headers)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["shape"] == [1, 3]


def test_gzip_request(client: httpx.Client) -> None:
    body = json.dumps({"inputs": [{"name": "features", "shape": [1, 16], "datatype": "FP32", "data": [0.1] * 16}]})
    response = client.post(
        "/v2/models/mlp/infer", content=gzip.compress(body.encode()), headers={"Content-Encoding": "gzip"}
    )
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_every_datatype_in_json(client: httpx.Client, repo: Path, datatype: str) -> None:
    array = _sample(datatype)
    data = array.tolist() if datatype != "FP16" else array.astype(np.float32).tolist()
    body = {"inputs": [{"name": "x", "datatype": datatype, "shape": [2, 3], "data": data}]}
    response = client.post(f"/v2/models/id_{datatype.lower()}/infer", json=body)
    assert response.status_code == 200, response.text
    [output] = response.json()["outputs"]
    assert output["datatype"] == datatype
    assert output["shape"] == [2, 3]
    [want] = _reference(repo, f"id_{datatype.lower()}", {"x": array})
    if datatype == "BYTES":
        assert output["data"] == [str(s) for s in want.reshape(-1)]
    else:
        got = np.array(output["data"], dtype=DATATYPES[datatype][1])
        np.testing.assert_array_equal(got, want.reshape(-1))


@pytest.mark.parametrize("binary_in", [False, True])
@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_every_datatype_with_tritonclient(
    triton: httpclient.InferenceServerClient, repo: Path, datatype: str, binary_in: bool
) -> None:
    array = _sample(datatype)
    if datatype == "BYTES":
        array = np.array([[s.encode() for s in row] for row in array], dtype=object)
    inp = httpclient.InferInput("x", [2, 3], datatype)
    inp.set_data_from_numpy(array, binary_data=binary_in)
    result = triton.infer(f"id_{datatype.lower()}", [inp], outputs=[httpclient.InferRequestedOutput("y")])
    got = result.as_numpy("y")
    assert got is not None
    if datatype == "BYTES":
        assert got.tolist() == array.tolist()
    else:
        assert got.dtype == array.dtype
        np.testing.assert_array_equal(got, array)


def test_requested_outputs_are_honoured(client: httpx.Client, triton: httpclient.InferenceServerClient) -> None:
    x = {"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1.0, -2.0]}
    both = client.post("/v2/models/two/infer", json={"inputs": [x]}).json()
    assert [o["name"] for o in both["outputs"]] == ["double", "negative"]
    only = client.post("/v2/models/two/infer", json={"inputs": [x], "outputs": [{"name": "negative"}]}).json()
    assert [o["name"] for o in only["outputs"]] == ["negative"]
    assert only["outputs"][0]["data"] == [-1.0, 2.0]

    # One output binary, the other JSON, through Triton's client.
    inp = httpclient.InferInput("x", [1, 2], "FP32")
    inp.set_data_from_numpy(np.array([[1.0, -2.0]], dtype=np.float32))
    outputs = [
        httpclient.InferRequestedOutput("double", binary_data=True),
        httpclient.InferRequestedOutput("negative", binary_data=False),
    ]
    result = triton.infer("two", [inp], outputs=outputs, request_id="r-2")
    np.testing.assert_array_equal(result.as_numpy("double"), [[2.0, -4.0]])
    np.testing.assert_array_equal(result.as_numpy("negative"), [[-1.0, 2.0]])
    response = result.get_response()
    assert response["id"] == "r-2"
    by_name = {o["name"]: o for o in response["outputs"]}
    assert by_name["double"]["parameters"]["binary_data_size"] == 8
    assert "data" in by_name["negative"]


def test_binary_output_default_parameter(client: httpx.Client) -> None:
    body = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}],
        "parameters": {"binary_data_output": True},
    }
    response = client.post("/v2/models/two/infer", json=body)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/octet-stream"
    header_length = int(response.headers["inference-header-content-length"])
    header = json.loads(response.content[:header_length])
    blob = response.content[header_length:]
    assert [o["parameters"]["binary_data_size"] for o in header["outputs"]] == [8, 8]
    np.testing.assert_array_equal(np.frombuffer(blob, dtype="<f4"), [2.0, 4.0, -1.0, -2.0])


def test_unbatched_model(client: httpx.Client) -> None:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3, 4]}]}
    response = client.post("/v2/models/fixed/infer", json=body)
    assert response.status_code == 200
    assert response.json()["outputs"][0]["data"] == [-1, -2, -3, -4]
    wrong = client.post(
        "/v2/models/fixed/infer",
        json={"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2, 2], "data": [1, 2, 3, 4]}]},
    )
    assert wrong.status_code == 400


def test_parameters_and_deep_nesting_in_parameters(client: httpx.Client) -> None:
    node: Any = 1
    for _ in range(48):  # with the document and "parameters" itself: depth 50
        node = {"x": node}
    body = {
        "inputs": [{"name": "features", "shape": [1, 16], "datatype": "FP32", "data": [0.0] * 16}],
        "parameters": {"priority": 1, "timeout": 5_000_000, "deep": node},
    }
    assert client.post("/v2/models/mlp/infer", json=body).status_code == 200


# -- NaN and Inf ---------------------------------------------------------------------------------


def _strict(text: str) -> Any:
    def refuse(token: str) -> Any:
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_json_outputs_are_null(client: httpx.Client) -> None:
    """Policy: JSON outputs encode NaN and +/-Inf as null, so strict parsers accept every answer."""
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
    response = client.post("/v2/models/nan/infer", json=body)
    assert response.status_code == 200
    document = _strict(response.text)
    assert document["outputs"][0]["data"] == [None, None, None, 1.5]


def test_non_finite_binary_outputs_are_bit_exact(triton: httpclient.InferenceServerClient, repo: Path) -> None:
    x = np.ones((2, 4), dtype=np.float32)
    inp = httpclient.InferInput("x", [2, 4], "FP32")
    inp.set_data_from_numpy(x)
    result = triton.infer("nan", [inp], outputs=[httpclient.InferRequestedOutput("y", binary_data=True)])
    got = result.as_numpy("y")
    assert got is not None
    [want] = _reference(repo, "nan", {"x": x})
    assert got.tobytes() == want.tobytes()
    assert math.isnan(got[0, 0]) and got[0, 1] == math.inf and got[0, 2] == -math.inf


def test_non_finite_binary_inputs_pass_through(triton: httpclient.InferenceServerClient) -> None:
    x = np.array([[np.nan, np.inf, -np.inf]], dtype=np.float32)
    inp = httpclient.InferInput("x", [1, 3], "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    result = triton.infer("id_fp32", [inp], outputs=[httpclient.InferRequestedOutput("y", binary_data=True)])
    got = result.as_numpy("y")
    assert got is not None
    assert got.tobytes() == x.tobytes()


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "nan", "inf"])
def test_non_finite_json_input_tokens_are_400(client: httpx.Client, token: str) -> None:
    body = '{"inputs":[{"name":"x","datatype":"FP32","shape":[1,3],"data":[1.0,' + token + ",2.0]}]}"
    response = client.post("/v2/models/id_fp32/infer", content=body)
    assert response.status_code == 400
    assert "not valid JSON" in response.json()["error"]
    assert client.get("/v2/health/live").status_code == 200
