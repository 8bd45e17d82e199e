"""The error catalogue over HTTP, table-driven.

Every case asserts the exact status and a substring of the JSON ``error``; no body leaks a stack
trace, a path or an address; the server stays live after each case; nothing comes back as 5xx.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import re
import socket
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from tensorgate.examples import build_example_repository
from tensorgate.testing import ServerProcess

LEAK = re.compile(r"Traceback|File \"|\.py\b|/tmp/|/root|0x[0-9a-f]{8,}")


def _save(model: onnx.ModelProto, path: Path) -> None:
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())


def _add_model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["sum"])],
        "add",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", 4]),
        ],
        [helper.make_tensor_value_info("sum", TensorProto.FLOAT, ["batch", 4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _strings_model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["text"], ["echo"])],
        "strings",
        [helper.make_tensor_value_info("text", TensorProto.STRING, ["batch"])],
        [helper.make_tensor_value_info("echo", TensorProto.STRING, ["batch"])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = build_example_repository(tmp_path_factory.mktemp("errors-repo"))
    _save(_add_model(), repo / "add" / "1" / "model.onnx")
    _save(_strings_model(), repo / "strings" / "1" / "model.onnx")
    with ServerProcess("--model-repository", str(repo), "--log-level", "warning") as process:
        yield process


# -- request builders ----------------------------------------------------------------------------


def _features(rows: int = 1, **overrides: Any) -> dict[str, Any]:
    node: dict[str, Any] = {"name": "features", "datatype": "FP32", "shape": [rows, 16], "data": [0.5] * (16 * rows)}
    node.update(overrides)
    return node


def _body(*inputs: dict[str, Any], **top: Any) -> bytes:
    return json.dumps({"inputs": list(inputs), **top}).encode()


def _binary(header: dict[str, Any], blob: bytes) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(header).encode()
    return head + blob, {"Inference-Header-Content-Length": str(len(head))}


def _nested(depth: int) -> Any:
    node: Any = 1
    for _ in range(depth):
        node = {"x": node}
    return node


def _bytes_blob(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(i)) + i for i in items)


_FEATURES_RAW = np.zeros((1, 16), dtype=np.float32).tobytes()


class _Marker:
    """A pickle whose ``__reduce__`` would create the marker file if anyone unpickled it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.path}",))


MARKER = Path(tempfile.gettempdir()) / f"tensorgate-pickle-marker-{os.getpid()}"
PICKLE = pickle.dumps(_Marker(str(MARKER)))


@dataclass(frozen=True)
class Case:
    id: str
    status: int
    error: str
    body: bytes = b""
    path: str = "/v2/models/mlp/infer"
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=dict)


def _binary_case(id: str, status: int, error: str, header: dict[str, Any], blob: bytes, **kw: Any) -> Case:
    body, headers = _binary(header, blob)
    return Case(id, status, error, body, headers={**headers, **kw.pop("headers", {})}, **kw)


