"""BYTES tensors in raw form: each element is a 4-byte little-endian length, then its bytes.

One encoding shared by Triton's binary HTTP extension, gRPC ``raw_input_contents`` and the wire
to worker processes, so it lives here, below all of them.
"""

from __future__ import annotations

import struct

import numpy as np

from tensorgate.types import Array

_LENGTH = struct.Struct("<I")


def pack(array: Array) -> bytes:
    parts = []
    for item in array.reshape(-1):
        value = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(_LENGTH.pack(len(value)))
        parts.append(value)
    return b"".join(parts)


def unpack(raw: bytes | memoryview, count: int) -> Array:
    """``count`` elements from ``raw``, which must hold exactly them; ValueError says what is wrong.

    Elements are collected as they are read and the array is made at the end: ``count`` comes from
    the client and must not size an allocation before the data proves it (2**28 object slots are
    2 GiB). Each element consumes at least 4 bytes, so the loop is bounded by the data too.
    """
    view = memoryview(raw)
    items: list[bytes] = []
    offset = 0
    for index in range(count):
        if offset + 4 > len(view):
            raise ValueError(f"BYTES data holds fewer than the {count} elements its shape needs")
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        if offset + length > len(view):
            raise ValueError(f"BYTES element {index} runs past the end of its data")
        items.append(bytes(view[offset : offset + length]))
        offset += length
    if offset != len(view):
        raise ValueError(f"BYTES data holds more than the {count} elements its shape needs")
    out = np.empty(count, dtype=object)
    out[:] = items
    return out
