"""Ragged batching: requests whose inputs differ only in a dynamic axis past the batch axis share a
batch, padded to that batch's longest (never further), and each request gets back exactly what it
would have alone. Property-tested over random requests with hypothesis."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tensorgate.config.model_config import ModelConfig
from tensorgate.errors import InternalError, ModelLoadError
from tensorgate.instances.batch_tensors import merge_inputs, split_outputs
from tensorgate.instances.wire import Region, read_tensors, write_batch
from tensorgate.models.specs import resolve_specs
from tensorgate.models.validation import TensorRules
from tensorgate.types import DataType, TensorSpec

IDS = TensorSpec("ids", DataType.INT64, (-1, -1))
MASK = TensorSpec("mask", DataType.INT64, (-1, -1))
HIDDEN = TensorSpec("hidden", DataType.FP32, (-1, -1, 3))
LOGITS = TensorSpec("logits", DataType.FP32, (-1, 2))

# One request: rows, its sequence length; a batch: up to 8 of them.
requests = st.lists(st.tuples(st.integers(1, 3), st.integers(1, 40)), min_size=1, max_size=8)


def _request(rows: int, length: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "ids": rng.integers(1, 1000, (rows, length)).astype(np.int64),
        "mask": np.ones((rows, length), np.int64),
    }


def _model(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Padding-invariant like a masked encoder: per position a value of the token (zero where
    masked), and a pooled output that counts only unmasked tokens."""
    ids, mask = inputs["ids"].astype(np.float32), inputs["mask"].astype(np.float32)
    hidden = np.stack([ids * mask, ids * mask * 2, mask], axis=-1)
    pooled = np.stack([(ids * mask).sum(1), mask.sum(1)], axis=-1)
    return {"hidden": hidden.astype(np.float32), "logits": pooled.astype(np.float32)}


@given(requests)
@settings(max_examples=150, deadline=None)
def test_a_ragged_batch_pads_to_its_longest_and_answers_each_request_as_alone(shape: list[tuple[int, int]]) -> None:
    parts = [_request(rows, length, seed) for seed, (rows, length) in enumerate(shape)]
    merged = merge_inputs(parts, {"ids": 0, "mask": 0})
    longest = max(length for _, length in shape)
    assert merged["ids"].shape == (sum(rows for rows, _ in shape), longest)  # the batch's longest, no more
    row = 0
    for part, (rows, length) in zip(parts, shape, strict=True):
        assert np.array_equal(merged["ids"][row : row + rows, :length], part["ids"])
        assert not merged["ids"][row : row + rows, length:].any()  # the rest is the pad value
        assert not merged["mask"][row : row + rows, length:].any()
        row += rows
    answers = split_outputs(_model(merged), [rows for rows, _ in shape])
    for part, answer, (_, length) in zip(parts, answers, shape, strict=True):
        alone = _model(part)
        assert np.array_equal(answer["logits"], alone["logits"])
        # The per-position output is cut back per request by the version (ModelVersion._submit_cut).
        assert np.array_equal(answer["hidden"][:, :length], alone["hidden"])


@given(requests)
@settings(max_examples=60, deadline=None)
def test_a_worker_process_batch_is_laid_out_the_same_in_shared_memory(shape: list[tuple[int, int]]) -> None:
    parts = [_request(rows, length, seed) for seed, (rows, length) in enumerate(shape)]
    region = Region.create("test-ragged", 1 << 16)
    try:
        described = write_batch(region, parts, {"ids": 0, "mask": 0})
        laid_out = read_tensors(region, described, copy=True)
    finally:
        region.close()
    expected = merge_inputs(parts, {"ids": 0, "mask": 0})
    assert laid_out.keys() == expected.keys()
    for name in expected:
        assert np.array_equal(laid_out[name], expected[name])


@given(st.lists(st.integers(1, 50), min_size=2, max_size=6))
def test_only_the_ragged_axes_leave_the_shape_key(lengths: list[int]) -> None:
    ragged = TensorRules("m", (IDS, MASK), (LOGITS,), 8, frozenset({"ids", "mask"}))
    strict = TensorRules("m", (IDS, MASK), (LOGITS,), 8)
    keys = {ragged.check_inputs(_request(1, n, 0))[1] for n in lengths}
    assert len(keys) == 1  # every length may share a batch
    strict_keys = {strict.check_inputs(_request(1, n, 0))[1] for n in lengths}
    assert len(strict_keys) == len(set(lengths))  # without ragged, each length batches apart


def test_a_fixed_axis_still_splits_batches_of_a_ragged_input() -> None:
    spec = TensorSpec("frames", DataType.FP32, (-1, -1, 4))
    rules = TensorRules("m", (spec,), (LOGITS,), 8, frozenset({"frames"}))
    _, short = rules.check_inputs({"frames": np.zeros((1, 3, 4), np.float32)})
    _, long = rules.check_inputs({"frames": np.zeros((2, 9, 4), np.float32)})
    assert short == long == ((-1, 4),)


def test_parts_of_other_shapes_without_a_pad_value_are_refused() -> None:
    parts = [_request(1, 3, 0), _request(1, 5, 1)]
    with pytest.raises(ValueError):  # numpy's own: nothing may pad an input that is not ragged
        merge_inputs(parts)
    region = Region.create("test-ragged", 1 << 12)
    try:
        with pytest.raises(InternalError, match="without a pad value"):
            write_batch(region, parts)
    finally:
        region.close()


def _config(text: str) -> ModelConfig:
    import yaml

    return ModelConfig.model_validate(yaml.safe_load(text))


RAGGED = """
max_batch_size: 8
inputs:
  - {name: ids, datatype: INT64, shape: [-1, -1], ragged: {pad_value: 0}}
  - {name: mask, datatype: INT64, shape: [-1, -1], ragged: {pad_value: 0}}
outputs:
  - {name: hidden, datatype: FP32, shape: [-1, -1, 3], ragged: {input: ids}}
  - {name: logits, datatype: FP32, shape: [-1, 2]}
"""


def test_the_configuration_resolves_to_the_inputs_and_each_outputs_cut() -> None:
    config = _config(RAGGED)
    assert config.ragged_pads() == {"ids": 0.0, "mask": 0.0}
    specs = resolve_specs("m", (IDS, MASK), (HIDDEN, LOGITS), config)
    assert specs.ragged_inputs == frozenset({"ids", "mask"})
    assert specs.ragged_outputs == (("hidden", "ids", (1,)),)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("inputs: [{name: x, datatype: FP32, shape: [-1, 4], ragged: {}}]", "no dynamic axis past the batch axis"),
        ("inputs: [{name: x, datatype: BYTES, shape: [-1, -1], ragged: {}}]", "holds numbers"),
        ("inputs: [{name: x, datatype: FP32, shape: [-1, -1], ragged: {input: x}}]", "ragged.input is for outputs"),
        (
            "inputs: [{name: x, datatype: FP32, shape: [-1, -1]}]\n"
            "outputs: [{name: y, datatype: FP32, shape: [-1, -1], ragged: {input: x}}]",
            "must name a ragged input",
        ),
    ],
)
def test_a_ragged_key_that_cannot_work_is_refused(text: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        _config(text)


def test_a_model_that_fixes_the_axis_cannot_be_ragged() -> None:
    fixed = TensorSpec("ids", DataType.INT64, (-1, 16))
    config = _config("inputs: [{name: ids, datatype: INT64, shape: [-1, -1], ragged: {pad_value: 0}}]")
    with pytest.raises(ModelLoadError):  # the model's 16 narrows the declared -1 first
        resolve_specs("m", (fixed,), (LOGITS,), config)