CASES = [
    Case("malformed-json", 400, "not valid JSON", b'{"inputs": [{"name": '),
    Case("not-an-object", 400, "must be a JSON object", b"[1, 2]"),
    Case("empty-body", 400, "not valid JSON", b""),
    Case("missing-inputs", 400, "'inputs'", b"{}"),
    Case("inputs-not-list", 400, "'inputs'", b'{"inputs": {"features": 1}}'),
    Case("datatype-fp99", 400, "unknown datatype 'FP99'", _body(_features(datatype="FP99"))),
    Case(
        "datatype-wrong",
        400,
        "inference input 'features' data-type is 'INT32', but model 'mlp' expects 'FP32'",
        _body(_features(datatype="INT32", data=[1] * 16)),
    ),
    Case(
        "wrong-shape",
        400,
        "unexpected shape for input 'features' for model 'mlp'. Expected [-1,16], got [1,15]",
        _body(_features(shape=[1, 15], data=[0.5] * 15)),
    ),
    Case("wrong-rank", 400, "Expected [-1,16], got [16]", _body(_features(shape=[16], data=[0.5] * 16))),
    Case("data-count-short", 400, "needs 16 elements", _body(_features(data=[0.5] * 15))),
    Case("data-count-long", 400, "needs 16 elements", _body(_features(data=[0.5] * 17))),
    Case("data-ragged", 400, "cannot be read as FP32", _body(_features(data=[[0.5] * 8, [0.5] * 7]))),
    Case("data-string", 400, "cannot be read as FP32", _body(_features(data=["abc"] * 16))),
    Case(
        "data-missing",
        400,
        "neither 'data' nor binary_data_size",
        _body({"name": "features", "datatype": "FP32", "shape": [1, 16]}),
    ),
    Case("data-null", 400, "data must be a list", _body(_features(data=None))),
    Case(
        "nan-token",
        400,
        "not valid JSON",
        b'{"inputs":[{"name":"features","datatype":"FP32","shape":[1,1],"data":[NaN]}]}',
    ),
    Case(
        "infinity-token",
        400,
        "not valid JSON",
        b'{"inputs":[{"name":"features","datatype":"FP32","shape":[1,1],"data":[Infinity]}]}',
    ),
    Case("shape-overflow", 400, "exceed", _body(_features(shape=[16, 2**60 + 2]))),
    Case("shape-negative", 400, "negative", _body(_features(shape=[2, -5]))),
    Case("shape-not-ints", 400, "shape must be a list of integers", _body(_features(shape=[1, "16"]))),
    Case("batch-zero", 400, "batch size 0", _body(_features(rows=0, data=[]))),
    Case("batch-over-max", 400, "inference request batch-size must be <= 64 for 'mlp'", _body(_features(rows=65))),
    Case("json-depth-120", 400, "depth", _body(_features(), parameters=_nested(120))),
    Case("json-depth-250000", 400, "not valid JSON", b'{"inputs": ' + b"[" * 250_000 + b"]" * 250_000 + b"}"),
    Case("duplicate-input", 400, "more than once", _body(_features(), _features())),
    Case(
        "missing-input",
        400,
        "missing required inputs ['b']",
        _body({"name": "a", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}),
        path="/v2/models/add/infer",
    ),
    Case(
        "extra-input",
        400,
        "unexpected inference input 'bogus' for model 'mlp'",
        _body(_features(), {"name": "bogus", "datatype": "FP32", "shape": [1, 1], "data": [1]}),
    ),
    Case("unknown-input", 400, "unexpected inference input 'feature'", _body(_features(name="feature"))),
    Case("empty-inputs", 400, "Got inputs [], but missing required inputs ['features']", _body()),
    Case(
        "duplicate-output",
        400,
        "Duplicate output name 'probabilities' is not allowed in a request",
        _body(_features(), outputs=[{"name": "probabilities"}, {"name": "probabilities"}]),
    ),
    Case("unknown-output", 400, "unexpected inference output 'nope'", _body(_features(), outputs=[{"name": "nope"}])),
    Case("id-not-string", 400, "'id' must be a string", _body(_features(), id=7)),
    Case("bad-priority", 400, "priority", _body(_features(), parameters={"priority": -1})),
    _binary_case(
        "ihcl-huge",
        400,
        "Inference-Header-Content-Length",
        {"inputs": [_features(data=None)]},
        b"",
        headers={"Inference-Header-Content-Length": "99999999999"},
    ),
    _binary_case(
        "ihcl-abc",
        400,
        "Inference-Header-Content-Length",
        {"inputs": [_features()]},
        b"",
        headers={"Inference-Header-Content-Length": "abc"},
    ),
    _binary_case(
        "ihcl-negative",
        400,
        "Inference-Header-Content-Length",
        {"inputs": [_features()]},
        b"",
        headers={"Inference-Header-Content-Length": "-1"},
    ),
    _binary_case(
        "ihcl-over-body",
        400,
        "larger than the request body",
        {"inputs": [_features()]},
        b"",
        headers={"Inference-Header-Content-Length": "100000"},
    ),
    _binary_case(
        "binary-size-short",
        400,
        "byte size mismatch",
        {
            "inputs": [
                {"name": "features", "datatype": "FP32", "shape": [1, 16], "parameters": {"binary_data_size": 60}}
            ]
        },
        _FEATURES_RAW[:60],
    ),
    _binary_case(
        "binary-data-size-past-end",
        400,
        "runs past the end",
        {
            "inputs": [
                {"name": "features", "datatype": "FP32", "shape": [1, 16], "parameters": {"binary_data_size": 64}}
            ]
        },
        _FEATURES_RAW[:32],
    ),
    _binary_case(
        "binary-data-size-unclaimed",
        400,
        "no input's binary_data_size claims",
        {
            "inputs": [
                {"name": "features", "datatype": "FP32", "shape": [1, 16], "parameters": {"binary_data_size": 64}}
            ]
        },
        _FEATURES_RAW + b"\0" * 8,
    ),
    _binary_case(
        "binary-size-negative",
        400,
        "binary_data_size must be a non-negative integer",
        {
            "inputs": [
                {"name": "features", "datatype": "FP32", "shape": [1, 16], "parameters": {"binary_data_size": -4}}
            ]
        },
        _FEATURES_RAW,
    ),
    _binary_case(
        "bytes-count-minus",
        400,
        "fewer than the 3 elements",
        {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [3], "parameters": {"binary_data_size": 14}}]},
        _bytes_blob([b"ab", b"cd", b"e"])[:14],
        path="/v2/models/strings/infer",
    ),
    _binary_case(
        "bytes-count-minus-2",
        400,
        "fewer than the 3 elements",
        {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [3], "parameters": {"binary_data_size": 5}}]},
        _bytes_blob([b"a"]),
        path="/v2/models/strings/infer",
    ),
    _binary_case(
        "bytes-count-huge",
        400,
        "fewer than the 268435456 elements",
        {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1 << 28], "parameters": {"binary_data_size": 4}}]},
        _bytes_blob([b""]),
        path="/v2/models/strings/infer",
    ),
    _binary_case(
        "bytes-count-plus",
        400,
        "more than the 1 elements",
        {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 10}}]},
        _bytes_blob([b"a", b"b"]),
        path="/v2/models/strings/infer",
    ),
    _binary_case(
        "bytes-length-past-end",
        400,
        "runs past the end of its data",
        {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 6}}]},
        struct.pack("<I", 1000) + b"ab",
        path="/v2/models/strings/infer",
    ),
    Case(
        "bytes-json-count",
        400,
        "needs 2 elements",
        _body({"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a", "b", "c"]}),
        path="/v2/models/strings/infer",
    ),
    Case(
        "bytes-json-not-strings",
        400,
        "BYTES data must hold strings",
        _body({"name": "text", "datatype": "BYTES", "shape": [1], "data": [{"x": 1}]}),
        path="/v2/models/strings/infer",
    ),
    Case(
        "unknown-model",
        404,
        "Request for unknown model: 'nope' is not found",
        _body(_features()),
        path="/v2/models/nope/infer",
    ),
    Case("unknown-model-bad-body", 404, "Request for unknown model: 'nope'", b"{", path="/v2/models/nope/infer"),
    Case(
        "unknown-version",
        404,
        "Request for unknown model: 'mlp' version 7 is not found",
        _body(_features()),
        path="/v2/models/mlp/versions/7/infer",
    ),
    Case(
        "version-zero",
        400,
        "failed to get model version from specified version string '0'",
        _body(_features()),
        path="/v2/models/mlp/versions/0/infer",
    ),
    Case(
        "version-text",
        400,
        "failed to get model version from specified version string 'x'",
        _body(_features()),
        path="/v2/models/mlp/versions/x/infer",
    ),
    Case("get-on-infer", 405, "use POST", method="GET"),
    Case("post-on-metadata", 405, "use GET", b"{}", path="/v2/models/mlp"),
    Case("delete-on-live", 405, "use GET", path="/v2/health/live", method="DELETE"),
    Case(
        "pickle-content-type",
        415,
        "unsupported Content-Type",
        PICKLE,
        headers={"Content-Type": "application/x-python-pickle"},
    ),
    Case(
        "pickle-octet-stream",
        400,
        "not valid JSON",
        PICKLE,
        headers={"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(PICKLE))},
    ),
    Case(
        "gzip-bad-data",
        400,
        "not valid gzip",
        b"\x1f\x8b\x08\x00garbage-not-gzip",
        headers={"Content-Encoding": "gzip"},
    ),
    Case(
        "gzip-bogus-length",
        400,
        "not valid gzip",
        gzip.compress(_body(_features()), mtime=0)[:-4] + b"\xff\xff\xff\x7f",
        headers={"Content-Encoding": "gzip"},
    ),
    Case(
        "gzip-truncated",
        400,
        "truncated gzip",
        gzip.compress(_body(_features()), mtime=0)[:-6],
        headers={"Content-Encoding": "gzip"},
    ),
    Case("encoding-br", 415, "unsupported Content-Encoding", _body(_features()), headers={"Content-Encoding": "br"}),
    Case("unknown-route", 404, "no route", path="/v3/whatever", method="GET"),
    Case("unknown-v2-route", 404, "no route", path="/v2/models/mlp/explode", method="GET"),
    Case("repository-disabled", 403, "disabled", path="/v2/repository/index"),
    Case("name-encoded-dots", 400, "invalid model name", _body(_features()), path="/v2/models/%2e%2e/infer"),
    Case("name-1kib", 400, "invalid model name", _body(_features()), path="/v2/models/" + "a" * 1024 + "/infer"),
    Case("name-leading-dash", 400, "invalid model name", path="/v2/models/-x", method="GET"),
    Case("name-space-dots", 400, "invalid model name", path="/v2/models/%20..", method="GET"),
    Case("name-nul", 400, "invalid model name", path="/v2/models/a%00b", method="GET"),
    Case("name-slash-encoded", 400, "invalid model name", path="/v2/models/..%2fetc/ready", method="GET"),
    Case("name-double-dot-inside", 404, "unknown model: 'a..b'", _body(_features()), path="/v2/models/a..b/infer"),
    Case("name-three-dots-invalid", 400, "invalid model name", path="/v2/models/.../ready", method="GET"),
    Case("name-model..1", 404, "unknown model: 'model..1'", path="/v2/models/model..1/ready", method="GET"),
    Case("metadata-unknown-model", 404, "unknown model", path="/v2/models/nope", method="GET"),
    Case(
        "metadata-unknown-version",
        404,
        "'mlp' version 3 is not found",
        path="/v2/models/mlp/versions/3",
        method="GET",
    ),
    Case("ready-unknown-model", 404, "unknown model", path="/v2/models/nope/ready", method="GET"),
    Case("v1-unknown-model", 404, "unknown model", b'{"instances": [[1]]}', path="/v1/models/nope:predict"),
    Case("v1-malformed", 400, "not valid JSON", b"{", path="/v1/models/mlp:predict"),
    Case("v1-both-keys", 400, "exactly one of", b'{"instances": [], "inputs": []}', path="/v1/models/mlp:predict"),
    Case(
        "v1-wrong-width", 400, "Expected [-1,16], got [1,2]", b'{"instances": [[1, 2]]}', path="/v1/models/mlp:predict"
    ),
    Case("v1-not-numbers", 400, "cannot be read as FP32", b'{"instances": [["x"]]}', path="/v1/models/mlp:predict"),
    Case(
        "v1-unknown-input",
        400,
        "unexpected inference input 'x' for model 'mlp'",
        b'{"inputs": {"x": [1]}}',
        path="/v1/models/mlp:predict",
    ),
    Case("v1-get-predict", 405, "use POST", path="/v1/models/mlp:predict", method="GET"),
]


