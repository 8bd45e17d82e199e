"""Pipelines checked against the repository at load (a step naming a model the repository lacks, a
pipeline reaching itself), and a pipeline's response cache: a hit runs no step and counts as a
success, and a step model's reload never answers from the old copy's results."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from model_builders import write_python_model

from tensorgate.clock import MonotonicClock
from tensorgate.config.model_config import ModelConfig
from tensorgate.errors import ModelLoadError
from tensorgate.models.manager import ModelManager
from tensorgate.models.pipeline import check_steps
from tensorgate.models.response_cache import ResponseCache
from tensorgate.models.servable import VersionState
from tensorgate.models.service import InferenceService
from tensorgate.observability.metrics import Metrics
from tensorgate.repository.scanner import scan_model
from tensorgate.repository.source import ModelSource
from tensorgate.types import InferRequest, InferResponse

TENSOR = {"datatype": "FP32", "shape": [-1, 4]}


def _pipeline_config(*steps: str, cache: bool = False) -> dict[str, Any]:
    """A chain of steps, each reading the previous one's OUTPUT (the first reads the input x)."""
    chained = []
    source = "x"
    for index, model in enumerate(steps):
        chained.append({"model": model, "inputs": {"INPUT": source}, "outputs": {"OUTPUT": f"s{index}"}})
        source = f"s{index}"
    return {
        "backend": "pipeline",
        "inputs": [{"name": "x", **TENSOR}],
        "outputs": [{"name": source, **TENSOR}],
        "steps": chained,
        "response_cache": {"enable": cache},
    }


class Repository:
    """What a pipeline's check reads of the server: model sources by name (StepRunner, without
    running anything)."""

    def __init__(self, **configs: dict[str, Any]) -> None:
        self._sources = {
            name: ModelSource(name, str(config.get("backend", "python")), ModelConfig.model_validate(config), ())
            for name, config in configs.items()
        }

    async def run(self, request: InferRequest) -> InferResponse:
        raise AssertionError("a load-time check runs no step")

    def source(self, model: str) -> ModelSource | None:
        return self._sources.get(model)

    def serving(self, model: str) -> tuple[int, ...]:
        return ()


PLAIN = {"backend": "python"}


def test_steps_that_reach_the_repository_pass_and_are_listed() -> None:
    repository = Repository(a=PLAIN, b=PLAIN, inner=_pipeline_config("b", "a"))
    # A diamond (two ways to reach a) is not a cycle.
    assert check_steps("outer", ModelConfig.model_validate(_pipeline_config("a", "inner")), repository) == (
        "a",
        "inner",
        "b",
    )


@pytest.mark.parametrize(
    ("repository", "config", "message"),
    [
        (Repository(), _pipeline_config("p"), r"pipeline 'p' step 1 names model 'p', which closes a cycle \(p -> p\)"),
        (
            Repository(q=_pipeline_config("p")),
            _pipeline_config("q"),
            r"pipeline 'q' step 1 names model 'p', which closes a cycle \(p -> q -> p\)",
        ),
        (
            Repository(a=PLAIN, q=_pipeline_config("r"), r=_pipeline_config("a", "q")),
            _pipeline_config("a", "q"),
            r"pipeline 'r' step 2 names model 'q', which closes a cycle \(q -> r -> q\)",
        ),
        (Repository(a=PLAIN), _pipeline_config("a", "gone"), "pipeline 'p' step 2 names model 'gone', which is not in"),
        (
            Repository(q=_pipeline_config("gone")),
            _pipeline_config("q"),
            "pipeline 'q' step 1 names model 'gone', which is not in the model repository",
        ),
        (
            Repository(lm={"backend": "llm"}),
            _pipeline_config("lm", cache=True),
            "pipeline 'p' enables response_cache, but it reaches model 'lm' \\(backend llm\\), which samples",
        ),
    ],
    ids=["itself", "each-other", "a-cycle-further-down", "missing", "missing-further-down", "cache-over-llm"],
)
def test_a_bad_step_graph_is_refused(repository: Repository, config: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelLoadError, match=message):
        check_steps("p", ModelConfig.model_validate(config), repository)


