"""Tensors from and to their wire forms, with no server: shapes, JSON data, raw bytes, BYTES."""

from __future__ import annotations

import struct

import numpy as np
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tensorgate.errors import InvalidInput
from tensorgate.protocols.tensor_codec import (
    from_json_data,
    from_raw,
    parse_datatype,
    parse_length_prefixed,
    parse_shape,
    to_json_data,
    to_raw,
)
from tensorgate.types import DataType

NUMERIC = [d for d in DataType if d is not DataType.BYTES]


def test_parse_datatype() -> None:
    assert parse_datatype("FP16", "x") is DataType.FP16
    for bad in ("FP99", "fp32", None, 3, ["FP32"]):
        with pytest.raises(InvalidInput, match="input 'x': unknown datatype"):
            parse_datatype(bad, "x")


def test_parse_shape_counts_elements() -> None:
    assert parse_shape([2, 3, 4], "x", 100) == ((2, 3, 4), 24)
    assert parse_shape([], "x", 100) == ((), 1)
    assert parse_shape([0, 5], "x", 100) == ((0, 5), 0)


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ([16, 2**60 + 2], "exceed the maximum size"),
        ([2**62, 2**62, 2**62], "exceed the maximum size"),
        ([0, 2**62], "exceed the maximum size"),  # empty, but numpy cannot shape it
        ([2, -5], "negative dimension"),
        ([-1], "negative dimension"),
        ([1.0, 2], "list of integers"),
        ([True, 2], "list of integers"),
        ("2,3", "list of integers"),
        (None, "list of integers"),
        ([1] * 33, "at most 32"),
    ],
)
def test_parse_shape_rejects(shape: object, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        parse_shape(shape, "x", 1 << 28)


def test_parse_shape_limit_is_inclusive() -> None:
    assert parse_shape([4, 4], "x", 16)[1] == 16
    with pytest.raises(InvalidInput, match="exceed"):
        parse_shape([17], "x", 16)


@pytest.mark.parametrize("datatype", NUMERIC)
def test_json_data_flat_and_nested(datatype: DataType) -> None:
    values = [[1, 0, 1], [0, 1, 1]]
    nested = from_json_data(values, datatype, (2, 3), 6, "x")
    flat = from_json_data([v for row in values for v in row], datatype, (2, 3), 6, "x")
    assert nested.dtype == datatype.numpy
    assert nested.shape == (2, 3)
    np.testing.assert_array_equal(nested, flat)


def test_json_data_errors() -> None:
    with pytest.raises(InvalidInput, match="needs 4 elements, but data holds 3"):
        from_json_data([1, 2, 3], DataType.FP32, (2, 2), 4, "x")
    with pytest.raises(InvalidInput, match="cannot be read as FP32"):
        from_json_data([[1, 2], [3]], DataType.FP32, (3,), 3, "x")
    with pytest.raises(InvalidInput, match="cannot be read as FP32"):
        from_json_data(["a"], DataType.FP32, (1,), 1, "x")
    with pytest.raises(InvalidInput, match="cannot be read as UINT8"):
        from_json_data([300], DataType.UINT8, (1,), 1, "x")
    with pytest.raises(InvalidInput, match="data must be a list"):
        from_json_data({"a": 1}, DataType.FP32, (1,), 1, "x")


def test_json_data_too_deep_is_400_not_a_crash() -> None:
    deep: object = [1.0]
    for _ in range(100):
        deep = [deep]
    with pytest.raises(InvalidInput):
        from_json_data(deep, DataType.FP32, (1,), 1, "x")
    with pytest.raises(InvalidInput, match="deeper than 32"):
        from_json_data(deep, DataType.BYTES, (1,), 1, "x")


def test_bytes_from_json() -> None:
    array = from_json_data([["a", "é"], ["", "z"]], DataType.BYTES, (2, 2), 4, "x")
    assert array.dtype == object
    assert array.tolist() == [[b"a", "é".encode()], [b"", b"z"]]
    with pytest.raises(InvalidInput, match="BYTES data must hold strings"):
        from_json_data([None], DataType.BYTES, (1,), 1, "x")


@pytest.mark.parametrize("datatype", NUMERIC)
def test_raw_round_trip(datatype: DataType) -> None:
    array = np.arange(6).reshape(2, 3).astype(datatype.numpy)
    raw = to_raw(array, datatype)
    assert len(raw) == 6 * datatype.itemsize
    back = from_raw(raw, datatype, (2, 3), 6, "x")
    assert back.dtype == datatype.numpy
    np.testing.assert_array_equal(back, array)


def test_raw_is_little_endian() -> None:
    big = np.array([1, 2], dtype=">i4")
    assert to_raw(big, DataType.INT32) == struct.pack("<2i", 1, 2)
    assert from_raw(struct.pack("<2i", 1, 2), DataType.INT32, (2,), 2, "x").tolist() == [1, 2]


def test_raw_size_mismatch() -> None:
    with pytest.raises(InvalidInput, match=r"byte size mismatch for input 'x'.*needs 16 bytes, got 12"):
        from_raw(b"\0" * 12, DataType.FP32, (2, 2), 4, "x")


def test_length_prefixed_bytes() -> None:
    items = [b"a", b"", b"hello"]
    raw = to_raw(np.array(items, dtype=object), DataType.BYTES)
    assert raw == b"".join(struct.pack("<I", len(i)) + i for i in items)
    assert parse_length_prefixed(raw, 3, "x").tolist() == items
    with pytest.raises(InvalidInput, match="fewer than the 4 elements"):
        parse_length_prefixed(raw, 4, "x")
    with pytest.raises(InvalidInput, match="more than the 2 elements"):
        parse_length_prefixed(raw, 2, "x")
    with pytest.raises(InvalidInput, match="runs past the end"):
        parse_length_prefixed(struct.pack("<I", 2**32 - 1) + b"ab", 1, "x")
    with pytest.raises(InvalidInput, match="fewer than"):
        parse_length_prefixed(b"\x01\x00", 1, "x")


def test_json_output_policy_for_non_finite_floats() -> None:
    """JSON outputs: NaN and +/-Inf become null (strict parsers accept them); FP16 is written as FP32."""
    array = np.array([np.nan, np.inf, -np.inf, 0.5], dtype=np.float16)
    encoded = orjson.dumps(to_json_data(array, DataType.FP16), option=orjson.OPT_SERIALIZE_NUMPY)
    assert orjson.loads(encoded) == [None, None, None, 0.5]
    for dtype, datatype in ((np.float32, DataType.FP32), (np.float64, DataType.FP64)):
        values = np.array([[np.nan], [1.0]], dtype=dtype)
        assert orjson.loads(orjson.dumps(to_json_data(values, datatype), option=orjson.OPT_SERIALIZE_NUMPY)) == [
            None,
            1.0,
        ]


def test_json_output_bytes_are_text() -> None:
    array = np.array([b"ok", "\u00e9".encode(), b"\xff"], dtype=object)
    assert to_json_data(array, DataType.BYTES) == ["ok", "\u00e9", "\ufffd"]


@given(hnp.arrays(dtype=st.sampled_from([np.float32, np.float64, np.float16]), shape=hnp.array_shapes(max_dims=3)))
def test_raw_floats_are_bit_exact(array: np.ndarray) -> None:
    datatype = DataType.from_numpy(array.dtype)
    back = from_raw(to_raw(array, datatype), datatype, array.shape, array.size, "x")
    assert back.tobytes() == np.ascontiguousarray(array).tobytes()


@given(st.lists(st.binary(max_size=20), max_size=10))
def test_bytes_round_trip(items: list[bytes]) -> None:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    raw = to_raw(array, DataType.BYTES)
    assert parse_length_prefixed(raw, len(items), "x").tolist() == items


def test_huge_bytes_count_is_refused_before_allocation() -> None:
    """A BYTES shape of 2**28 elements with 4 bytes of data must not allocate 2 GiB of object slots."""
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(InvalidInput, match="fewer than the 268435456 elements"):
            parse_length_prefixed(struct.pack("<I", 0), 1 << 28, "x")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