def _send(client: httpx.Client, server: ServerProcess, case: Case) -> httpx.Response:
    return client.request(case.method, server.url + case.path, content=case.body, headers=case.headers)


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10.0) as c:
        yield c


def _check_error(status: int, body: bytes, case_status: int, expected: str) -> None:
    assert status == case_status, body[:500]
    document = json.loads(body)
    assert set(document) == {"error"}
    assert isinstance(document["error"], str)
    assert expected in document["error"], document["error"]
    assert not LEAK.search(document["error"]), document["error"]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_error_catalogue(client: httpx.Client, server: ServerProcess, case: Case) -> None:
    response = _send(client, server, case)
    _check_error(response.status_code, response.content, case.status, case.error)
    assert response.headers["content-type"] == "application/json"
    assert client.get(server.url + "/v2/health/live").status_code == 200


def test_pickle_is_never_unpickled(client: httpx.Client, server: ServerProcess) -> None:
    for content_type in ("application/x-python-pickle", "application/octet-stream", "application/json", ""):
        headers = {"Content-Type": content_type} if content_type else {}
        for path in ("/v2/models/mlp/infer", "/v1/models/mlp:predict"):
            response = client.post(server.url + path, content=PICKLE, headers=headers)
            assert 400 <= response.status_code < 500
    assert not MARKER.exists()


