"""The status document (``GET /v2/status``) for a generative model: the engine's running and waiting
sequences and KV cache use while a generation streams, and tokens/s from the last seconds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tensorgate.testing import ServerProcess


@pytest.fixture(scope="module")
def server(tiny_lm: Path) -> Iterator[ServerProcess]:
    env = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    with ServerProcess("--model-repository", str(tiny_lm), env=env, ready_timeout_s=90) as s:
        yield s


def _tiny(server: ServerProcess) -> dict[str, Any]:
    document = httpx.get(f"{server.url}/v2/status", timeout=10).json()
    model: dict[str, Any] = next(m for m in document["models"] if m["name"] == "tiny")
    return model


def test_a_streaming_generation_shows_in_the_engine_figures(server: ServerProcess) -> None:
    idle = _tiny(server)
    assert idle["generative"] is True and idle["state"] == "READY"
    (version,) = idle["versions"]
    generation = version["generation"]
    assert generation["kv_blocks_total"] > 0 and 0.0 <= generation["kv_cache_usage"] <= 1.0
    assert generation["running"] == 0 and generation["waiting"] == 0
    body = {"model": "tiny", "prompt": "a b c", "max_tokens": 240, "n": 4, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        next(lines)  # the first token is out: the sequence runs and holds cache blocks
        busy = _tiny(server)["versions"][0]["generation"]
        assert busy["running"] >= 1 and busy["kv_blocks_used"] > 0 and busy["kv_cache_usage"] > 0
        for _ in lines:  # read to the end
            pass
    deadline = time.monotonic() + 10
    while (done := _tiny(server)["versions"][0])["generation"]["running"]:
        assert time.monotonic() < deadline, "the finished sequence kept running"
        time.sleep(0.05)
    assert done["window"]["tokens"] >= 4 * 240 and done["generation"]["tokens_per_s"] > 0
    assert done["generation"]["tokens_per_s"] == done["window"]["tokens_per_s"]
