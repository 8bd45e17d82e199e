"""V1 ``:predict`` bodies as pure functions."""

from __future__ import annotations

import numpy as np
import pytest

from tensorgate.errors import InvalidInput
from tensorgate.protocols.http.v1_codec import decode_predict, encode_predict
from tensorgate.types import DataType, InferResponse, TensorSpec

ONE = (TensorSpec("x", DataType.FP32, (-1, 2)),)
TWO = (TensorSpec("a", DataType.INT64, (-1, 2)), TensorSpec("b", DataType.FP32, (-1,)))


def test_instances_of_one_input() -> None:
    request, rows = decode_predict({"instances": [[1, 2], [3, 4]]}, "m", 2, ONE, True)
    assert rows
    assert request.version == 2
    assert request.inputs["x"].dtype == np.float32
    assert request.inputs["x"].tolist() == [[1, 2], [3, 4]]


def test_instances_for_an_unbatched_model() -> None:
    request, _ = decode_predict({"instances": [[1, 2]]}, "m", None, ONE, False)
    assert request.inputs["x"].shape == (2,)
    with pytest.raises(InvalidInput, match="exactly one instance"):
        decode_predict({"instances": [[1, 2], [3, 4]]}, "m", None, ONE, False)


def test_instances_of_named_inputs() -> None:
    request, _ = decode_predict({"instances": [{"a": [1, 2], "b": 0.5}, {"a": [3, 4], "b": 1.5}]}, "m", None, TWO, True)
    assert request.inputs["a"].dtype == np.int64
    assert request.inputs["b"].tolist() == [0.5, 1.5]
    with pytest.raises(InvalidInput, match="every instance needs input 'b'"):
        decode_predict({"instances": [{"a": [1, 2]}]}, "m", None, TWO, True)
    with pytest.raises(InvalidInput, match="unexpected inference input 'c' for model 'm'"):
        decode_predict({"instances": [{"a": [1, 2], "b": 1, "c": 2}]}, "m", None, TWO, True)
    with pytest.raises(InvalidInput, match="must be an object"):
        decode_predict({"instances": [[1, 2]]}, "m", None, TWO, True)


def test_inputs_as_columns() -> None:
    request, rows = decode_predict({"inputs": {"a": [[1, 2]], "b": [1.0]}}, "m", None, TWO, True)
    assert not rows
    assert set(request.inputs) == {"a", "b"}
    request, _ = decode_predict({"inputs": [[1, 2]]}, "m", None, ONE, True)
    assert request.inputs["x"].tolist() == [[1, 2]]
    with pytest.raises(InvalidInput, match="send 'inputs' as an object"):
        decode_predict({"inputs": [[1, 2]]}, "m", None, TWO, True)
    with pytest.raises(InvalidInput, match="unexpected inference input 'zz' for model 'm'"):
        decode_predict({"inputs": {"zz": [1]}}, "m", None, TWO, True)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({}, "exactly one of"),
        ({"instances": [], "inputs": []}, "exactly one of"),
        ({"instances": []}, "non-empty list"),
        ({"instances": {"x": 1}}, "non-empty list"),
        ({"instances": [["a", "b"]]}, "cannot be read as FP32"),
    ],
)
def test_errors(document: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        decode_predict(document, "m", None, ONE, True)


def test_bytes_and_b64() -> None:
    spec = (TensorSpec("t", DataType.BYTES, (-1,)),)
    request, _ = decode_predict({"instances": ["hi", {"b64": "AAE="}]}, "m", None, spec, True)
    assert request.inputs["t"].tolist() == [b"hi", b"\x00\x01"]
    with pytest.raises(InvalidInput, match="invalid base64"):
        decode_predict({"instances": [{"b64": "!!"}]}, "m", None, spec, True)
    with pytest.raises(InvalidInput, match="BYTES values are strings"):
        decode_predict({"instances": [3]}, "m", None, spec, True)


def test_encode() -> None:
    one = InferResponse("m", 1, {"y": np.array([[1.0, 2.0]], dtype=np.float16)})
    assert encode_predict(one, True) == {"predictions": [[1.0, 2.0]]}
    assert encode_predict(one, False) == {"outputs": [[1.0, 2.0]]}
    two = InferResponse("m", 1, {"y": np.array([1, 2]), "s": np.array([b"a", b"b"], dtype=object)})
    assert encode_predict(two, True) == {"predictions": [{"y": 1, "s": "a"}, {"y": 2, "s": "b"}]}
    assert encode_predict(two, False) == {"outputs": {"y": [1, 2], "s": ["a", "b"]}}


def test_non_finite_outputs_are_null() -> None:
    from tensorgate.protocols.http.v2_codec import dumps

    response = InferResponse("m", 1, {"y": np.array([[np.nan, np.inf, -np.inf, 1.0]], dtype=np.float32)})
    assert dumps(encode_predict(response, True)) == b'{"predictions":[[null,null,null,1.0]]}'
