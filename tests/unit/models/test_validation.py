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
            "unexpected input(s) ['extra'] for model 'm'; expected ['image', 'mask']",
        ),
        (
            {"image": _inputs()["image"]},
            "expected 2 inputs but got 1 inputs for model 'm'; missing required input(s) ['mask']",
        ),
        (
            {**_inputs(), "mask": np.zeros((2, 2), np.int8)},
            "input 'mask' has datatype INT8, but model 'm' expects BOOL",
        ),
        (
            {**_inputs(), "image": np.zeros((2, 3, 5), np.float32)},
            "input 'image' has shape [2,3,5], but model 'm' expects [-1,3,-1,4]",
        ),
        (
            {**_inputs(), "image": np.zeros((2, 1, 5, 4), np.float32)},
            "input 'image' has shape [2,1,5,4], but model 'm' expects [-1,3,-1,4]",
        ),
        (
            {**_inputs(), "mask": np.zeros((3, 2), np.bool_)},
            "inputs of model 'm' disagree on the batch size: 'mask' has 3 rows, others 2",
        ),
        (_inputs(rows=0), "batch size 0 is not allowed for model 'm'"),
        (_inputs(rows=9), "batch size 9 exceeds the maximum batch size 8 of model 'm'"),
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
        InvalidInput, match=r"unknown output\(s\) \['nope'\] for model 'm'; expected \['ids', 'scores'\]"
    ):
        rules.check_outputs(("scores", "nope"))
    with pytest.raises(InvalidInput, match="duplicate output names requested for model 'm'"):
        rules.check_outputs(("ids", "ids"))
