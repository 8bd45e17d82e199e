"""A batch's tensors: requests' inputs merged along axis 0 where the batch runs, outputs split back exactly."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from tensorgate.errors import InternalError
from tensorgate.types import Array


def merge_inputs(parts: Sequence[Mapping[str, Array]]) -> dict[str, Array]:
    if len(parts) == 1:
        return dict(parts[0])
    return {name: np.concatenate([p[name] for p in parts], axis=0) for name in parts[0]}


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
