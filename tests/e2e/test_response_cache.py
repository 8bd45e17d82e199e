"""The response cache end to end: identical requests are answered from it without running the
model, different ones miss, and the statistics (HTTP and gRPC) and metrics count both."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from model_builders import metric, v2_body, write_python_model

from tensorgate.testing import ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("cache-repo")
    common = {"parameters": {"delay_ms": 1}, "health_check": {"enabled": False}}
    write_python_model(repo, "cached", response_cache={"enable": True}, **common)
    write_python_model(repo, "uncached", **common)
    with ServerProcess("--model-repository", str(repo), "--log-level", "warning") as server:
        yield server


def _stats(server: ServerProcess, model: str) -> dict[str, int]:
    stats = httpx.get(f"{server.url}/v2/models/{model}/stats").json()["model_stats"][0]
    inference = stats["inference_stats"]
    return {
        "executions": stats["execution_count"],
        "hits": inference["cache_hit"]["count"],
        "misses": inference["cache_miss"]["count"],
    }


def _infer(server: ServerProcess, model: str, values: list[list[float]]) -> list[list[float]]:
    answer = httpx.post(f"{server.url}/v2/models/{model}/infer", json=v2_body(values))
    assert answer.status_code == 200, answer.text
    return answer.json()["outputs"][0]["data"]


def test_identical_requests_hit_and_different_ones_miss(server: ServerProcess) -> None:
    before = _stats(server, "cached")
    first = _infer(server, "cached", [[1, 2, 3, 4]])
    again = _infer(server, "cached", [[1, 2, 3, 4]])
    other = _infer(server, "cached", [[1, 2, 3, 5]])
    after = _stats(server, "cached")
    assert first == again == [2, 3, 4, 5] and other == [2, 3, 4, 6]
    assert after["hits"] - before["hits"] == 1
    assert after["misses"] - before["misses"] == 2
    assert after["executions"] - before["executions"] == 2  # the hit never reached the model
    hits = metric(server.metrics_url, "tensorgate_response_cache_lookups_total", model="cached", result="hit")
    assert hits >= 1
    assert metric(server.metrics_url, "tensorgate_response_cache_bytes") > 0


def test_a_model_without_the_cache_runs_every_request(server: ServerProcess) -> None:
    before = _stats(server, "uncached")
    for _ in range(3):
        _infer(server, "uncached", [[1, 2, 3, 4]])
    after = _stats(server, "uncached")
    assert after["executions"] - before["executions"] == 3 and after["hits"] == after["misses"] == 0


def test_grpc_statistics_and_answers_from_the_cache(server: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(server.grpc_address) as client:
        x = grpcclient.InferInput("INPUT", [1, 4], "FP32")
        x.set_data_from_numpy(np.array([[7, 7, 7, 7]], np.float32))
        answers = [client.infer("cached", [x]).as_numpy("OUTPUT") for _ in range(3)]
        for answer in answers:
            np.testing.assert_array_equal(answer, [[8, 8, 8, 8]])
        stats = client.get_inference_statistics("cached").model_stats[0].inference_stats
        assert stats.cache_hit.count >= 2 and stats.cache_miss.count >= 1
