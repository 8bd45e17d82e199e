"""The response cache end to end: identical requests are answered from it without running the
model, different ones miss, and the statistics (HTTP and gRPC) and metrics count both; a hit is a
success (Triton's ``success`` statistics, the requests and duration metrics); a pipeline's answers
are cached as a whole."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import yaml
from model_builders import metric, v2_body, write_python_model

from tensorgate.testing import ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("cache-repo")
    common = {"parameters": {"delay_ms": 1}, "health_check": {"enabled": False}}
    write_python_model(repo, "cached", response_cache={"enable": True}, **common)
    write_python_model(repo, "uncached", **common)
    (repo / "cached_pipeline" / "1").mkdir(parents=True)
    tensor = {"datatype": "FP32", "shape": [-1, 4]}
    pipeline = {
        "backend": "pipeline",
        "inputs": [{"name": "INPUT", **tensor}],
        "outputs": [{"name": "twice", **tensor}],
        "steps": [
            {"model": "uncached", "inputs": {"INPUT": "INPUT"}, "outputs": {"OUTPUT": "once"}},
            {"model": "uncached", "inputs": {"INPUT": "once"}, "outputs": {"OUTPUT": "twice"}},
        ],
        "response_cache": {"enable": True},
    }
    (repo / "cached_pipeline" / "config.yaml").write_text(yaml.safe_dump(pipeline))
    with ServerProcess("--model-repository", str(repo), "--log-level", "warning") as server:
        yield server


def _stats(server: ServerProcess, model: str) -> dict[str, int]:
    stats = httpx.get(f"{server.url}/v2/models/{model}/stats").json()["model_stats"][0]
    inference = stats["inference_stats"]
    return {
        "executions": stats["execution_count"],
        "inferences": stats["inference_count"],
        "success": inference["success"]["count"],
        "hits": inference["cache_hit"]["count"],
        "misses": inference["cache_miss"]["count"],
    }


def _served(server: ServerProcess, model: str) -> dict[str, float]:
    """What the metrics port counts for a model: successful requests and timed requests."""
    return {
        "success": metric(server.metrics_url, "tensorgate_requests_total", model=model, outcome="success"),
        "timed": metric(server.metrics_url, "tensorgate_request_duration_seconds_count", model=model),
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


def test_a_hit_is_a_success_in_the_statistics_and_the_metrics(server: ServerProcess) -> None:
    """As Triton counts it: ``success`` includes hits, ``inference_count`` and ``execution_count`` do not."""
    _infer(server, "cached", [[3, 1, 4, 1]])  # stored (or already there)
    before, served = _stats(server, "cached"), _served(server, "cached")
    for _ in range(3):
        assert _infer(server, "cached", [[3, 1, 4, 1]]) == [4, 2, 5, 2]
    after, now = _stats(server, "cached"), _served(server, "cached")
    assert after["hits"] - before["hits"] == 3 and after["misses"] == before["misses"]
    assert after["success"] - before["success"] == 3
    assert after["inferences"] == before["inferences"] and after["executions"] == before["executions"]
    assert now["success"] - served["success"] == 3
    assert now["timed"] - served["timed"] == 3


def test_a_pipelines_answers_are_cached_whole(server: ServerProcess) -> None:
    """A hit on the pipeline runs none of its steps; its statistics count the hit as a success."""
    steps = _stats(server, "uncached")
    before = _stats(server, "cached_pipeline")
    first = httpx.post(f"{server.url}/v2/models/cached_pipeline/infer", json=v2_body([[5, 6, 7, 8]]))
    again = httpx.post(f"{server.url}/v2/models/cached_pipeline/infer", json=v2_body([[5, 6, 7, 8]]))
    assert first.status_code == again.status_code == 200, (first.text, again.text)
    assert first.json()["outputs"] == again.json()["outputs"]
    assert again.json()["outputs"][0]["data"] == [7, 8, 9, 10]
    after = _stats(server, "cached_pipeline")
    assert after["misses"] - before["misses"] == 1 and after["hits"] - before["hits"] == 1
    assert after["success"] - before["success"] == 2
    assert _stats(server, "uncached")["executions"] - steps["executions"] == 2  # the miss's two steps only
    hits = metric(server.metrics_url, "tensorgate_response_cache_lookups_total", model="cached_pipeline", result="hit")
    assert hits >= 1


def test_the_docs_walkthrough_runs_as_written(example_repo: Path, tmp_path: Path) -> None:
    """docs/model-repository.md's response-cache walkthrough, on a copy of the bundled examples with
    the line it adds to mlp's configuration; only the address changes."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "model-repository.md").read_text(encoding="utf-8")
    section = page[page.index("## Response cache") :]
    added = re.search(r"```yaml\n# models/mlp/config.yaml\n(.*?)```", section, flags=re.S)
    script = re.search(r"```bash\n(.*?)```", section, flags=re.S)
    assert added is not None and script is not None
    repo = tmp_path / "models"
    shutil.copytree(example_repo, repo)
    config = repo / "mlp" / "config.yaml"
    config.write_text(config.read_text() + added.group(1))
    with ServerProcess("--model-repository", str(repo), "--log-level", "warning") as server:
        commands = script.group(1).replace("localhost:8080", server.http_address)
        result = subprocess.run(["bash", "-c", commands], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "hits 1 misses 1"
