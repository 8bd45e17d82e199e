"""The KV caches of the sequences a runner is generating.

A sequence being prefilled owns a cache of its own; once it decodes it joins the decode batch, one
left-padded cache for all decoding sequences (:class:`DecodeBatch`), so every decode step is one
forward for all of them. Rows join (left-padded to the batch length) and leave between steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

# One layer's cached keys and values, (rows, heads, positions, head_dim) each.
LayerKV = tuple[torch.Tensor, torch.Tensor]

# Spare columns in the decode batch's slab: appends write in place until they run out.
_SPARE_COLUMNS = 64


class SlabLayer(DynamicLayer):  # type: ignore[misc]
    """A cache layer whose keys and values sit in a preallocated slab with spare columns.

    HF's DynamicLayer concatenates on every step, copying the whole batch's cache each time: a copy
    that grows with the batch and its length, so that with many sequences it outweighs the step's
    own work. Here an append writes the new column in place; the slab grows rarely.
    ``benchmarks/bench_llm_realistic.py`` measures decoding with it.

    Keys are stored transposed, (rows, heads, head_dim, positions), and shown as the usual
    (rows, heads, positions, head_dim) view. Attention multiplies queries by the keys' transpose,
    and a batched matmul over these small matrices runs faster when that operand is contiguous
    along positions.
    """

    def __init__(self, keys_t: torch.Tensor, values: torch.Tensor, length: int) -> None:
        """Adopt slabs ``keys_t`` (rows, heads, head_dim, capacity) and ``values`` (rows, heads,
        capacity, head_dim) whose first ``length`` positions are filled."""
        super().__init__()
        self.keys_t = keys_t
        self.slab_values = values
        self.filled = length
        self.device = keys_t.device
        self.is_initialized = True
        self._expose()

    def _expose(self) -> None:
        self.keys = self.keys_t[..., : self.filled].transpose(2, 3)
        self.values = self.slab_values[:, :, : self.filled]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = key_states.shape[-2]
        kt, v = self.keys_t, self.slab_values
        if self.filled + n > v.shape[2]:
            grow = max(n, _SPARE_COLUMNS, v.shape[2] // 4)
            kt = self.keys_t = torch.cat([kt, kt.new_empty((*kt.shape[:3], grow))], dim=3)
            v = self.slab_values = torch.cat([v, v.new_empty((*v.shape[:2], grow, v.shape[3]))], dim=2)
        kt[..., self.filled : self.filled + n] = key_states.transpose(2, 3)
        v[:, :, self.filled : self.filled + n] = value_states
        self.filled += n
        self._expose()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return int(self.filled)


@dataclass(slots=True)
class DecodeBatch:
    """The left-padded cache of every decoding sequence: row ``i`` belongs to ``rows[i]``."""

    rows: list[int | None]  # None: a departed row, compacted away later
    cache: Cache
    mask: torch.Tensor  # (rows, padded length), 1 where a real token is cached
    live: set[int] = field(default_factory=set)  # the rows that are not None
    # Row ranges for attention, found at the batch's first step (~70 us for 100 rows). Every row
    # then grows by a token a step, so the best split stays put; departures only shrink needs.
    ranges: list[tuple[int, int]] | None = None

    def extract(self, row: int) -> DynamicCache:
        """A copy of one row's cache, without its padding: the sequence leaves the batch alive."""
        length = int(self.mask[row].sum())
        width = self.mask.shape[1]
        kv = [
            (k[row : row + 1, :, width - length :], v[row : row + 1, :, width - length :])
            for k, v in layers_of(self.cache)
        ]
        return cache_of([(k.clone(), v.clone()) for k, v in kv])


def new_cache(num_layers: int | None) -> Cache:
    """An empty cache: transformers' own, or plain layers for the lean forward's ``num_layers``."""
    if num_layers is None:
        return DynamicCache()
    return Cache(layers=[DynamicLayer() for _ in range(num_layers)])


def layers_of(cache: Cache) -> list[LayerKV]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def cache_of(kv: list[LayerKV]) -> DynamicCache:
    return DynamicCache(ddp_cache_data=kv)


