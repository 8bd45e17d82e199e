"""A batch's tensors: requests' inputs merged along axis 0 where the batch runs, outputs split back exactly.

Ragged inputs (``ragged`` in a model's configuration) may differ between requests in their dynamic
axes past the batch axis: merged, each request's rows are padded with the input's pad value to the
batch's longest along those axes, so the batch costs what its own longest request needs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from tensorgate.errors import InternalError
from tensorgate.types import Array


def batch_shape(arrays: Sequence[Array]) -> tuple[int, ...]:
    """The merged shape: the rows added up, every other axis the largest of the parts."""
    first = arrays[0].shape
    if len(arrays) == 1:
        return tuple(first)
    rows = sum(int(a.shape[0]) for a in arrays)
    return (rows, *(max(int(a.shape[axis]) for a in arrays) for axis in range(1, len(first))))


def copy_rows(target: Array, arrays: Sequence[Array], pad: float | None) -> None:
    """Copy each part to its rows of ``target``; where a part is shorter than the batch along an axis,
    the rest of its rows is ``pad``. Without a pad value every part must fill its rows."""
    if any(a.shape[1:] != target.shape[1:] for a in arrays):
        if pad is None:
            shapes = ", ".join(str(list(a.shape)) for a in arrays)
            raise InternalError(f"parts of shapes {shapes} cannot make one batch without a pad value")
        target.fill(pad)
    row = 0
    for array in arrays:
        count = int(array.shape[0])
        np.copyto(target[(slice(row, row + count), *(slice(0, d) for d in array.shape[1:]))], array)
        row += count


def merge_inputs(parts: Sequence[Mapping[str, Array]], pads: Mapping[str, float] | None = None) -> dict[str, Array]:
    """The batch ``parts`` make; ``pads``: the ragged inputs' pad values (see the module's docstring)."""
    if len(parts) == 1:
        return dict(parts[0])
    merged: dict[str, Array] = {}
    for name in parts[0]:
        arrays = [p[name] for p in parts]
        pad = None if pads is None else pads.get(name)
        shape = batch_shape(arrays)
        if pad is None or all(a.shape[1:] == shape[1:] for a in arrays):
            merged[name] = np.concatenate(arrays, axis=0)
            continue
        target = np.empty(shape, dtype=arrays[0].dtype)
        copy_rows(target, arrays, pad)
        merged[name] = target
    return merged


def split_outputs(outputs: Mapping[str, Array], rows: Sequence[int], batched: bool = True) -> list[dict[str, Array]]:
    """Slice each output along axis 0 by each request's row count (views, no copies).

    A model with a batch axis (``batched``) must answer as many rows as it was given, alone or
    batched alike: a request's answer cannot depend on whether it happened to share a batch.
    Without one, each request runs alone and takes the outputs whole.
    """
    if not batched:
        return [dict(outputs)]
    total = sum(rows)
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            got = array.shape[0] if array.ndim else "a scalar"
            raise InternalError(f"the model returned {got} rows of output '{name}' for a batch of {total}")
    if len(rows) == 1:
        return [dict(outputs)]
    results: list[dict[str, Array]] = []
    start = 0
    for count in rows:
        results.append({name: array[start : start + count] for name, array in outputs.items()})
        start += count
    return results
