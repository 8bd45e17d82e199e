"""Request bodies of each tensor protocol, checked by decoding them the way servers do."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from tritonclient.grpc import service_pb2

from tensorgate.bench.inputs import Tensor
from tensorgate.bench.targets.base import Endpoint, parse_endpoint
from tensorgate.bench.targets.encoding import raw_bytes
from tensorgate.bench.targets.grpc_v2 import infer_request_bytes
from tensorgate.bench.targets.http_tensor import encode_v1, encode_v2_binary, encode_v2_json, v1_body, v2_binary_body
from tensorgate.protocols.http.v2_codec import DecodeLimits, decode_infer

FEATURES = Tensor("features", "FP32", np.arange(32, dtype=np.float32).reshape(2, 16))
WORDS = Tensor("words", "BYTES", np.array([b"ab", b"", b"xyz"], dtype=object))
FLAGS = Tensor("flags", "BOOL", np.array([True, False]))
ENDPOINT = Endpoint("127.0.0.1", 8080, "")


def _split(raw: bytes) -> tuple[str, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    assert int(headers["Content-Length"]) == len(body)
    return lines[0], headers, body


def test_v2_json_request_decodes_on_the_server() -> None:
    start, headers, body = _split(encode_v2_json(ENDPOINT, "mlp", None, (FEATURES, WORDS)))
    assert start == "POST /v2/models/mlp/infer HTTP/1.1"
    assert headers["Host"] == "127.0.0.1:8080"
    request, _ = decode_infer(body, None, "mlp", None, DecodeLimits())
    np.testing.assert_array_equal(request.inputs["features"], FEATURES.array)
    assert list(request.inputs["words"]) == [b"ab", b"", b"xyz"]


def test_v2_binary_request_decodes_on_the_server() -> None:
    start, headers, body = _split(encode_v2_binary(ENDPOINT, "mlp", "2", (FEATURES, WORDS, FLAGS)))
    assert start == "POST /v2/models/mlp/versions/2/infer HTTP/1.1"
    header_length = int(headers["Inference-Header-Content-Length"])
    header = orjson.loads(body[:header_length])
    assert header["parameters"] == {"binary_data_output": True}
    assert header["inputs"][0]["parameters"] == {"binary_data_size": 32 * 4}
    request, prefs = decode_infer(body, header_length, "mlp", 2, DecodeLimits())
    np.testing.assert_array_equal(request.inputs["features"], FEATURES.array)
    assert list(request.inputs["words"]) == [b"ab", b"", b"xyz"]
    np.testing.assert_array_equal(request.inputs["flags"], FLAGS.array)
    assert prefs.wants_binary("probabilities")


def test_raw_bytes_layout() -> None:
    assert raw_bytes(WORDS) == b"\x02\x00\x00\x00ab\x00\x00\x00\x00\x03\x00\x00\x00xyz"
    big_endian = Tensor("x", "INT32", np.array([1, 2], dtype=">i4"))
    assert raw_bytes(big_endian) == b"\x01\x00\x00\x00\x02\x00\x00\x00"


def test_v1_bodies() -> None:
    assert orjson.loads(v1_body((FEATURES,))) == {"instances": FEATURES.array.tolist()}
    assert orjson.loads(v1_body((FEATURES, WORDS))) == {
        "inputs": {"features": FEATURES.array.tolist(), "words": ["ab", "", "xyz"]}
    }
    start, _, _ = _split(encode_v1(ENDPOINT, "mlp", None, (FEATURES,)))
    assert start == "POST /v1/models/mlp:predict HTTP/1.1"


def test_binary_body_header_length() -> None:
    body, header_length = v2_binary_body((FEATURES,))
    assert len(body) == header_length + 32 * 4


def test_grpc_request_carries_raw_input_contents() -> None:
    message = service_pb2.ModelInferRequest.FromString(infer_request_bytes("mlp", "1", (FEATURES, WORDS)))
    assert message.model_name == "mlp" and message.model_version == "1"
    assert [(i.name, i.datatype, list(i.shape)) for i in message.inputs] == [
        ("features", "FP32", [2, 16]),
        ("words", "BYTES", [3]),
    ]
    np.testing.assert_array_equal(
        np.frombuffer(message.raw_input_contents[0], dtype="<f4").reshape(2, 16), FEATURES.array
    )
    assert message.raw_input_contents[1] == raw_bytes(WORDS)


@pytest.mark.parametrize(
    ("url", "host", "port", "prefix"),
    [
        ("http://127.0.0.1:8000", "127.0.0.1", 8000, ""),
        ("127.0.0.1:9000", "127.0.0.1", 9000, ""),
        ("http://localhost/api/", "localhost", 80, "/api"),
        ("grpc://127.0.0.1:8001", "127.0.0.1", 8001, ""),
    ],
)
def test_parse_endpoint(url: str, host: str, port: int, prefix: str) -> None:
    endpoint = parse_endpoint(url, default_port=80)
    assert (endpoint.host, endpoint.port, endpoint.prefix) == (host, port, prefix)


def test_parse_endpoint_tls_and_credentials() -> None:
    secure = parse_endpoint("https://example.com", 443, ca_file="/ca.pem", credential="k")
    assert (secure.tls, secure.port, secure.ca_file) == (True, 443, "/ca.pem")
    assert secure.request_headers == (("Authorization", "Bearer k"),)
    assert parse_endpoint("grpcs://example.com:8081", 8081).tls
    assert not parse_endpoint("grpc://example.com:8081", 8081).tls
    assert parse_endpoint("http://example.com", 80).request_headers == ()
    with pytest.raises(ValueError, match="--cacert is for a TLS server"):
        parse_endpoint("http://example.com", 80, ca_file="/ca.pem")
    with pytest.raises(ValueError, match="unsupported URL scheme"):
        parse_endpoint("ftp://example.com", 80)