def rebuild(batch: DecodeBatch | None, joining: list[tuple[int, list[LayerKV]]], num_layers: int) -> DecodeBatch:
    """A new decode batch: the live rows of ``batch`` and the ``joining`` sequences (each with its
    own cache's layers), longest first, in new slabs.

    Each row's keys and values are copied once, into place. (Padding every part, concatenating,
    reordering and copying the result into slabs copied the whole batch four times a join, and
    while requests arrive a few at a time sequences join at most steps.)
    """
    # (cached length, sequence, row in the old batch or -1, its own cache's layers when joining)
    entries: list[tuple[int, int, int, list[LayerKV] | None]] = []
    if batch is not None:
        lengths = batch.mask.sum(dim=1).tolist()
        entries += [(int(lengths[i]), s, i, None) for i, s in enumerate(batch.rows) if s is not None]
    entries += [(int(kv[0][0].shape[2]), seq_id, -1, kv) for seq_id, kv in joining]
    # Longest first, so that decode steps can give ranges of shorter rows fewer key columns
    # (every row then grows by one token a step, which keeps the order until the next rebuild).
    entries.sort(key=lambda e: -e[0])
    width = entries[0][0]
    runs = _runs([(k, e[2]) for k, e in enumerate(entries) if e[3] is None])
    layers = []
    for index in range(num_layers):
        kt, v = _empty_slabs(batch, entries, index, width)
        if runs:  # the old batch's rows keep their order: a slice copy per run of them
            old = batch.cache.layers[index]  # type: ignore[union-attr]
            cols = min(old.filled, width)
            for first, source, count in runs:
                rows_in = slice(source, source + count)
                _right_align(
                    kt,
                    v,
                    slice(first, first + count),
                    width,
                    old.keys_t[rows_in, :, :, old.filled - cols : old.filled],
                    old.slab_values[rows_in, :, old.filled - cols : old.filled],
                )
        for k, (_, _, _, own) in enumerate(entries):
            if own is not None:
                keys, values = own[index]
                _right_align(kt, v, slice(k, k + 1), width, keys.transpose(2, 3), values)
        layers.append(SlabLayer(kt, v, width))
    device = layers[0].device
    starts = width - torch.tensor([e[0] for e in entries], device=device)
    mask = (torch.arange(width, device=device)[None, :] >= starts[:, None]).long()
    rows: list[int | None] = [e[1] for e in entries]
    return DecodeBatch(rows, Cache(layers=layers), mask, {e[1] for e in entries})


def _empty_slabs(
    batch: DecodeBatch | None, entries: list[Any], index: int, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Slabs for layer ``index``, not yet written (the caller zeroes every padding column: a NaN
    there would reach real rows through 0 x NaN)."""
    if batch is not None:
        old = batch.cache.layers[index]
        keys_t, values = old.keys_t, old.slab_values
        heads, key_dim, value_dim = keys_t.shape[1], keys_t.shape[2], values.shape[3]
    else:
        keys_t, values = next(e[3] for e in entries if e[3] is not None)[index]
        heads, key_dim, value_dim = keys_t.shape[1], keys_t.shape[3], values.shape[3]
    rows, capacity = len(entries), width + _SPARE_COLUMNS
    return keys_t.new_empty((rows, heads, key_dim, capacity)), values.new_empty((rows, heads, capacity, value_dim))


def _runs(pairs: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(destination, source) row pairs, both increasing, as runs (first destination, first source, count)."""
    runs: list[tuple[int, int, int]] = []
    for dst, src in pairs:
        if runs and runs[-1][0] + runs[-1][2] == dst and runs[-1][1] + runs[-1][2] == src:
            first, source, count = runs[-1]
            runs[-1] = (first, source, count + 1)
        else:
            runs.append((dst, src, 1))
    return runs


def _right_align(
    kt: torch.Tensor, v: torch.Tensor, rows: slice, width: int, keys_t: torch.Tensor, values: torch.Tensor
) -> None:
    """Write ``rows`` of a slab pair filled to ``width``: ``keys_t`` (rows, heads, head_dim, n) and
    ``values`` (rows, heads, n, head_dim) in the last n positions, zeros before them."""
    start = width - keys_t.shape[3]
    kt[rows, :, :, :start] = 0
    v[rows, :, :start] = 0
    kt[rows, :, :, start:width] = keys_t
    v[rows, :, start:width] = values
