"""Warm-up: run samples on every instance before a version turns READY.

The first call of many runtimes pays for allocation, kernel selection or compilation (a speech team
saw 15 ms become 200 ms). Warm-up moves that cost before readiness, so no client pays it.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from tensorgate.config.model_config import WarmupSample
from tensorgate.errors import ModelLoadError
from tensorgate.instances.base import Instance, ModelFailed
from tensorgate.types import Array, DataType, TensorSpec

_SEED = 20240611


def _shape(spec: TensorSpec, batch_size: int, batched: bool) -> tuple[int, ...]:
    dims = [1 if d == -1 else d for d in spec.shape]
    if batched and dims:
        dims[0] = batch_size
    return tuple(dims)


def _synthesize(spec: TensorSpec, shape: tuple[int, ...], kind: str, rng: np.random.Generator) -> Array:
    if spec.datatype is DataType.BYTES:
        return np.full(shape, b"warmup" if kind == "random" else b"", dtype=object)
    if kind == "zeros":
        return np.zeros(shape, dtype=spec.datatype.numpy)
    if spec.datatype is DataType.BOOL:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if spec.datatype.numpy.kind in "iu":
        return rng.integers(0, 8, size=shape).astype(spec.datatype.numpy)
    return rng.standard_normal(size=shape).astype(spec.datatype.numpy)


def _from_file(path: Path, specs: tuple[TensorSpec, ...]) -> dict[str, Array]:
    """A JSON file of ``{"<input>": {"data": [...], "shape": [...]}}`` in the version's directory.

    A BYTES input may give its elements as ``"data_base64": [...]`` instead: binary elements (an
    encoded image) have no JSON string of their own."""
    try:
        document: Any = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ModelLoadError(f"warm-up file {path.name} cannot be read as JSON") from exc
    arrays = {}
    for spec in specs:
        entry = document.get(spec.name) if isinstance(document, dict) else None
        if isinstance(entry, dict) and "data_base64" in entry and spec.datatype is DataType.BYTES:
            array = _base64_elements(entry["data_base64"], path.name, spec.name)
        elif not isinstance(entry, dict) or "data" not in entry:
            raise ModelLoadError(f"warm-up file {path.name} has no data for input '{spec.name}'")
        else:
            array = np.asarray(entry["data"], dtype=spec.datatype.numpy)
        if "shape" in entry:
            array = array.reshape(entry["shape"])
        arrays[spec.name] = array
    return arrays


def _base64_elements(elements: Any, file: str, name: str) -> Array:
    if not isinstance(elements, list) or not all(isinstance(e, str) for e in elements):
        raise ModelLoadError(f"warm-up file {file}: data_base64 of input '{name}' must be a list of strings")
    try:
        decoded = [base64.b64decode(e, validate=True) for e in elements]
    except binascii.Error as exc:
        raise ModelLoadError(f"warm-up file {file}: data_base64 of input '{name}' is not base64 ({exc})") from None
    array = np.empty(len(decoded), dtype=object)
    array[:] = decoded
    return array


# The tensors a model takes that no client sends (a sequence model's controls and state), for a
# sample of this many rows.
Extra = Callable[[int], dict[str, Array]]


def build_sample(
    sample: WarmupSample, specs: tuple[TensorSpec, ...], batched: bool, directory: Path, extra: Extra | None = None
) -> dict[str, Array]:
    if sample.inputs == "file":
        assert sample.file is not None
        path = (directory / sample.file).resolve()
        if directory.resolve() not in path.parents:
            raise ModelLoadError(f"warm-up file {sample.file!r} must lie inside the model directory")
        arrays = _from_file(path, specs)
    else:
        rng = np.random.default_rng(_SEED)
        arrays = {s.name: _synthesize(s, _shape(s, sample.batch_size, batched), sample.inputs, rng) for s in specs}
    if extra is not None:
        first = next(iter(arrays.values()), None)
        rows = first.shape[0] if batched and first is not None and first.ndim else 1
        arrays.update(extra(rows))
    return arrays


async def warm_up(
    instance: Instance,
    samples: list[WarmupSample],
    specs: tuple[TensorSpec, ...],
    batched: bool,
    directory: Path,
    extra: Extra | None = None,
) -> dict[str, Array] | None:
    """Run every sample ``count`` times; returns what the first sample gave (the health probes'
    reference), None when there are no samples."""
    first: dict[str, Array] | None = None
    for sample in samples:
        inputs = build_sample(sample, specs, batched, directory, extra)
        for _ in range(sample.count):
            try:
                outputs = await instance.execute(inputs)
            except ModelFailed as exc:
                raise ModelLoadError(f"warm-up sample '{sample.name}' failed: {exc}") from exc
            if first is None:
                first = outputs
    return first