def _write_pipeline(repo: Path, name: str, config: dict[str, Any]) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.yaml").write_text(yaml.safe_dump(config))


@pytest.fixture
async def service() -> AsyncIterator[InferenceService]:
    manager = ModelManager(MonotonicClock(), Metrics(process=False), drain_timeout_s=5.0, rng=random.Random(3))
    manager.response_cache = ResponseCache(1 << 20)
    yield InferenceService(manager)
    await manager.aclose(5.0)


def _sources(repo: Path) -> list[ModelSource]:
    return [scan_model(repo, directory) for directory in sorted(repo.iterdir())]


def _request(model: str, value: float = 1.0) -> InferRequest:
    return InferRequest(model, {"x": np.full((1, 4), value, dtype=np.float32)})


async def test_bad_pipelines_fail_to_load_and_the_rest_serve(tmp_path: Path, service: InferenceService) -> None:
    write_python_model(tmp_path, "add", parameters={"delay_ms": 0}, health_check={"enabled": False})
    _write_pipeline(tmp_path, "good", _pipeline_config("add", "add"))
    _write_pipeline(tmp_path, "itself", _pipeline_config("add", "itself"))
    _write_pipeline(tmp_path, "ping", _pipeline_config("pong"))
    _write_pipeline(tmp_path, "pong", _pipeline_config("ping"))
    _write_pipeline(tmp_path, "dangling", _pipeline_config("add", "nowhere"))
    await service.manager.load_all(_sources(tmp_path))
    reasons = {}
    for name in ("itself", "ping", "pong", "dangling"):
        status = service.manager.models[name].statuses[1]
        assert status.state is VersionState.FAILED, name
        reasons[name] = status.reason
    assert "closes a cycle (itself -> itself)" in reasons["itself"]
    assert "closes a cycle (ping -> pong -> ping)" in reasons["ping"]
    assert "closes a cycle (pong -> ping -> pong)" in reasons["pong"]
    assert "names model 'nowhere', which is not in the model repository" in reasons["dangling"]
    answer = await service.infer(_request("good"))
    np.testing.assert_array_equal(answer.outputs["s1"], np.full((1, 4), 3.0, np.float32))


def _counts(service: InferenceService, model: str) -> dict[str, int]:
    [stats] = service.statistics(model, None)
    inference = stats["inference_stats"]
    return {
        "executions": stats["execution_count"],
        "inferences": stats["inference_count"],
        "success": inference["success"]["count"],
        "hits": inference["cache_hit"]["count"],
        "misses": inference["cache_miss"]["count"],
    }


async def test_a_cached_pipeline_runs_no_step_on_a_hit_until_a_step_reloads(
    tmp_path: Path, service: InferenceService
) -> None:
    write_python_model(tmp_path, "add", parameters={"delay_ms": 0}, health_check={"enabled": False})
    _write_pipeline(tmp_path, "cached", _pipeline_config("add", "add", cache=True))
    await service.manager.load_all(_sources(tmp_path))

    first = await service.infer(_request("cached"))
    again = await service.infer(_request("cached"))
    np.testing.assert_array_equal(first.outputs["s1"], again.outputs["s1"])
    assert _counts(service, "add")["executions"] == 2  # the hit reached no step
    assert _counts(service, "cached") == {"executions": 1, "inferences": 1, "success": 2, "hits": 1, "misses": 1}

    # The step model is reloaded (its files changed): a cached answer may be stale, so it misses.
    (tmp_path / "add" / "config.yaml").write_text(
        (tmp_path / "add" / "config.yaml").read_text().replace("delay_ms: 0", "delay_ms: 1")
    )
    await service.manager.apply(scan_model(tmp_path, tmp_path / "add"))
    await service.infer(_request("cached"))
    assert _counts(service, "cached")["misses"] == 2
    assert _counts(service, "add")["executions"] == 2  # the reloaded copy's own count: both steps ran on it
