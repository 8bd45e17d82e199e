"""Checking requests against a version's tensor specs: what passes, and what each refusal says."""

from __future__ import annotations

import numpy as np
import pytest

from tensorgate.errors import InvalidInput
from tensorgate.models.validation import TensorRules
from tensorgate.types import DataType, TensorSpec

IMAGE = TensorSpec("image", DataType.FP32, (-1, 3, -1, 4))
MASK = TensorSpec("mask", DataType.BOOL, (-1, 2))
LABEL = TensorSpec("label", DataType.BYTES, (-1,))
OUTPUTS = (TensorSpec("scores", DataType.FP32, (-1, 10)), TensorSpec("ids", DataType.INT64, (-1,)))


def _rules(max_batch_size: int = 8, inputs: tuple[TensorSpec, ...] = (IMAGE, MASK)) -> TensorRules:
    return TensorRules("m", inputs, OUTPUTS, max_batch_size)


def _inputs(rows: int = 2, height: int = 5) -> dict[str, np.ndarray]:
    return {"image": np.zeros((rows, 3, height, 4), np.float32), "mask": np.zeros((rows, 2), np.bool_)}


def test_rows_and_the_shapes_that_must_match_to_share_a_batch() -> None:
    assert _rules().check_inputs(_inputs(rows=3, height=7)) == (3, ((3, 7, 4), (2,)))


def test_without_a_batch_axis_the_whole_shape_is_the_key() -> None:
    rules = _rules(max_batch_size=0, inputs=(TensorSpec("x", DataType.INT32, (2, -1)),))
    assert rules.check_inputs({"x": np.zeros((2, 9), np.int32)}) == (1, ((2, 9),))


def test_bytes_inputs_are_object_arrays() -> None:
    rules = _rules(inputs=(LABEL,))
    assert rules.check_inputs({"label": np.array([b"a", b"b"], dtype=object)}) == (2, ((),))


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (
            {**_inputs(), "extra": np.zeros(1)},
            "unexpected inference input 'extra' for model 'm'; its inputs are ['image','mask']",
        ),
        (
            {"image": _inputs()["image"]},
            "expected 2 inputs but got 1 inputs for model 'm'. Got inputs ['image'], but missing required "
            "inputs ['mask']. Please provide all required inputs.",
        ),
        (
            {**_inputs(), "mask": np.zeros((2, 2), np.int8)},
            "inference input 'mask' data-type is 'INT8', but model 'm' expects 'BOOL'",
        ),
        (
            {**_inputs(), "image": np.zeros((2, 3, 5), np.float32)},
            "unexpected shape for input 'image' for model 'm'. Expected [-1,3,-1,4], got [2,3,5]",
        ),
        (
            {**_inputs(), "image": np.zeros((2, 1, 5, 4), np.float32)},
            "unexpected shape for input 'image' for model 'm'. Expected [-1,3,-1,4], got [2,1,5,4]",
        ),
        (
            {**_inputs(), "mask": np.zeros((3, 2), np.bool_)},
            "input 'mask' batch size does not match other inputs for 'm' (3 rows, the others 2)",
        ),
        (_inputs(rows=0), "batch size 0 is not allowed for model 'm'"),
        (_inputs(rows=9), "inference request batch-size must be <= 8 for 'm' (got 9)"),
        (
            {},
            "expected 2 inputs but got 0 inputs for model 'm'. Got inputs [], but missing required inputs "
            "['image','mask']. Please provide all required inputs.",
        ),
    ],
)
def test_each_refusal_names_what_is_wrong(inputs: dict[str, np.ndarray], message: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        _rules().check_inputs(inputs)
    assert caught.value.message == message


def test_outputs() -> None:
    rules = _rules()
    rules.check_outputs(())
    rules.check_outputs(("ids", "scores"))
    with pytest.raises(
        InvalidInput, match=r"^unexpected inference output 'nope' for model 'm'; its outputs are \['ids','scores'\]$"
    ):
        rules.check_outputs(("scores", "nope"))
    with pytest.raises(InvalidInput, match=r"^Duplicate output name 'ids' is not allowed in a request$"):
        rules.check_outputs(("ids", "ids"))