def _raw(port: int, request: bytes, timeout_s: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes; read one response (Content-Length framed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
        return status, headers, rest


@pytest.mark.parametrize(
    ("path", "status", "expected"),
    [
        ("/v2/models/../ready", 400, "invalid model name"),
        ("/v2/models/./ready", 400, "invalid model name"),
        ("/v2/models/../infer", 400, "invalid model name"),
        ("/v2/models/..", 400, "invalid model name"),
        ("/v2/models/../../etc/passwd", 400, "invalid model name"),
        ("/v1/models/..:predict", 400, "invalid model name"),
        ("/v1/models/../versions/1", 400, "invalid model name"),
        ("/v2/models/..my_model/ready", 400, "invalid model name"),
        ("/v2/models/my..model/ready", 404, "unknown model"),
    ],
)
def test_traversal_names_on_the_wire(server: ServerProcess, path: str, status: int, expected: str) -> None:
    method = "POST" if path.endswith(("infer", "predict")) else "GET"
    body = _body(_features())
    request = (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
    got, _headers, payload = _raw(server.ports["http"], request)
    _check_error(got, payload, status, expected)
    assert httpx.get(server.url + "/v2/health/live").status_code == 200


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: abc\r\n\r\n{}",
        b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -1\r\n\r\n{}",
        b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"GARBAGE\r\n\r\n",
    ],
)
def test_unparseable_http_is_a_json_400(server: ServerProcess, request_bytes: bytes) -> None:
    status, headers, payload = _raw(server.ports["http"], request_bytes)
    assert status == 400
    assert headers["content-type"] == "application/json"
    assert json.loads(payload) == {"error": "invalid HTTP request"}
    assert httpx.get(server.url + "/v2/health/live").status_code == 200


# -- mutated bodies never produce a server fault ----------------------------------------------------

_ANY = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12,
)
_VALID = {"name": "features", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}


