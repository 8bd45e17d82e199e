"""Input synthesis from V2 metadata, ``--shape`` overrides and ``--input-file`` requests."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensorgate.bench.inputs import (
    NUMPY_TYPES,
    TensorMeta,
    concrete_shape,
    load_input_file,
    parse_metadata,
    parse_shape_override,
    random_array,
    synthesize,
    tensors_from_v2,
)

MLP_METADATA = {
    "name": "mlp",
    "versions": ["1"],
    "platform": "onnxruntime_onnx",
    "inputs": [{"name": "features", "datatype": "FP32", "shape": [-1, 16]}],
    "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 3]}],
}


def test_metadata_to_shapes() -> None:
    metas = parse_metadata(MLP_METADATA)
    assert metas == [TensorMeta("features", "FP32", (-1, 16))]
    (request,) = synthesize(metas, batch_size=4, overrides={}, seed=0)
    (tensor,) = request
    assert tensor.name == "features" and tensor.datatype == "FP32"
    assert tensor.array.shape == (4, 16) and tensor.array.dtype == np.float32


def test_dynamic_dims_beyond_the_first_become_one() -> None:
    meta = TensorMeta("tokens", "INT64", (-1, -1, 8))
    assert concrete_shape(meta, 3, {}) == (3, 1, 8)
    assert concrete_shape(meta, 3, {"tokens": (2, 128, 8)}) == (2, 128, 8)


def test_shape_override_parsing() -> None:
    assert parse_shape_override("image=1,3,224,224") == ("image", (1, 3, 224, 224))
    for bad in ["image", "image=", "=1,2", "image=a,b", "image=-1,2"]:
        with pytest.raises(ValueError, match="--shape"):
            parse_shape_override(bad)


def test_override_for_unknown_input_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown input"):
        synthesize(parse_metadata(MLP_METADATA), 1, {"nope": (1,)}, seed=0)


def test_seed_makes_inputs_repeatable() -> None:
    metas = parse_metadata(MLP_METADATA)
    a = synthesize(metas, 2, {}, seed=5, variants=3)
    b = synthesize(metas, 2, {}, seed=5, variants=3)
    c = synthesize(metas, 2, {}, seed=6, variants=3)
    assert all(np.array_equal(x[0].array, y[0].array) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[0][0].array, c[0][0].array)
    assert not np.array_equal(a[0][0].array, a[1][0].array)  # variants differ


@given(
    st.sampled_from([*NUMPY_TYPES, "BYTES"]),
    st.lists(st.integers(min_value=0, max_value=4), min_size=0, max_size=3),
    st.integers(0, 100),
)
def test_random_array_has_the_datatype_and_shape(datatype: str, shape: list[int], seed: int) -> None:
    array = random_array(datatype, tuple(shape), np.random.default_rng(seed))
    assert array.shape == tuple(shape)
    if datatype == "BYTES":
        assert array.dtype == object
        assert all(isinstance(v, bytes) for v in array.ravel())
    else:
        assert array.dtype == np.dtype(NUMPY_TYPES[datatype])


def test_unsupported_datatype() -> None:
    with pytest.raises(ValueError, match="BF16"):
        random_array("BF16", (1,), np.random.default_rng(0))


def test_input_file_requests() -> None:
    document = {
        "requests": [
            {
                "inputs": [
                    {"name": "features", "datatype": "FP32", "shape": [1, 2], "data": [0.5, 1.5]},
                    {"name": "words", "datatype": "BYTES", "shape": [2], "data": ["a", "bc"]},
                ]
            }
        ]
    }
    (request,) = load_input_file(document)
    features, words = tensors_from_v2(request)
    np.testing.assert_array_equal(features.array, np.array([[0.5, 1.5]], dtype=np.float32))
    assert words.array.tolist() == [b"a", b"bc"]


def test_input_file_must_be_a_list_of_objects() -> None:
    for bad in [{}, [], [1], "x"]:
        with pytest.raises(ValueError, match="--input-file"):
            load_input_file(bad)


def test_input_file_request_needs_every_field() -> None:
    with pytest.raises(ValueError, match="'name', 'datatype', 'shape' and 'data'"):
        tensors_from_v2({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}]})
