"""The response cache as a pure policy: the byte bound holds under any workload, least recently used
goes first, keys tell apart exactly what decides an answer."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgate.clock import MonotonicClock
from tensorgate.config.model_config import ModelConfig
from tensorgate.models.response_cache import ResponseCache, VersionCache, entry_bytes, request_key
from tensorgate.types import InferRequest, InferResponse


def _request(values: object = (1.0, 2.0), **fields: object) -> InferRequest:
    inputs = {"x": np.asarray(values, dtype=np.float32).reshape(1, -1)}
    return InferRequest(model="m", version=None, inputs=inputs, **fields)  # type: ignore[arg-type]


def _outputs(size: int) -> dict[str, np.ndarray]:
    return {"y": np.zeros(size, dtype=np.uint8)}


operations = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 15), st.integers(0, 3000), st.integers(1, 3)),
        st.tuples(st.just("get"), st.integers(0, 15), st.just(0), st.just(0)),
        st.tuples(st.just("drop"), st.just(0), st.just(0), st.integers(1, 3)),
    ),
    max_size=200,
)


@settings(max_examples=300, deadline=None)
@given(capacity=st.integers(0, 8000), ops=operations)
def test_the_byte_bound_holds_under_any_workload(capacity: int, ops: list[tuple[str, int, int, int]]) -> None:
    cache = ResponseCache(capacity)
    for op, key_index, size, token in ops:
        key = bytes([key_index])
        if op == "put":
            stored = cache.put(key, token, _outputs(size))
            assert stored == (entry_bytes(_outputs(size)) <= capacity)
            if stored:
                assert cache.get(key) is not None  # what was just put is never the one evicted
        elif op == "get":
            cache.get(key)
        else:
            cache.drop(token)
        assert 0 <= cache.used_bytes <= capacity
    assert cache.used_bytes == sum(entry.size for entry in cache._entries.values())


def test_least_recently_used_goes_first() -> None:
    one = entry_bytes(_outputs(100))
    cache = ResponseCache(3 * one)
    for key in (b"a", b"b", b"c"):
        cache.put(key, 1, _outputs(100))
    assert cache.get(b"a") is not None  # a is now the most recent
    cache.put(b"d", 1, _outputs(100))
    assert cache.get(b"b") is None and cache.get(b"a") is not None and cache.evictions == 1


def test_stored_outputs_are_a_read_only_copy() -> None:
    batch = np.arange(8, dtype=np.float32)
    cache = ResponseCache(1 << 20)
    cache.put(b"k", 1, {"y": batch[2:4]})
    kept = cache.get(b"k")
    assert kept is not None
    assert kept["y"].base is None and not kept["y"].flags.writeable
    batch[2] = 99.0
    assert kept["y"][0] == 2.0


def test_keys_differ_exactly_where_answers_may() -> None:
    base = request_key(_request())
    assert request_key(_request()) == base
    assert request_key(_request(priority=2, timeout_s=1.0)) == base  # the server's concerns, not the model's
    assert request_key(_request(parameters={"priority": 2, "timeout": 5, "binary_data_output": True})) == base
    assert request_key(_request((1.0, 2.5))) != base
    assert request_key(_request((1.0, 2.0, 0.0))) != base
    assert request_key(_request(outputs=("y",))) != base
    assert request_key(_request(parameters={"temperature": 0.5})) != base
    as_int = InferRequest(model="m", version=None, inputs={"x": np.asarray([[1, 2]], dtype=np.int32)})
    assert request_key(as_int) != base
    text = InferRequest(model="m", version=None, inputs={"x": np.asarray([b"ab", b"c"], dtype=object)})
    split = InferRequest(model="m", version=None, inputs={"x": np.asarray([b"a", b"bc"], dtype=object)})
    assert request_key(text) != request_key(split)


def test_a_version_cache_hits_misses_and_forgets_on_close() -> None:
    cache = ResponseCache(1 << 20)
    runs: list[int] = []
    lookups: list[bool] = []
    version = VersionCache(cache, MonotonicClock(), lookups.append)
    other = VersionCache(cache, MonotonicClock())  # another loaded copy: never shares answers

    async def run() -> InferResponse:
        runs.append(1)
        return InferResponse("m", 1, {"y": np.ones(2, np.float32)})

    async def main() -> None:
        first = await version.infer(_request(id="a"), run, "m", 1)
        second = await version.infer(_request(id="b"), run, "m", 1)
        assert second.id == "b" and np.array_equal(first.outputs["y"], second.outputs["y"])
        await other.infer(_request(), run, "m", 1)

    asyncio.run(main())
    assert len(runs) == 2 and lookups == [False, True]
    assert (version.counts.hits, version.counts.misses) == (1, 1)
    version.close()
    other.close()
    assert len(cache) == 0 and cache.used_bytes == 0


def test_the_llm_backend_refuses_a_response_cache() -> None:
    with pytest.raises(ValueError, match="samples"):
        ModelConfig.model_validate({"backend": "llm", "response_cache": {"enable": True}})


def test_hits_are_reported_and_a_salt_keeps_answers_apart() -> None:
    """``on_hit`` hears each hit (the version counts it a success); a different salt (a pipeline's
    serving steps) never shares an answer; inputs over ``offload_bytes`` (hashed in a worker
    thread) hit and miss as any others."""
    cache = ResponseCache(1 << 20)
    runs: list[int] = []
    hits: list[int] = []
    offloaded = VersionCache(cache, MonotonicClock(), offload_bytes=0)  # every request's inputs are "large"

    async def run() -> InferResponse:
        runs.append(1)
        return InferResponse("m", 1, {"y": np.ones(2, np.float32)})

    async def main() -> None:
        await offloaded.infer(_request(), run, "m", 1, on_hit=hits.append, salt=b"\x01")
        await offloaded.infer(_request(), run, "m", 1, on_hit=hits.append, salt=b"\x01")
        await offloaded.infer(_request(), run, "m", 1, on_hit=hits.append, salt=b"\x02")

    asyncio.run(main())
    assert len(runs) == 2 and len(hits) == 1 and hits[0] >= 0
    assert (offloaded.counts.hits, offloaded.counts.misses) == (1, 2)
