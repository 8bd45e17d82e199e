"""V2 request and response bodies as pure functions: JSON, Triton's binary extension, limits."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgate.errors import InvalidInput, NotImplementedFeature, PermissionDenied
from tensorgate.protocols.http.v2_codec import (
    DecodeLimits,
    OutputPrefs,
    decode_infer,
    encode_infer,
    loads_object,
    parse_header_length,
)
from tensorgate.types import InferResponse

LIMITS = DecodeLimits()


def _decode(document: dict[str, Any], blob: bytes = b"", limits: DecodeLimits = LIMITS) -> Any:
    head = json.dumps(document).encode()
    return decode_infer(head + blob, len(head) if blob else None, "m", None, limits)


def _nested(depth: int) -> Any:
    node: Any = 0
    for _ in range(depth):
        node = {"k": node}
    return node


def test_parse_header_length() -> None:
    assert parse_header_length(None, 10) is None
    assert parse_header_length("4", 10) == 4
    assert parse_header_length(" 10 ", 10) == 10
    for bad in ("abc", "-1", "1.5", "", "99999999999", "9" * 40):
        with pytest.raises(InvalidInput, match="Inference-Header-Content-Length"):
            parse_header_length(bad, 10)


def test_json_depth_limit_counts_everything_but_tensor_data() -> None:
    loads_object(json.dumps({"parameters": _nested(97)}).encode(), LIMITS)
    with pytest.raises(InvalidInput, match="depth exceeds"):
        loads_object(json.dumps({"parameters": _nested(120)}).encode(), LIMITS)
    with pytest.raises(InvalidInput, match="depth exceeds"):
        loads_object(json.dumps({"a": [[[[[[0]]]]]]}).encode(), DecodeLimits(max_json_depth=5))


def test_loads_object_errors() -> None:
    for raw, message in ((b"{", "not valid JSON"), (b"[]", "must be a JSON object"), (b"NaN", "not valid JSON")):
        with pytest.raises(InvalidInput, match=message):
            loads_object(raw, LIMITS)


def test_decode_json_tensors() -> None:
    request, prefs = _decode(
        {
            "id": "r1",
            "inputs": [
                {"name": "a", "datatype": "FP32", "shape": [2, 2], "data": [[1, 2], [3, 4]]},
                {"name": "s", "datatype": "BYTES", "shape": [1], "data": ["hi"]},
            ],
            "outputs": [{"name": "y", "parameters": {"binary_data": True}}, {"name": "z"}],
            "parameters": {"priority": 2, "timeout": 250_000},
        }
    )
    assert request.id == "r1"
    assert request.inputs["a"].dtype == np.float32
    assert request.inputs["a"].tolist() == [[1, 2], [3, 4]]
    assert request.inputs["s"].tolist() == [b"hi"]
    assert request.outputs == ("y", "z")
    assert request.priority == 2
    assert request.timeout_s == 0.25
    assert prefs.wants_binary("y") and not prefs.wants_binary("z")


def test_decode_binary_tensors() -> None:
    a = np.arange(4, dtype=np.float32)
    text = struct.pack("<I", 2) + b"ok"
    request, _ = _decode(
        {
            "inputs": [
                {"name": "a", "datatype": "FP32", "shape": [4], "parameters": {"binary_data_size": 16}},
                {"name": "s", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": len(text)}},
            ],
            "parameters": {"binary_data_output": True},
        },
        a.tobytes() + text,
    )
    np.testing.assert_array_equal(request.inputs["a"], a)
    assert request.inputs["s"].tolist() == [b"ok"]


@pytest.mark.parametrize(
    ("document", "blob", "message"),
    [
        ({}, b"", "must have an 'inputs' list"),
        ({"inputs": {}}, b"", "must have an 'inputs' list"),
        ({"inputs": [1]}, b"", "must be an object"),
        ({"inputs": [{"datatype": "FP32", "shape": [1], "data": [1]}]}, b"", "needs a 'name'"),
        ({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1]}]}, b"", "neither 'data'"),
        (
            {"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": [1]}] * 2},
            b"",
            "appears more than once",
        ),
        (
            {"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "parameters": {"binary_data_size": 4}}]},
            b"\0" * 8,
            "no input's binary_data_size claims",
        ),
        (
            {"inputs": [{"name": "a", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}}]},
            b"\0" * 4,
            "runs past the end",
        ),
        (
            {
                "inputs": [
                    {"name": "a", "datatype": "FP32", "shape": [1], "data": [1], "parameters": {"binary_data_size": 4}}
                ]
            },
            b"\0" * 4,
            "both 'data' and binary_data_size",
        ),
        (
            {"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": [1]}], "outputs": [{"name": "y"}] * 2},
            b"",
            "Duplicate output name 'y' is not allowed in a request",
        ),
        ({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": [1]}], "id": 3}, b"", "'id' must"),
        (
            {"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": [1]}], "parameters": {"timeout": -1}},
            b"",
            "timeout",
        ),
        (
            {"inputs": [{"name": "a", "datatype": "FP32", "shape": [1], "data": [1]}], "parameters": [1]},
            b"",
            "parameters must be an object",
        ),
    ],
)
def test_decode_errors(document: dict[str, Any], blob: bytes, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        _decode(document, blob)


def test_too_many_inputs() -> None:
    inputs = [{"name": f"i{n}", "datatype": "FP32", "shape": [1], "data": [1]} for n in range(257)]
    with pytest.raises(InvalidInput, match="at most 256"):
        _decode({"inputs": inputs})


def test_shared_memory_without_regions_is_403_and_classification_501() -> None:
    shm = {"name": "a", "datatype": "FP32", "shape": [1], "parameters": {"shared_memory_region": "r"}}
    with pytest.raises(PermissionDenied, match="shared memory is off"):
        _decode({"inputs": [shm]})
    plain = {"name": "a", "datatype": "FP32", "shape": [1], "data": [1]}
    with pytest.raises(NotImplementedFeature):
        _decode({"inputs": [plain], "outputs": [{"name": "y", "parameters": {"classification": 2}}]})


def test_element_limit_applies_before_allocation() -> None:
    with pytest.raises(InvalidInput, match="exceed"):
        _decode(
            {"inputs": [{"name": "a", "datatype": "FP32", "shape": [1000, 1000], "data": [1]}]},
            limits=DecodeLimits(max_elements=1000),
        )


def test_encode_json_and_binary() -> None:
    response = InferResponse(
        model="m",
        version=3,
        outputs={"y": np.array([[1.5, np.nan]], dtype=np.float32), "s": np.array([b"a"], dtype=object)},
        id="r9",
    )
    body, length = encode_infer(response, OutputPrefs())
    assert length is None
    document = json.loads(body)
    assert document == {
        "model_name": "m",
        "model_version": "3",
        "id": "r9",
        "outputs": [
            {"name": "y", "datatype": "FP32", "shape": [1, 2], "data": [1.5, None]},
            {"name": "s", "datatype": "BYTES", "shape": [1], "data": ["a"]},
        ],
    }
    body, length = encode_infer(response, OutputPrefs(binary={"y": True}))
    assert length is not None
    header = orjson.loads(body[:length])
    assert header["outputs"][0]["parameters"] == {"binary_data_size": 8}
    assert body[length:] == np.array([1.5, np.nan], dtype="<f4").tobytes()


_PLAIN_DATA = {
    "FP32": st.floats(-1e6, 1e6, width=32),
    "INT64": st.integers(-(2**40), 2**40),
    "BOOL": st.booleans(),
    "BYTES": st.text(max_size=5),
    "UINT8": st.integers(0, 300),  # past 255 is an error, in both paths
}


@st.composite
def _plain_inputs(draw: st.DrawFn) -> list[dict[str, Any]]:
    nodes = []
    for index in range(draw(st.integers(1, 3))):
        datatype = draw(st.sampled_from(sorted(_PLAIN_DATA)))
        shape = draw(st.lists(st.integers(0, 3), min_size=1, max_size=3))
        count = int(np.prod(shape)) + draw(st.sampled_from([0, 0, 0, 1]))  # sometimes one too many
        data = draw(st.lists(_PLAIN_DATA[datatype], min_size=count, max_size=count))
        name = draw(st.sampled_from([f"in{index}", "in0"]))  # sometimes a duplicate name
        nodes.append({"name": name, "datatype": datatype, "shape": shape, "data": data})
    return nodes


def _outcome(document: dict[str, Any]) -> Any:
    try:
        request, prefs = _decode(document)
    except InvalidInput as exc:
        return exc.message
    inputs = {name: (array.dtype, array.shape, array.tolist()) for name, array in request.inputs.items()}
    return inputs, request.parameters, request.outputs, request.priority, request.timeout_s, request.id, prefs


@settings(max_examples=150, deadline=None)
@given(_plain_inputs())
def test_plain_bodies_decode_as_the_general_path_does(nodes: list[dict[str, Any]]) -> None:
    """Bodies of nothing but inputs take a shorter path; adding an empty "parameters" forces the
    general one. Both must give the same request, or refuse with the same message."""
    assert _outcome({"inputs": nodes}) == _outcome({"inputs": nodes, "parameters": {}})
