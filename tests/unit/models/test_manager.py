"""The ModelManager in process, over real Python-model instances: switch when READY, drain what was
admitted, leave what serves alone when a load fails, move traffic without reloading, and survive
concurrent load and unload of one model."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from model_builders import write_python_model, write_version, write_versioned_model

from tensorgate.clock import MonotonicClock
from tensorgate.errors import ModelLoadError, Unavailable
from tensorgate.models.manager import ModelManager
from tensorgate.models.servable import VersionState
from tensorgate.models.service import InferenceService
from tensorgate.observability.metrics import Metrics
from tensorgate.repository.scanner import scan_model
from tensorgate.repository.source import ModelSource
from tensorgate.types import InferRequest


def _source(root: Path, name: str = "m", revision: str = "r1") -> ModelSource:
    source = scan_model(root, root / name)
    return replace(source, on_disk=tuple(replace(v, revision=revision) for v in source.on_disk))


def _request(version: int | None = None) -> InferRequest:
    return InferRequest("m", {"INPUT": np.zeros((1, 4), dtype=np.float32)}, version=version)


async def _answer(service: InferenceService, version: int | None = None) -> tuple[int, float]:
    response = await service.infer(_request(version))
    return response.version, float(response.outputs["OUTPUT"][0, 0])


@pytest.fixture
async def manager() -> ModelManager:
    manager = ModelManager(MonotonicClock(), Metrics(process=False), drain_timeout_s=10.0, rng=random.Random(7))
    yield manager
    await manager.aclose(5.0)


async def test_a_new_version_takes_over_and_the_old_finishes_what_it_was_given(
    tmp_path: Path, manager: ModelManager
) -> None:
    model_dir = write_versioned_model(tmp_path, "m", [1])
    write_version(model_dir, 1, delay_ms=300)
    await manager.load_all([_source(tmp_path)])
    service = InferenceService(manager)
    running = asyncio.create_task(_answer(service))  # on v1, for 300 ms
    await asyncio.sleep(0)
    write_version(model_dir, 2)
    await manager.apply(_source(tmp_path))
    assert await _answer(service) == (2, 2.0)
    assert await running == (1, 1.0)  # admitted to v1, answered by v1
    entry = manager.models["m"]
    assert entry.statuses[1].state in (VersionState.DRAINING, VersionState.UNLOADED) or 1 not in entry.statuses
    with pytest.raises(Unavailable):  # v1 named explicitly once it drains: 503, never 500
        await service.resolve("m", 1).servable()


async def test_a_failed_version_leaves_the_serving_one_and_is_tried_again_only_when_it_changes(
    tmp_path: Path, manager: ModelManager
) -> None:
    model_dir = write_versioned_model(tmp_path, "m", [1])
    await manager.load_all([_source(tmp_path)])
    service = InferenceService(manager)
    write_version(model_dir, 2)
    (model_dir / "2" / "model.py").write_text("raise RuntimeError('broken on import')\n")
    with pytest.raises(ModelLoadError, match="broken on import"):
        await manager.apply(_source(tmp_path))
    entry = manager.models["m"]
    assert entry.statuses[2].state is VersionState.FAILED and "broken on import" in entry.statuses[2].reason
    assert await _answer(service) == (1, 1.0)
    assert manager.all_ready()
    generations = dict(entry.generations)
    with pytest.raises(ModelLoadError):  # the same files: reported, not loaded again
        await manager.apply(_source(tmp_path))
    assert entry.generations == generations
    write_version(model_dir, 2)  # fixed: a new revision
    await manager.apply(_source(tmp_path, revision="r2"))
    assert await _answer(service) == (2, 2.0)


async def test_new_weights_move_traffic_without_loading_anything(tmp_path: Path, manager: ModelManager) -> None:
    model_dir = write_versioned_model(tmp_path, "m", [1, 2], traffic={"weights": {1: 100, 2: 0}})
    await manager.load_all([_source(tmp_path)])
    service = InferenceService(manager)
    assert {(await _answer(service))[0] for _ in range(20)} == {1}
    document = yaml.safe_load((model_dir / "config.yaml").read_text())
    document["traffic"] = {"weights": {1: 0, 2: 100}}
    (model_dir / "config.yaml").write_text(yaml.safe_dump(document))
    generations = dict(manager.models["m"].generations)
    await manager.apply(_source(tmp_path))
    assert {(await _answer(service))[0] for _ in range(20)} == {2}
    assert manager.models["m"].generations == generations


async def test_unload_returns_once_admitted_requests_are_answered(tmp_path: Path, manager: ModelManager) -> None:
    model_dir = write_versioned_model(tmp_path, "m", [1])
    write_version(model_dir, 1, delay_ms=50)
    await manager.load_all([_source(tmp_path)])
    service = InferenceService(manager)
    admitted = [asyncio.create_task(_answer(service)) for _ in range(6)]
    await asyncio.sleep(0)
    await manager.unload("m")
    assert all(task.done() for task in admitted)
    assert [task.result() for task in admitted] == [(1, 1.0)] * 6
    assert not manager.models["m"].versions and manager.all_ready()  # an unloaded model does not count
    with pytest.raises(Unavailable):
        await service.resolve("m", None).servable()


async def test_concurrent_loads_and_unloads_of_one_model_end_consistent(tmp_path: Path, manager: ModelManager) -> None:
    write_versioned_model(tmp_path, "m", [1])
    await manager.load_all([_source(tmp_path)])
    outcomes: list[str] = []

    async def churn(worker: int) -> None:
        for i in range(10):
            if (worker + i) % 2:
                await manager.unload("m")
                outcomes.append("unloaded")
            else:
                await manager.apply(_source(tmp_path, revision=f"r{worker}-{i}"), retry_failed=True)
                outcomes.append("loaded")

    await asyncio.gather(*(churn(w) for w in range(8)))
    assert len(outcomes) == 80
    entry = manager.models["m"]
    assert outcomes[-1] == ("loaded" if entry.versions else "unloaded")  # the last one to finish holds
    await manager.apply(_source(tmp_path, revision="final"))
    assert await _answer(InferenceService(manager)) == (1, 1.0)


async def test_a_canary_taken_out_of_the_config_leaves_no_rollout_state_behind(tmp_path: Path) -> None:
    metrics = Metrics(process=False)
    manager = ModelManager(MonotonicClock(), metrics, drain_timeout_s=10.0, rng=random.Random(7))
    canary = {"version": 2, "steps": [10, 100], "step_s": 60, "min_requests": 10}
    model_dir = write_versioned_model(tmp_path, "m", [1, 2], traffic={"canary": canary})
    try:
        await manager.load_all([_source(tmp_path)])

        def state(name: str) -> float | None:
            return metrics.registry.get_sample_value("tensorgate_rollout_state", {"model": "m", "state": name})

        assert (state("stepping"), state("promoted"), state("rolled_back")) == (1, 0, 0)
        document = yaml.safe_load((model_dir / "config.yaml").read_text())
        del document["traffic"]
        (model_dir / "config.yaml").write_text(yaml.safe_dump(document))
        await manager.apply(_source(tmp_path))
        assert (state("stepping"), state("promoted"), state("rolled_back")) == (None, None, None)
    finally:
        await manager.aclose(5.0)


async def test_a_canary_whose_version_is_not_on_disk_is_rolled_back_at_once(
    tmp_path: Path, manager: ModelManager
) -> None:
    canary = {"version": 3, "steps": [10, 100], "step_s": 60, "min_requests": 10}
    write_versioned_model(tmp_path, "m", [1, 2], traffic={"canary": canary})
    await manager.load_all([_source(tmp_path)])
    traffic = manager.models["m"].traffic
    assert traffic is not None and traffic.rollout is not None
    assert traffic.rollout.state.value == "rolled_back"
    assert "not in the model repository" in str(traffic.rollout.status()["reason"])
    assert {(await _answer(InferenceService(manager)))[0] for _ in range(10)} == {2}  # the stable version serves


PICKY_MODEL = """
import numpy as np

from tensorgate import PythonModel


class Picky(PythonModel):
    def load(self, context):
        if context.parameters.get("broken"):
            raise RuntimeError("this configuration cannot load")

    def execute(self, inputs):
        return {"OUTPUT": np.ones(inputs["INPUT"].shape, dtype=np.float32)}
"""


async def test_a_configuration_whose_reload_fails_is_not_reported_as_the_one_serving(
    tmp_path: Path, manager: ModelManager
) -> None:
    model_dir = write_python_model(tmp_path, "m", code=PICKY_MODEL, max_batch_size=8)
    await manager.load_all([_source(tmp_path)])
    document = yaml.safe_load((model_dir / "config.yaml").read_text())
    (model_dir / "config.yaml").write_text(
        yaml.safe_dump({**document, "max_batch_size": 4, "parameters": {"broken": 1}})
    )
    with pytest.raises(ModelLoadError, match="cannot load"):
        await manager.apply(_source(tmp_path, revision="r2"))
    entry = manager.models["m"]
    assert entry.source.config.max_batch_size == 8  # what serves is the old configuration's copy
    assert await InferenceService(manager).infer(_request()) is not None