@st.composite
def _mutated(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str], bool]:
    """A request, and whether it carries a valid ``timeout`` of its own: a positive integer of
    microseconds, which a request may legitimately outlive (504, the client's own deadline)."""
    node: dict[str, Any] = dict(_VALID)
    document: dict[str, Any] = {"inputs": [node]}
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(["input", "top", "parameters", "outputs"]))
        key = draw(st.sampled_from(["name", "datatype", "shape", "data", "parameters", "id", "inputs", "outputs"]))
        value = draw(_ANY)
        if where == "input":
            node[key] = value
        elif where == "top":
            document[key] = value
        elif where == "parameters":
            document["parameters"] = {draw(st.sampled_from(["priority", "timeout", "binary_data_output"])): value}
        else:
            document["outputs"] = [{"name": value, "parameters": {"binary_data": draw(_ANY)}}]
    body = json.dumps(document).encode()
    headers: dict[str, str] = {}
    if draw(st.booleans()):
        headers["Inference-Header-Content-Length"] = str(len(body))
        body += draw(st.binary(max_size=80))
    path = draw(st.sampled_from(["/v2/models/mlp/infer", "/v2/models/strings/infer", "/v1/models/mlp:predict"]))
    parameters = document.get("parameters")
    timeout = parameters.get("timeout") if isinstance(parameters, dict) else None
    return path, body, headers, type(timeout) is int and timeout > 0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated())
def test_mutated_bodies_never_fault(
    client: httpx.Client, server: ServerProcess, case: tuple[str, bytes, dict[str, str], bool]
) -> None:
    path, body, headers, own_deadline = case
    response = client.post(server.url + path, content=body, headers=headers)
    # A timeout of a few microseconds can pass before the request is dispatched (seen in CI with
    # {"timeout": 1}): the 504 then answers the client's own deadline, not a fault of the server's.
    timed_out = own_deadline and response.status_code == 504 and "exceeded its deadline" in response.text
    assert response.status_code < 500 or response.status_code == 501 or timed_out, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error, str)
        assert not LEAK.search(error), error


def test_405_names_the_allowed_method(client: httpx.Client, server: ServerProcess) -> None:
    assert client.get(server.url + "/v2/models/mlp/infer").headers["allow"] == "POST"
    assert client.post(server.url + "/v2/health/ready").headers["allow"] == "GET, HEAD"
