"""Tensors from and to their wire forms: JSON data lists and raw little-endian bytes.

Shared by HTTP (V2 JSON, Triton's binary extension, V1) and gRPC (typed contents and raw contents).
Every size comes from the client, so each is checked before memory is allocated: element counts
are computed with Python integers (no overflow), and raw byte sizes must match exactly.
"""

from __future__ import annotations

import array as pyarray
import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from tensorgate import bytes_elements
from tensorgate.errors import InvalidInput, TooLarge
from tensorgate.types import Array, DataType

_LE = {dt: dt.numpy.newbyteorder("<") for dt in DataType if dt is not DataType.BYTES}

# Flat float lists convert through the stdlib's array module: a third of numpy's time for a small
# list (16 floats: ~1.3 us against ~3.7 us with the overflow guard numpy needs), with the same
# rounding and the same +/-inf past the type's range, and no warning to silence. The codes are
# native-order machine floats, which numpy's float32 and float64 are on every platform we run on.
_FLAT_FLOAT_CODES = {DataType.FP32: "f", DataType.FP64: "d"} if sys.byteorder == "little" else {}


def parse_datatype(name: object, input_name: str) -> DataType:
    try:
        return DataType.parse(name)
    except ValueError as exc:
        raise InvalidInput(f"input '{input_name}': {exc}") from None


def parse_shape(shape: object, input_name: str, max_elements: int) -> tuple[tuple[int, ...], int]:
    """A client-declared shape and its element count, bounded before anything is allocated."""
    if not isinstance(shape, list) or not all(type(d) is int for d in shape):
        raise InvalidInput(f"input '{input_name}': shape must be a list of integers")
    if len(shape) > 32:
        raise InvalidInput(f"input '{input_name}': shape has {len(shape)} dimensions; at most 32 are allowed")
    if any(d < 0 for d in shape):
        raise InvalidInput(f"input '{input_name}': shape {shape} has a negative dimension")
    count = math.prod(shape)
    if count > max_elements:
        raise InvalidInput(
            f"input '{input_name}': shape {shape} causes total element count to exceed the maximum "
            f"size of {max_elements} elements"
        )
    # A zero dimension makes the count 0 whatever the others are, but numpy refuses to shape even an
    # empty array whose other dimensions multiply past its size limit ([0, 2**62]: ValueError).
    if count == 0 and math.prod(d for d in shape if d) > max_elements:
        raise InvalidInput(
            f"input '{input_name}': shape {shape} has dimensions that exceed the maximum size of "
            f"{max_elements} elements"
        )
    return tuple(shape), count


def from_json_data(data: object, datatype: DataType, shape: tuple[int, ...], count: int, name: str) -> Array:
    """A JSON ``data`` list (flat or nested, row-major) as an array of ``shape``.

    ``data`` may already be a flat array of the datatype (large bodies, ``http/json_tensors``).
    """
    if isinstance(data, np.ndarray):
        array = data
    elif not isinstance(data, list):
        raise InvalidInput(f"input '{name}': data must be a list")
    elif datatype is DataType.BYTES:
        array = _bytes_from_json(data, name)
    elif (flat := _flat_floats(data, datatype)) is not None:
        array = flat
    else:
        try:
            with np.errstate(over="ignore"):  # a float past the datatype's range becomes +/-inf, as in a cast
                array = np.array(data, dtype=datatype.numpy)
        except (ValueError, TypeError, OverflowError) as exc:
            raise InvalidInput(
                f"input '{name}': data cannot be read as {datatype.value} ({_first_line(exc)})"
            ) from None
    if array.size != count:
        raise InvalidInput(f"input '{name}': shape {list(shape)} needs {count} elements, but data holds {array.size}")
    return array.reshape(shape)


def _flat_floats(data: list[Any], datatype: DataType) -> Array | None:
    """A flat list of numbers as FP32 or FP64; None for anything else (nesting, strings, other
    datatypes), which the general conversion then takes and words the error for."""
    code = _FLAT_FLOAT_CODES.get(datatype)
    if code is None:
        return None
    try:
        return np.frombuffer(pyarray.array(code, data), dtype=datatype.numpy)
    except TypeError:
        return None


def _bytes_from_json(data: list[Any], name: str) -> Array:
    flat: list[bytes] = []
    stack: list[Any] = [iter(data)]
    while stack:  # iterative flatten: nesting depth in a request cannot exhaust the Python stack
        try:
            item = next(stack[-1])
        except StopIteration:
            stack.pop()
            continue
        if isinstance(item, list):
            if len(stack) > 32:
                raise InvalidInput(f"input '{name}': data is nested deeper than 32 levels")
            stack.append(iter(item))
        elif isinstance(item, str):
            flat.append(item.encode("utf-8"))
        elif isinstance(item, bool | int | float):
            flat.append(str(item).encode())
        else:
            raise InvalidInput(f"input '{name}': BYTES data must hold strings")
    array = np.empty(len(flat), dtype=object)
    array[:] = flat
    return array


def from_raw(raw: bytes | memoryview, datatype: DataType, shape: tuple[int, ...], count: int, name: str) -> Array:
    """Raw tensor bytes (little-endian, row-major; BYTES as 4-byte length prefixes) as an array."""
    if datatype is DataType.BYTES:
        return parse_length_prefixed(raw, count, name).reshape(shape)
    expected = count * datatype.itemsize
    if len(raw) != expected:
        raise InvalidInput(
            f"input byte size mismatch for input '{name}': shape {list(shape)} of {datatype.value} "
            f"needs {expected} bytes, got {len(raw)}"
        )
    array = np.frombuffer(raw, dtype=_LE[datatype], count=count)
    if datatype is DataType.BOOL:
        array = array.view(np.bool_)
    return array.reshape(shape)


def parse_length_prefixed(raw: bytes | memoryview, count: int, name: str) -> Array:
    try:
        return bytes_elements.unpack(raw, count)
    except ValueError as exc:
        raise InvalidInput(f"input '{name}': {exc}") from None


def to_raw(array: Array, datatype: DataType) -> bytes:
    if datatype is DataType.BYTES:
        return bytes_elements.pack(array)
    if datatype is DataType.BOOL:
        return np.ascontiguousarray(array, dtype=np.bool_).tobytes()
    return np.ascontiguousarray(array, dtype=_LE[datatype]).tobytes()


def to_json_data(array: Array, datatype: DataType) -> Any:
    """A flat list for JSON, or a contiguous array orjson serializes natively (fast, no Python floats).

    Non-finite floats become ``null`` (orjson's rule): strict JSON parsers accept the answer, and
    clients that need exact NaN or Inf ask for binary outputs.
    """
    if datatype is DataType.BYTES:
        return [
            (item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item)) for item in array.reshape(-1)
        ]
    if datatype is DataType.FP16:
        return np.ascontiguousarray(array.reshape(-1), dtype=np.float32)
    return np.ascontiguousarray(array.reshape(-1))


def check_total_bytes(sizes: Sequence[int], limit: int) -> None:
    total = sum(sizes)
    if total > limit:
        raise TooLarge(f"tensor data of {total} bytes exceeds the limit of {limit} bytes")


def _first_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]
