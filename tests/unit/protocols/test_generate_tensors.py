"""The generate extension's tensor form: a JSON body read into a model's inputs as Triton reads it."""

from __future__ import annotations

import numpy as np
import pytest

from tensorgate.errors import InvalidInput
from tensorgate.protocols.http.generate_tensors import generate_request
from tensorgate.types import DataType, TensorSpec

SPECS = (
    TensorSpec("IN", DataType.INT32, (-1,)),
    TensorSpec("WAIT", DataType.UINT32, (1,)),
    TensorSpec("PAIR", DataType.FP32, (-1, 2)),
    TensorSpec("GRID", DataType.FP32, (-1, -1)),
    TensorSpec("TEXT", DataType.BYTES, (-1,)),
)


@pytest.mark.parametrize(
    ("name", "value", "shape"),
    [
        ("IN", [1, 2, 3], (3,)),
        ("IN", 7, (1,)),
        ("IN", [], (0,)),
        ("WAIT", 5, (1,)),
        ("PAIR", [1, 2, 3, 4], (2, 2)),  # the fixed dimension takes 2, the dynamic one the rest
        ("GRID", [1, 2, 3], (1, 3)),  # the innermost dynamic dimension takes all, the others 1
        ("TEXT", ["a", "bc"], (2,)),
    ],
)
def test_inputs_take_tritons_shapes(name: str, value: object, shape: tuple[int, ...]) -> None:
    request = generate_request({name: value}, "m", None, SPECS)
    array = request.inputs[name]
    assert array.shape == shape and array.dtype == dict((s.name, s.datatype) for s in SPECS)[name].numpy


def test_values_are_the_datatypes_and_other_keys_are_parameters() -> None:
    request = generate_request(
        {"IN": [1, 2], "TEXT": "hi", "temperature": 0.5, "parameters": {"priority": 1, "timeout": 2000}},
        "m",
        3,
        SPECS,
    )
    assert request.inputs["IN"].tolist() == [1, 2] and request.inputs["TEXT"].tolist() == [b"hi"]
    assert request.parameters == {"temperature": 0.5, "priority": 1, "timeout": 2000}
    assert request.priority == 1 and request.timeout_s == pytest.approx(0.002) and request.version == 3
    assert np.asarray(request.inputs["IN"]).dtype == np.int32


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"WAIT": [1, 2]}, "The schema can not convert input 'WAIT' to tensor with proper shape"),
        ({"PAIR": [1, 2, 3]}, "The schema can not convert input 'PAIR' to tensor with proper shape"),
        ({"IN": [[1], [2]]}, "input 'IN': generate takes a value or a flat list of values"),
        ({"IN": {"a": 1}}, "input 'IN': generate takes a value or a flat list of values"),
        ({"IN": ["x"]}, "input 'IN': data cannot be read as INT32"),
        ({"flag": [1]}, "parameter 'flag' must be a string, a number or a boolean"),
        ({"parameters": [1]}, "'parameters' must be an object"),
        ({"parameters": {"priority": -1}}, "parameter 'priority' must be a non-negative integer"),
    ],
)
def test_what_cannot_be_read_is_refused_saying_why(body: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        generate_request(body, "m", None, SPECS)
    assert caught.value.message.startswith(message)
