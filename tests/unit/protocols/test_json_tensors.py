"""The simdjson fast path for large V2 JSON bodies: same tensors as the general decoder, or None.

The contract is one-sided: whenever ``loads_with_arrays`` answers, its arrays are bit-identical
to what orjson plus ``numpy.array`` make of the same body; whenever it is not certain it answers
None and the general decoder (which owns every error message) takes over.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgate.errors import InvalidInput
from tensorgate.protocols.http.json_tensors import MIN_FAST_BYTES, loads_with_arrays
from tensorgate.protocols.http.v2_codec import DecodeLimits, decode_infer
from tensorgate.types import DataType

LIMITS = DecodeLimits()


def _body(data: Any, datatype: str = "FP32", **extra: Any) -> bytes:
    count = len(data) if isinstance(data, list) else 1
    document = {"inputs": [{"name": "x", "datatype": datatype, "shape": [count], "data": data}], **extra}
    return orjson.dumps(document)


def _general(body: bytes, datatype: str) -> np.ndarray[Any, Any]:
    with np.errstate(over="ignore"):
        return np.array(orjson.loads(body)["inputs"][0]["data"], dtype=DataType.parse(datatype).numpy)


@pytest.mark.parametrize(
    ("data", "datatype"),
    [
        ([0.1, -2.5, 1e-45, 3.4e38, -0.0, 7, 16777217], "FP32"),
        ([0.1, 1e-300, 1e300, -0.0, 9007199254740993], "FP64"),
        ([0.1, 65504, 1e-8, 70000.0], "FP16"),
        ([-128, 0, 127], "INT8"),
        ([-(2**63), 2**63 - 1], "INT64"),
        ([0, 255], "UINT8"),
        ([0, 2**64 - 1], "UINT64"),
        ([], "FP32"),
    ],
)
def test_flat_numbers_match_the_general_decoder_bit_for_bit(data: list[Any], datatype: str) -> None:
    body = _body(data, datatype)
    document = loads_with_arrays(body)
    assert document is not None
    fast = document["inputs"][0]["data"]
    expected = _general(body, datatype)
    assert fast.dtype == expected.dtype
    assert fast.tobytes() == expected.tobytes()
    assert {k: v for k, v in document["inputs"][0].items() if k != "data"} == {
        "name": "x",
        "datatype": datatype,
        "shape": [len(data)],
    }


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (_body([[1.0, 2.0], [3.0]]), "ragged nesting: the general decoder refuses it"),
        (_body([[1.0, 2.0], [3.0, 4.0]]), "nested: shape checking stays with the general decoder"),
        (_body([1.0, [], [2.0, 3.0]]), "mixed nesting that flattens to the right count"),
        (_body([1.0, True]), "booleans"),
        (_body([1.0, None]), "null"),
        (_body([1.0, "2"]), "a string"),
        (_body([1, 300], "INT8"), "out of the datatype's range"),
        (_body([1, -1], "UINT16"), "negative for an unsigned type"),
        (_body([1.5], "INT32"), "a fraction for an integer type"),
        (_body([True], "BOOL"), "BOOL is not a numeric fast type"),
        (_body(["a"], "BYTES"), "BYTES is not a numeric fast type"),
        (_body([1.0], "FP8"), "an unknown datatype"),
        (_body([1.0], id="a[b"), "a '[' inside a string: the bracket count cannot prove flatness"),
        (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1], "data": [2]}]}', "dup key"),
        (b'{"inputs": [], "inputs": [{"name": "x"}]}', "duplicate top-level key"),
        (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1e400]}]}', "overflowing number"),
        (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [NaN]}]}', "not JSON"),
        (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}', "truncated"),
        (b"[1, 2, 3]", "not an object"),
        (b'{"inputs": ' + b"[" * 250_000 + b"]" * 250_000 + b"}", "deeper than simdjson parses"),
        (b'{"inputs": {"name": "x"}}', "inputs not a list"),
        (b'{"inputs": [7]}', "an input that is not an object"),
    ],
)
def test_anything_uncertain_falls_back(body: bytes, why: str) -> None:
    assert loads_with_arrays(body) is None, why


def test_the_rest_of_the_document_is_plain_python() -> None:
    body = _body(
        [1.0, 2.0],
        id="req-1",
        outputs=[{"name": "y", "parameters": {"binary_data": True}}],
        parameters={"priority": 2, "tags": [1, [2, 3]]},
    )
    document = loads_with_arrays(body)
    assert document is not None
    assert document["id"] == "req-1"
    assert document["outputs"] == [{"name": "y", "parameters": {"binary_data": True}}]
    assert document["parameters"] == {"priority": 2, "tags": [1, [2, 3]]}


_NUMBERS = {
    "FP32": st.floats(allow_nan=False, allow_infinity=False, width=32),
    "FP64": st.floats(allow_nan=False, allow_infinity=False),
    "INT16": st.integers(-(2**15), 2**15 - 1) | st.integers(-(2**20), 2**20),
    "UINT32": st.integers(0, 2**32 - 1) | st.integers(-5, 2**33),
}


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(_NUMBERS)).flatmap(lambda t: st.tuples(st.just(t), st.lists(_NUMBERS[t], max_size=40))))
def test_fast_path_answers_only_what_the_general_decoder_would(case: tuple[str, list[Any]]) -> None:
    datatype, data = case
    body = _body(data, datatype)
    document = loads_with_arrays(body)
    try:
        expected = _general(body, datatype)
    except (OverflowError, ValueError):
        assert document is None  # the general decoder refuses it, so the fast path must not accept it
        return
    if document is not None:
        assert document["inputs"][0]["data"].tobytes() == expected.tobytes()


def test_decode_infer_takes_the_fast_path_for_large_bodies_and_gives_the_same_request() -> None:
    rng = np.random.default_rng(0)
    image = rng.standard_normal((2, 3, 64, 64)).astype(np.float32)
    flat = orjson.dumps(
        {"inputs": [{"name": "image", "datatype": "FP32", "shape": [2, 3, 64, 64], "data": image.ravel().tolist()}]}
    )
    nested = orjson.dumps(
        {"inputs": [{"name": "image", "datatype": "FP32", "shape": [2, 3, 64, 64], "data": image.tolist()}]}
    )
    assert len(flat) > MIN_FAST_BYTES and loads_with_arrays(flat) is not None
    fast, _ = decode_infer(flat, None, "m", None, LIMITS)
    general, _ = decode_infer(nested, None, "m", None, LIMITS)  # nested: the general decoder
    assert fast.inputs["image"].shape == (2, 3, 64, 64)
    assert fast.inputs["image"].tobytes() == general.inputs["image"].tobytes() == image.tobytes()


def test_a_large_body_with_a_bad_value_gets_the_general_error() -> None:
    data: list[Any] = [0.5] * 20000
    data[123] = "oops"
    body = _body(data)
    assert len(body) > MIN_FAST_BYTES
    with pytest.raises(InvalidInput, match="data cannot be read as FP32"):
        decode_infer(body, None, "m", None, LIMITS)


def test_a_large_body_with_the_wrong_count_is_refused() -> None:
    body = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [20001], "data": [0.5] * 20000}]})
    assert len(body) > MIN_FAST_BYTES and loads_with_arrays(body) is not None
    with pytest.raises(InvalidInput, match="needs 20001 elements, but data holds 20000"):
        decode_infer(body, None, "m", None, LIMITS)
