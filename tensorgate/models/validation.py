"""Checking a decoded request against a model's tensor specs; shared by every protocol.

The messages lead with Triton's words for the same fault (``unexpected shape for input ...``,
``inference request batch-size must be <= 8 for 'simple'``), which clients and scripts written
for Triton look for, and then say what this server expected.
"""

from __future__ import annotations

from collections.abc import Mapping

from tensorgate.errors import InvalidInput
from tensorgate.types import Array, DataType, TensorSpec


def _fmt(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _names(names: list[str]) -> str:
    """``['a','b']``, as Triton lists tensor names."""
    return "[" + ",".join(f"'{name}'" for name in names) + "]"


class TensorRules:
    """A version's input and output specs, prepared once so that checking a request is a few
    comparisons: building the name sets and walking the shapes per request cost ~7 us, about 2 %
    of the event loop's time per request for a small model at 64 clients."""

    def __init__(
        self,
        model: str,
        inputs: tuple[TensorSpec, ...],
        outputs: tuple[TensorSpec, ...],
        max_batch_size: int,
        ragged: frozenset[str] = frozenset(),
    ) -> None:
        self._model = model
        self._names = frozenset(s.name for s in inputs)
        self._outputs = frozenset(s.name for s in outputs)
        self._max_batch_size = max_batch_size  # 0: the model has no batch axis
        # Per input: its spec, and the (axis, size) pairs of its shape that are not dynamic.
        self._checks = [(s, tuple((axis, d) for axis, d in enumerate(s.shape) if d != -1)) for s in inputs]
        # Per ragged input, its dynamic axes past the batch axis: requests that differ only there
        # share a batch (padded to its longest), so they leave the shape key.
        self._ragged = {
            s.name: tuple(axis for axis in range(1, len(s.shape)) if s.shape[axis] == -1)
            for s in inputs
            if s.name in ragged and max_batch_size > 0
        }

    def check_inputs(self, inputs: Mapping[str, Array]) -> tuple[int, tuple[tuple[int, ...], ...]]:
        """Return (rows, shape key): the batch size, and the shapes that must match to share a batch."""
        if inputs.keys() != self._names:
            self._name_error(inputs)
        batched = self._max_batch_size > 0
        rows: int | None = None
        key: list[tuple[int, ...]] = []
        for spec, fixed in self._checks:
            name = spec.name
            array = inputs[name]
            got = DataType.from_numpy(array.dtype)
            if got is not spec.datatype:
                raise InvalidInput(
                    f"inference input '{name}' data-type is '{got.value}', but model '{self._model}' "
                    f"expects '{spec.datatype.value}'"
                )
            shape: tuple[int, ...] = array.shape
            if len(shape) != len(spec.shape) or any(shape[axis] != d for axis, d in fixed):
                raise InvalidInput(
                    f"unexpected shape for input '{name}' for model '{self._model}'. "
                    f"Expected {_fmt(spec.shape)}, got {_fmt(shape)}"
                )
            if not batched:
                key.append(shape)
            elif rows is not None and shape[0] != rows:
                raise InvalidInput(
                    f"input '{name}' batch size does not match other inputs for '{self._model}' "
                    f"({shape[0]} rows, the others {rows})"
                )
            else:
                rows = shape[0]
                free = self._ragged.get(name) if self._ragged else None
                key.append(
                    shape[1:] if free is None else tuple(-1 if a in free else d for a, d in enumerate(shape))[1:]
                )
        if batched:
            assert rows is not None
            if rows < 1:
                raise InvalidInput(f"batch size 0 is not allowed for model '{self._model}'")
            if rows > self._max_batch_size:
                raise InvalidInput(
                    f"inference request batch-size must be <= {self._max_batch_size} for '{self._model}' (got {rows})"
                )
        return (rows or 1), tuple(key)

    def _name_error(self, inputs: Mapping[str, Array]) -> None:
        unknown = sorted(set(inputs) - self._names)
        if unknown:
            others = f" (and {_names(unknown[1:])})" if len(unknown) > 1 else ""
            raise InvalidInput(
                f"unexpected inference input '{unknown[0]}' for model '{self._model}'{others}; "
                f"its inputs are {_names(sorted(self._names))}"
            )
        missing = sorted(self._names - set(inputs))
        raise InvalidInput(
            f"expected {len(self._names)} inputs but got {len(inputs)} inputs for model '{self._model}'. "
            f"Got inputs {_names(sorted(inputs))}, but missing required inputs {_names(missing)}. "
            "Please provide all required inputs."
        )

    def check_outputs(self, requested: tuple[str, ...]) -> None:
        if not requested:
            return
        unknown = [name for name in requested if name not in self._outputs]
        if unknown:
            raise InvalidInput(
                f"unexpected inference output '{unknown[0]}' for model '{self._model}'; "
                f"its outputs are {_names(sorted(self._outputs))}"
            )
        if len(set(requested)) != len(requested):
            twice = next(name for name in requested if requested.count(name) > 1)
            raise InvalidInput(f"Duplicate output name '{twice}' is not allowed in a request")
