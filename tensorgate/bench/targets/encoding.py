"""Tensors to the bytes each tensor protocol carries; pure functions, tested without a server.

Raw tensor bytes are little-endian and row-major, and BYTES elements are each prefixed by a
4-byte little-endian length: the layout shared by Triton's binary HTTP extension and gRPC's
``raw_input_contents``.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from tensorgate.bench.inputs import Tensor


def raw_bytes(tensor: Tensor) -> bytes:
    array = tensor.array
    if tensor.datatype == "BYTES":
        parts = []
        for item in array.ravel().tolist():
            value = item if isinstance(item, bytes) else str(item).encode()
            parts.append(struct.pack("<I", len(value)))
            parts.append(value)
        return b"".join(parts)
    if tensor.datatype == "BOOL":
        return np.ascontiguousarray(array, dtype=np.bool_).tobytes()
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()


def json_data(tensor: Tensor) -> list[Any]:
    """Flat row-major values as V2 JSON ``data`` wants them; BYTES as UTF-8 strings."""
    flat = tensor.array.ravel()
    if tensor.datatype == "BYTES":
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in flat.tolist()]
    if tensor.datatype == "FP16":
        return list(flat.astype(np.float32).tolist())
    return list(flat.tolist())


def nested_data(tensor: Tensor) -> Any:
    """Values nested by shape, for V1 ``instances``/``inputs``."""
    if tensor.datatype == "BYTES":
        return np.vectorize(lambda v: v.decode("utf-8", "replace"), otypes=[object])(tensor.array).tolist()
    if tensor.datatype == "FP16":
        return tensor.array.astype(np.float32).tolist()
    return tensor.array.tolist()
