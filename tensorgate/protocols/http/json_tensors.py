"""Large V2 JSON bodies: numeric ``data`` arrays parsed straight into numpy, no Python floats.

An image-sized JSON tensor (150k numbers) costs ~18 ms through orjson and ``numpy.array``, most of
it creating and freeing one Python float per element; simdjson's parser writes the numbers into one
buffer instead (~6 ms). Only the common, unambiguous case takes this path: a body that is one
JSON object whose inputs carry flat arrays of plain numbers of a numeric datatype, every value
representable in that datatype. Anything else (nested or ragged data, booleans, out-of-range
values, invalid JSON) returns None and goes through the general decoder, which owns every error
message, so the fast path never changes what a request means or which error it gets.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import simdjson

from tensorgate.types import DataType

# Below this many bytes the general decoder is as fast and the parse is not worth a second try.
MIN_FAST_BYTES = 64 * 1024

_FLOATS = {DataType.FP16, DataType.FP32, DataType.FP64}
_SIGNED = {DataType.INT8, DataType.INT16, DataType.INT32, DataType.INT64}
_UNSIGNED = {DataType.UINT8, DataType.UINT16, DataType.UINT32, DataType.UINT64}


def loads_with_arrays(raw: bytes) -> dict[str, Any] | None:
    """The document with each input's ``data`` already an array of its datatype, or None.

    Flatness is proven by counting: a flat data array holds no ``[``, so the body's ``[`` count
    equals the number of arrays outside the data plus one per data array. A ``[`` inside a
    string only makes the counts differ, which falls back: never a wrong answer.
    """
    try:
        document = simdjson.Parser().parse(raw)
    except (ValueError, RuntimeError):  # invalid JSON, or deeper than simdjson's own limit
        return None
    if not isinstance(document, simdjson.Object):
        return None
    keys = _unique_keys(document)
    if keys is None:
        return None
    result: dict[str, Any] = {}
    arrays = 0
    for key in keys:
        if key == "inputs":
            inputs = _inputs(document[key])
            if inputs is None:
                return None
            result[key], counted = inputs
        else:
            result[key] = _plain(document[key])
            counted = _count_lists(result[key])
        arrays += counted
    if _count_brackets(raw, stop_after=arrays + 1) != arrays:
        return None
    return result


def _count_brackets(raw: bytes, stop_after: int) -> int:
    """How many ``[`` the body holds, counting no further than ``stop_after``.

    ``bytes.find`` runs on memchr, and the bodies that come here hold a handful of brackets in
    megabytes of digits: 0.1 ms for an image where ``bytes.count`` takes 1.7 ms. The cap keeps a
    nested body (one bracket per row) from turning this into a Python loop per row.
    """
    count = 0
    index = raw.find(b"[")
    while index >= 0 and count < stop_after:
        count += 1
        index = raw.find(b"[", index + 1)
    return count


def _inputs(node: Any) -> tuple[list[Any], int] | None:
    if not isinstance(node, simdjson.Array):
        return None
    inputs: list[Any] = []
    arrays = 1
    for index in range(len(node)):
        item = node[index]
        if not isinstance(item, simdjson.Object):
            return None
        keys = _unique_keys(item)
        if keys is None:
            return None
        converted: dict[str, Any] = {}
        for key in keys:
            if key != "data":
                converted[key] = _plain(item[key])
                arrays += _count_lists(converted[key])
        if "data" in keys:
            data = _numbers(item["data"], converted.get("datatype"))
            if data is None:
                return None
            converted["data"] = data
            arrays += 1
        inputs.append(converted)
    return inputs, arrays


def _numbers(node: Any, datatype_name: object) -> np.ndarray[Any, Any] | None:
    """A flat array of plain numbers as ``datatype``'s array, or None when that is not certain."""
    if not isinstance(node, simdjson.Array) or not isinstance(datatype_name, str):
        return None
    try:
        datatype = DataType.parse(datatype_name)
    except ValueError:
        return None
    dtype = datatype.numpy
    try:
        if datatype in _FLOATS:
            with np.errstate(over="ignore"):  # past the datatype's range: +/-inf, as the general decoder
                return np.frombuffer(node.as_buffer(of_type="d"), dtype=np.float64).astype(dtype)
        if datatype in _SIGNED or datatype in _UNSIGNED:
            signed = datatype in _SIGNED
            raw = node.as_buffer(of_type="i") if signed else node.as_buffer(of_type="u")
            values = np.frombuffer(raw, dtype=np.int64 if signed else np.uint64)
            bounds = np.iinfo(dtype)
            if values.size and (values.min() < bounds.min or values.max() > bounds.max):
                return None
            return values.astype(dtype)
    except (TypeError, ValueError):  # a non-number, or a float where an integer belongs
        return None
    return None


def _unique_keys(node: Any) -> list[str] | None:
    """The object's keys; None when one repeats (simdjson's lookup finds the first, orjson keeps the
    last) or holds a NUL (simdjson looks a key up as a C string, so it cannot find that one)."""
    keys = list(node.keys())
    if len(set(keys)) != len(keys) or any("\x00" in key for key in keys):
        return None
    return keys


def _plain(value: Any) -> Any:
    if isinstance(value, simdjson.Object):
        return value.as_dict()
    if isinstance(value, simdjson.Array):
        return value.as_list()
    return value


def _count_lists(value: Any) -> int:
    count = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            count += 1
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return count
