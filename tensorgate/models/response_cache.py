"""Triton's response cache: a request whose inputs, requested outputs and parameters equal an earlier
one's gets that request's outputs without reaching the scheduler.

One :class:`ResponseCache` per server, least recently used first out, bounded in the bytes of the
outputs it holds (``server.response_cache_bytes``); each model version that enables it
(``response_cache: {enable: true}``) looks up and stores through its own :class:`VersionCache`,
whose key includes a token unique to that loaded copy, so a reload (new weights, new config) never
answers from the old copy's results, and whose entries leave with it when it unloads. Only for
deterministic models: the configuration says so (the LLM backend, which samples, refuses it).

Runs on the event loop. The key is BLAKE2b over the tensors' bytes, whose cost grows with them:
requests whose inputs hold more than ``offload_bytes`` are hashed in a worker thread, as the HTTP
front end decodes bodies that large, so a large tensor never holds the loop (and the health checks
behind it); hashlib releases the GIL while it hashes a large buffer, so the loop keeps serving.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from tensorgate.clock import Clock
from tensorgate.types import Array, InferRequest, InferResponse

# What a request carries for the server rather than the model: never part of the key.
_TRANSPORT_PARAMETERS = frozenset({"priority", "timeout", "binary_data_output"})
_ENTRY_OVERHEAD_BYTES = 256  # the key, the dict and the arrays' headers, roughly, per entry
# Inputs larger than this are hashed off the loop: the HTTP front end's threshold for decoding a
# body in a worker thread, for the same reason (a hand-off costs more than hashing less).
OFFLOAD_BYTES = 8 * 1024 * 1024
_tokens = itertools.count(1)


@dataclass(slots=True)
class _Entry:
    token: int
    outputs: Mapping[str, Array]
    size: int


def entry_bytes(outputs: Mapping[str, Array]) -> int:
    total = _ENTRY_OVERHEAD_BYTES
    for array in outputs.values():
        total += array.nbytes
        if array.dtype == object:  # BYTES: the objects themselves, not their pointers
            total += sum(len(item) if isinstance(item, bytes | str) else 64 for item in array.ravel())
    return total


class ResponseCache:
    """Outputs by request key, least recently used first out, at most ``capacity_bytes`` in all."""

    def __init__(self, capacity_bytes: int, on_change: Callable[[int], None] | None = None) -> None:
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self.evictions = 0
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._on_change = on_change  # the bytes held, after each change (a metrics gauge)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> Mapping[str, Array] | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry.outputs

    def put(self, key: bytes, token: int, outputs: Mapping[str, Array]) -> bool:
        """Keep ``outputs`` (copied, read-only); False when they alone are larger than the cache."""
        size = entry_bytes(outputs)
        if size > self.capacity_bytes:
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self.used_bytes -= old.size
        while self.used_bytes + size > self.capacity_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.used_bytes -= evicted.size
            self.evictions += 1
        kept = {name: _frozen_copy(array) for name, array in outputs.items()}
        self._entries[key] = _Entry(token, kept, size)
        self.used_bytes += size
        if self._on_change is not None:
            self._on_change(self.used_bytes)
        return True

    def drop(self, token: int) -> None:
        """Forget every entry of one loaded copy of a version (it is unloading)."""
        for key in [k for k, entry in self._entries.items() if entry.token == token]:
            self.used_bytes -= self._entries.pop(key).size
        if self._on_change is not None:
            self._on_change(self.used_bytes)


def _frozen_copy(array: Array) -> Array:
    """A copy the cache owns: a slice of a batch's output would keep the whole batch alive."""
    copy = np.array(array, copy=True)
    copy.flags.writeable = False
    return copy


def request_key(request: InferRequest) -> bytes:
    """A digest of everything that decides a deterministic model's answer: each input's name,
    datatype, shape and bytes, the outputs asked for, and the model's parameters."""
    digest = hashlib.blake2b(digest_size=32)
    for name in sorted(request.inputs):
        array = request.inputs[name]
        digest.update(orjson.dumps([name, array.dtype.str, list(array.shape)]))
        if array.dtype == object:
            for item in array.ravel():
                value = item if isinstance(item, bytes) else str(item).encode()
                digest.update(len(value).to_bytes(8, "little"))
                digest.update(value)
        else:
            digest.update(np.ascontiguousarray(array).data)
    outputs = None if request.outputs is None else sorted(request.outputs)
    parameters = {k: v for k, v in request.parameters.items() if k not in _TRANSPORT_PARAMETERS}
    digest.update(orjson.dumps([outputs, parameters], option=orjson.OPT_SORT_KEYS, default=str))
    return digest.digest()


@dataclass(slots=True)
class CacheCounts:
    """Triton's statistics for the cache: lookups that hit and missed, and the time they took."""

    hits: int = 0
    hit_ns: int = 0
    misses: int = 0
    miss_ns: int = 0


def input_bytes(request: InferRequest) -> int:
    """The bytes of a request's inputs (BYTES tensors: their pointers, a lower bound)."""
    return sum(array.nbytes for array in request.inputs.values())


class VersionCache:
    """One loaded copy of a model version's use of the server's cache."""

    def __init__(
        self,
        cache: ResponseCache,
        clock: Clock,
        on_lookup: Callable[[bool], None] | None = None,
        offload_bytes: int = OFFLOAD_BYTES,
    ) -> None:
        self._cache = cache
        self._clock = clock
        self._on_lookup = on_lookup  # metrics: True for a hit
        self._offload_bytes = offload_bytes
        self.token = next(_tokens)
        self.counts = CacheCounts()

    async def infer(
        self,
        request: InferRequest,
        run: Callable[[], Awaitable[InferResponse]],
        model: str,
        version: int,
        *,
        on_hit: Callable[[int], None] | None = None,
        salt: bytes = b"",
    ) -> InferResponse:
        """The cached answer to ``request``, or ``run()``'s, stored. ``on_hit`` gets a hit's
        duration in ns (the version counts it a success); ``salt`` joins the key (a pipeline's
        serving step models)."""
        started = self._clock.now()
        if input_bytes(request) > self._offload_bytes:
            digest = await asyncio.to_thread(request_key, request)
        else:
            digest = request_key(request)
        key = self.token.to_bytes(8, "little") + digest + salt
        found = self._cache.get(key)
        lookup_ns = int((self._clock.now() - started) * 1e9)
        if self._on_lookup is not None:
            self._on_lookup(found is not None)
        if found is not None:
            self.counts.hits += 1
            self.counts.hit_ns += lookup_ns
            if on_hit is not None:
                on_hit(lookup_ns)
            return InferResponse(model, version, found, id=request.id)
        self.counts.misses += 1
        response = await run()
        stored = self._clock.now()
        self._cache.put(key, self.token, response.outputs)
        self.counts.miss_ns += lookup_ns + int((self._clock.now() - stored) * 1e9)
        return response

    def close(self) -> None:
        self._cache.drop(self.token)


def statistics_of(counts: CacheCounts | None) -> dict[str, Any]:
    """The ``cache_hit`` / ``cache_miss`` entries of Triton's inference statistics."""
    if counts is None:
        return {"cache_hit": {"count": 0, "ns": 0}, "cache_miss": {"count": 0, "ns": 0}}
    return {
        "cache_hit": {"count": counts.hits, "ns": counts.hit_ns},
        "cache_miss": {"count": counts.misses, "ns": counts.miss_ns},
    }
