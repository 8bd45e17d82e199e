"""The V1 (TensorFlow Serving / KServe V1) ``:predict`` body: ``instances`` rows or ``inputs`` columns.

V1 carries no datatypes, so values are read as the model's declared input types.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from tensorgate.errors import InvalidInput
from tensorgate.types import Array, DataType, InferRequest, InferResponse, TensorSpec


def _as_array(value: Any, spec: TensorSpec, where: str) -> Array:
    if spec.datatype is DataType.BYTES:
        return _bytes_array(value, where)
    try:
        with np.errstate(over="ignore"):  # a float past the datatype's range becomes +/-inf, as in V2
            return np.array(value, dtype=spec.datatype.numpy)
    except (ValueError, TypeError, OverflowError):
        raise InvalidInput(f"{where} cannot be read as {spec.datatype.value} for input '{spec.name}'") from None


def _bytes_array(value: Any, where: str) -> Array:
    def convert(item: Any) -> Any:
        if isinstance(item, list):
            return [convert(i) for i in item]
        if isinstance(item, dict) and set(item) == {"b64"} and isinstance(item["b64"], str):
            try:
                return base64.b64decode(item["b64"], validate=True)
            except ValueError:  # binascii.Error, or a str with non-ASCII characters
                raise InvalidInput(f"{where}: invalid base64 in 'b64'") from None
        if isinstance(item, str):
            return item.encode("utf-8")
        raise InvalidInput(f'{where}: BYTES values are strings or {{"b64": ...}} objects')

    converted = convert(value)
    try:
        return np.array(converted, dtype=object)
    except ValueError:
        raise InvalidInput(f"{where}: rows of BYTES values must all have the same length") from None


def decode_predict(
    document: dict[str, Any], model: str, version: int | None, specs: tuple[TensorSpec, ...], batched: bool
) -> tuple[InferRequest, bool]:
    """Returns the request and whether the client used ``instances`` (rows) rather than ``inputs``."""
    has_instances, has_inputs = "instances" in document, "inputs" in document
    if has_instances == has_inputs:
        raise InvalidInput("a predict request has exactly one of 'instances' or 'inputs'")
    by_name = {s.name: s for s in specs}
    inputs: dict[str, Array] = {}
    if has_instances:
        rows = document["instances"]
        if not isinstance(rows, list) or not rows:
            raise InvalidInput("'instances' must be a non-empty list")
        if len(specs) == 1 and not (isinstance(rows[0], dict) and specs[0].name in rows[0]):
            array = _as_array(rows, specs[0], "instances")
            if not batched:
                if len(rows) != 1:
                    raise InvalidInput(f"model '{model}' has no batch dimension: send exactly one instance")
                array = array[0]
            inputs[specs[0].name] = array
        else:
            for index, row in enumerate(rows):
                if not isinstance(row, dict):
                    raise InvalidInput(f"instances[{index}] must be an object of named inputs for a multi-input model")
            for spec in specs:
                if any(spec.name not in row for row in rows):
                    raise InvalidInput(f"every instance needs input '{spec.name}'")
                inputs[spec.name] = _as_array([row[spec.name] for row in rows], spec, "instances")
            extra = {k for row in rows for k in row} - set(by_name)
            if extra:
                raise InvalidInput(
                    f"unexpected inference input '{sorted(extra)[0]}' for model '{model}' (in instances); "
                    f"its inputs are {sorted(by_name)}"
                )
    else:
        columns = document["inputs"]
        if isinstance(columns, dict):
            unknown = sorted(set(columns) - set(by_name))
            if unknown:
                raise InvalidInput(
                    f"unexpected inference input '{unknown[0]}' for model '{model}'; its inputs are {sorted(by_name)}"
                )
            for name, value in columns.items():
                inputs[name] = _as_array(value, by_name[name], f"inputs['{name}']")
        else:
            if len(specs) != 1:
                raise InvalidInput(f"this model has {len(specs)} inputs; send 'inputs' as an object of named tensors")
            inputs[specs[0].name] = _as_array(columns, specs[0], "inputs")
    return InferRequest(model=model, version=version, inputs=inputs), has_instances


def _jsonable(array: Array) -> Any:
    if array.dtype == object:
        return (
            np.vectorize(lambda b: b.decode("utf-8", "replace") if isinstance(b, bytes) else str(b), otypes=[object])(
                array
            ).tolist()
            if array.size
            else array.tolist()
        )
    if array.dtype == np.float16:
        array = array.astype(np.float32)
    return array.tolist()


def encode_predict(response: InferResponse, rows: bool) -> dict[str, Any]:
    outputs = response.outputs
    if rows:
        names = list(outputs)
        if len(names) == 1:
            return {"predictions": _jsonable(outputs[names[0]])}
        count = len(next(iter(outputs.values())))
        columns = {name: _jsonable(array) for name, array in outputs.items()}
        return {"predictions": [{name: columns[name][i] for name in names} for i in range(count)]}
    if len(outputs) == 1:
        return {"outputs": _jsonable(next(iter(outputs.values())))}
    return {"outputs": {name: _jsonable(array) for name, array in outputs.items()}}
