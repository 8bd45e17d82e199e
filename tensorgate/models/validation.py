"""Checking a decoded request against a model's tensor specs; shared by every protocol."""

from __future__ import annotations

from collections.abc import Mapping

from tensorgate.errors import InvalidInput
from tensorgate.types import Array, DataType, TensorSpec


def _fmt(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def validate_inputs(
    model: str,
    inputs: Mapping[str, Array],
    specs: tuple[TensorSpec, ...],
    max_batch_size: int,
) -> tuple[int, tuple[tuple[int, ...], ...]]:
    """Return (rows, shape key). ``max_batch_size`` 0 means the model has no batch axis."""
    expected = {s.name for s in specs}
    unknown = sorted(set(inputs) - expected)
    if unknown:
        raise InvalidInput(f"unexpected input(s) {unknown} for model '{model}'; expected {sorted(expected)}")
    missing = sorted(expected - set(inputs))
    if missing:
        raise InvalidInput(
            f"expected {len(specs)} inputs but got {len(inputs)} inputs for model '{model}'; "
            f"missing required input(s) {missing}"
        )
    rows: int | None = None
    key: list[tuple[int, ...]] = []
    for spec in specs:
        array = inputs[spec.name]
        got = DataType.from_numpy(array.dtype)
        if got is not spec.datatype:
            raise InvalidInput(
                f"input '{spec.name}' has datatype {got.value}, but model '{model}' expects {spec.datatype.value}"
            )
        shape = tuple(int(d) for d in array.shape)
        if len(shape) != len(spec.shape) or any(
            want != -1 and want != have for want, have in zip(spec.shape, shape, strict=False)
        ):
            raise InvalidInput(
                f"input '{spec.name}' has shape {_fmt(shape)}, but model '{model}' expects {_fmt(spec.shape)}"
            )
        if max_batch_size > 0:
            if rows is None:
                rows = shape[0]
            elif shape[0] != rows:
                raise InvalidInput(
                    f"inputs of model '{model}' disagree on the batch size: "
                    f"'{spec.name}' has {shape[0]} rows, others {rows}"
                )
            key.append(shape[1:])
        else:
            key.append(shape)
    if max_batch_size > 0:
        assert rows is not None
        if rows < 1:
            raise InvalidInput(f"batch size 0 is not allowed for model '{model}'")
        if rows > max_batch_size:
            raise InvalidInput(f"batch size {rows} exceeds the maximum batch size {max_batch_size} of model '{model}'")
    return (rows or 1), tuple(key)


def validate_outputs(model: str, requested: tuple[str, ...], specs: tuple[TensorSpec, ...]) -> None:
    known = {s.name for s in specs}
    unknown = [name for name in requested if name not in known]
    if unknown:
        raise InvalidInput(f"unknown output(s) {unknown} for model '{model}'; expected {sorted(known)}")
    if len(set(requested)) != len(requested):
        raise InvalidInput(f"duplicate output names requested for model '{model}'")
