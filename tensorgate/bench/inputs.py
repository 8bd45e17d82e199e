"""What each request carries: tensors synthesized from V2 model metadata, or read from a file.

Synthesis follows the model's own description (``GET /v2/models/{m}``): every ``-1`` becomes
``--batch-size`` in the first dimension and 1 elsewhere, unless ``--shape name=dims`` says
otherwise, and values are random of the declared datatype from a seeded generator, so a run
is repeatable. Values are drawn within small ranges because a load test should exercise the
model, not its overflow handling.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# V2 datatype name -> numpy dtype (BYTES is handled apart: object arrays of bytes).
NUMPY_TYPES: dict[str, Any] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """One input as V2 metadata describes it: ``-1`` marks a dynamic dimension."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Tensor:
    """One input of one request, ready to encode for any tensor protocol."""

    name: str
    datatype: str
    array: np.ndarray[Any, Any]


RequestTensors = tuple[Tensor, ...]


def parse_metadata(document: Mapping[str, Any]) -> list[TensorMeta]:
    """The inputs of a V2 model metadata document."""
    inputs = document.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise ValueError("the model metadata lists no inputs")
    metas = []
    for node in inputs:
        name, datatype, shape = node.get("name"), node.get("datatype"), node.get("shape")
        if not isinstance(name, str) or not isinstance(datatype, str) or not isinstance(shape, list):
            raise ValueError(f"cannot read input metadata {node!r}")
        metas.append(TensorMeta(name, datatype.upper(), tuple(int(d) for d in shape)))
    return metas


def parse_shape_override(text: str) -> tuple[str, tuple[int, ...]]:
    """``--shape name=1,3,224,224``."""
    name, sep, dims = text.partition("=")
    try:
        shape = tuple(int(d) for d in dims.split(","))
    except ValueError:
        shape = ()
    if not sep or not name or not shape or any(d < 0 for d in shape):
        raise ValueError(f"cannot read --shape {text!r}: write name=1,3,224,224")
    return name, shape


def concrete_shape(meta: TensorMeta, batch_size: int, overrides: Mapping[str, tuple[int, ...]]) -> tuple[int, ...]:
    """The shape to send: an override as given, else ``-1`` -> batch size first and 1 elsewhere."""
    if meta.name in overrides:
        return overrides[meta.name]
    return tuple((batch_size if i == 0 else 1) if d < 0 else d for i, d in enumerate(meta.shape))


def random_array(datatype: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray[Any, Any]:
    """Random values of ``datatype``: small integers, floats in [-1, 1), short ASCII strings for BYTES."""
    count = math.prod(shape)
    if datatype == "BYTES":
        letters = rng.integers(97, 123, size=(count, 8), dtype=np.uint8)
        return np.array([row.tobytes() for row in letters], dtype=object).reshape(shape)
    if datatype not in NUMPY_TYPES:
        raise ValueError(f"cannot synthesize datatype {datatype}")
    dtype = np.dtype(NUMPY_TYPES[datatype])
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dtype.kind in "ui":
        return rng.integers(0, 100, size=shape).astype(dtype)
    return rng.uniform(-1.0, 1.0, size=shape).astype(dtype)


def synthesize(
    metas: Sequence[TensorMeta],
    batch_size: int,
    overrides: Mapping[str, tuple[int, ...]],
    seed: int,
    variants: int = 1,
) -> list[RequestTensors]:
    """``variants`` distinct requests (cycled by the runner) built from metadata with ``seed``."""
    unknown = set(overrides) - {m.name for m in metas}
    if unknown:
        raise ValueError(f"--shape names unknown input(s) {sorted(unknown)}; the model has {[m.name for m in metas]}")
    rng = np.random.default_rng(seed)
    return [
        tuple(
            Tensor(m.name, m.datatype, random_array(m.datatype, concrete_shape(m, batch_size, overrides), rng))
            for m in metas
        )
        for _ in range(variants)
    ]


def tensors_from_v2(document: Mapping[str, Any]) -> RequestTensors:
    """One request of an ``--input-file``: a V2 inference body whose inputs carry ``data`` (a BYTES input
    may carry ``data_base64`` instead, a list of base64 strings: binary elements such as an encoded
    image have no JSON string of their own)."""
    nodes = document.get("inputs")
    if not isinstance(nodes, list) or not nodes:
        raise ValueError("each request in --input-file needs a non-empty 'inputs' list")
    tensors = []
    for node in nodes:
        try:
            name, datatype, shape = str(node["name"]), str(node["datatype"]).upper(), tuple(node["shape"])
            data = node["data_base64"] if datatype == "BYTES" and "data_base64" in node else node["data"]
        except (KeyError, TypeError):
            raise ValueError("each input in --input-file needs 'name', 'datatype', 'shape' and 'data'") from None
        if datatype == "BYTES" and "data_base64" in node:
            try:
                elements = [base64.b64decode(d, validate=True) for d in np.ravel(data)]
            except (binascii.Error, TypeError, ValueError):
                raise ValueError(f"input {name!r}: data_base64 must hold base64 strings") from None
            array = np.empty(len(elements), dtype=object)
            array[:] = elements
        elif datatype == "BYTES":
            array = np.array([d.encode() if isinstance(d, str) else bytes(d) for d in np.ravel(data)], dtype=object)
        elif datatype in NUMPY_TYPES:
            array = np.asarray(data, dtype=NUMPY_TYPES[datatype])
        else:
            raise ValueError(f"input {name!r}: unsupported datatype {datatype}")
        tensors.append(Tensor(name, datatype, array.reshape(shape)))
    return tuple(tensors)


def load_input_file(document: Any) -> list[dict[str, Any]]:
    """An ``--input-file``: a JSON list of requests, or ``{"requests": [...]}``; each a JSON object."""
    requests = document.get("requests") if isinstance(document, dict) else document
    if not isinstance(requests, list) or not requests or not all(isinstance(r, dict) for r in requests):
        raise ValueError('--input-file must hold a non-empty JSON list of request objects (or {"requests": [...]})')
    return requests
