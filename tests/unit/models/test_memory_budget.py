"""The memory budget's wiring in process (models/memory_budget.py over the ModelManager and the
service), with real Python models holding weights of known size: an on-demand model is known but
not loaded, its first requests share one load, idle models are evicted least recently used first
through the manager's drain, a model in use is not, and one larger than the budget fails naming
sizes."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from model_builders import wait_until, write_weights_model

from tensorgate.clock import MonotonicClock
from tensorgate.errors import DeadlineExceeded, ModelLoadError, Unavailable
from tensorgate.models.manager import ModelManager
from tensorgate.models.servable import VersionState
from tensorgate.models.service import InferenceService
from tensorgate.observability.metrics import Metrics
from tensorgate.repository.scanner import scan_model
from tensorgate.types import InferRequest

MIB = 1 << 20


def _request(name: str, timeout_s: float | None = 20.0) -> InferRequest:
    return InferRequest(name, {"INPUT": np.zeros((1, 4), dtype=np.float32)}, timeout_s=timeout_s)


def _sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def _state(served: Served, name: str) -> str:
    residency = served.service.residency(name)
    assert residency is not None
    return str(residency["state"])


async def _answer(service: InferenceService, name: str) -> float:
    response = await service.infer(_request(name))
    return float(response.outputs["OUTPUT"][0, 0])


class Served:
    def __init__(self, manager: ModelManager, metrics: Metrics) -> None:
        self.manager = manager
        self.metrics = metrics
        self.service = InferenceService(manager)

    def held(self) -> int:
        return sum(e.residence.held_bytes for e in self.manager.models.values())


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[object]:
    started: list[ModelManager] = []

    async def start(budget: int | None, names: list[str], **kwargs: object) -> Served:
        metrics = Metrics(process=False)
        manager = ModelManager(
            MonotonicClock(),
            metrics,
            drain_timeout_s=10.0,
            rng=random.Random(3),
            memory_budget_bytes=budget,
            default_residency="on_demand",
        )
        started.append(manager)
        await manager.load_all([scan_model(tmp_path, tmp_path / name) for name in names])
        return Served(manager, metrics)

    yield start
    for manager in started:
        await manager.aclose(5.0)


async def test_an_on_demand_model_is_known_not_loaded_and_its_first_requests_share_one_load(
    tmp_path: Path, serve: object
) -> None:
    write_weights_model(tmp_path, "a", mib=4, value=3.0)
    served = await serve(None, ["a"])  # type: ignore[operator]
    entry = served.manager.models["a"]
    assert not entry.versions and served.manager.all_ready()  # known, not loaded, not holding readiness
    assert served.service.residency("a") == {
        "mode": "on_demand",
        "state": "NOT_RESIDENT",
        "resident_bytes": 0,
        "measured_bytes": None,
    }
    assert served.service.metadata("a", None).inputs[0].name == "INPUT"  # declared in its config
    answers = await asyncio.gather(*(_answer(served.service, "a") for _ in range(8)))
    assert answers == [3.0] * 8
    assert _sample(served.metrics, "tensorgate_model_residency_loads_total", model="a", outcome="loaded") == 1
    status = served.service.residency("a")
    assert status is not None and status["state"] == "RESIDENT"
    # The weights, and whatever the load itself took, less what it freed meanwhile (a growth of
    # the process: other allocations freed during the load offset it by a little).
    assert status["measured_bytes"] >= 0.95 * 4 * MIB
    assert _sample(served.metrics, "tensorgate_model_resident_bytes", model="a") == status["resident_bytes"]


async def test_idle_models_are_evicted_least_recently_used_first_and_the_budget_holds(
    tmp_path: Path, serve: object
) -> None:
    for index, name in enumerate("abc"):
        write_weights_model(tmp_path, name, mib=8, value=float(index))
    # Two 8 MiB models and what their loads take fit; three do not.
    served = await serve(20 * MIB, ["a", "b", "c"])  # type: ignore[operator]
    assert await _answer(served.service, "a") == 0.0
    assert await _answer(served.service, "b") == 1.0
    assert await _answer(served.service, "a") == 0.0  # a is used again: b is the least recently used
    assert await _answer(served.service, "c") == 2.0
    models = served.manager.models
    assert models["a"].versions and models["c"].versions and not models["b"].versions
    assert _sample(served.metrics, "tensorgate_model_evictions_total", model="b") == 1
    assert served.held() <= 20 * MIB
    assert 1 not in models["b"].statuses or models["b"].statuses[1].state is VersionState.UNLOADED
    assert await _answer(served.service, "b") == 1.0  # loaded again, evicting a (now the oldest)
    assert _sample(served.metrics, "tensorgate_model_evictions_total", model="a") == 1
    assert served.held() <= 20 * MIB
    assert _sample(served.metrics, "tensorgate_memory_budget_bytes") == 20 * MIB


async def test_a_cold_load_waits_for_the_model_in_use_to_go_idle_and_then_evicts_it(
    tmp_path: Path, serve: object
) -> None:
    hold = tmp_path / "hold"
    write_weights_model(tmp_path, "busy", mib=8, value=5.0, hold_file=hold)
    write_weights_model(tmp_path, "other", mib=8)
    served = await serve(12 * MIB, ["busy", "other"])  # type: ignore[operator]
    assert await _answer(served.service, "busy") == 5.0
    hold.touch()
    running = asyncio.create_task(_answer(served.service, "busy"))
    entry = served.manager.models["busy"]
    # The request is on the instance, held there (polled with a deadline, off the loop).
    await asyncio.to_thread(wait_until, lambda: entry.versions[1].scheduler.running > 0, 10.0)
    waiting = asyncio.create_task(_answer(served.service, "other"))  # 20 s to wait for room
    await asyncio.to_thread(wait_until, lambda: _state(served, "other") == "LOADING", 10.0)
    assert _state(served, "busy") == "RESIDENT" and not waiting.done()
    assert _sample(served.metrics, "tensorgate_model_evictions_total", model="busy") == 0
    hold.unlink()
    assert await running == 5.0  # never evicted from under its request
    assert await waiting == 1.0  # then it was idle, and made room
    assert _sample(served.metrics, "tensorgate_model_evictions_total", model="busy") == 1
    assert _state(served, "busy") == "NOT_RESIDENT" and served.held() <= 12 * MIB
    outcome = {"model": "other", "outcome": "no_room"}
    assert _sample(served.metrics, "tensorgate_model_residency_loads_total", **outcome) == 0


async def test_a_load_that_finds_no_room_gives_up_with_its_requests(tmp_path: Path, serve: object) -> None:
    """Within a request's deadline the load waits for room, and past it the request is answered 504;
    a request with no deadline waits ``room_wait_s``, then 503 with Retry-After; a load no request
    waits on (the repository API's) is refused at once."""
    hold = tmp_path / "hold"
    write_weights_model(tmp_path, "busy", mib=8, value=5.0, hold_file=hold)
    write_weights_model(tmp_path, "other", mib=8)
    served = await serve(12 * MIB, ["busy", "other"])  # type: ignore[operator]
    assert await _answer(served.service, "busy") == 5.0
    hold.touch()
    running = asyncio.create_task(_answer(served.service, "busy"))
    entry = served.manager.models["busy"]
    await asyncio.to_thread(wait_until, lambda: entry.versions[1].scheduler.running > 0, 10.0)
    outcome = {"model": "other", "outcome": "no_room"}

    with pytest.raises(DeadlineExceeded, match="exceeded its deadline of 300 ms while the model loaded"):
        await served.service.infer(_request("other", timeout_s=0.3))
    await asyncio.to_thread(
        wait_until, lambda: _sample(served.metrics, "tensorgate_model_residency_loads_total", **outcome) == 1, 10.0
    )
    served.manager.memory.room_wait_s = 0.2
    with pytest.raises(Unavailable, match=r"no room within the memory budget .* waited \d+ ms") as refused:
        await served.service.infer(_request("other", timeout_s=None))
    assert refused.value.retry_after_s is not None
    with pytest.raises(ModelLoadError, match="no room within the memory budget") as at_once:
        await served.manager.apply(scan_model(tmp_path, tmp_path / "other"), retry_failed=True)
    assert "waited" not in str(at_once.value)
    assert _sample(served.metrics, "tensorgate_model_residency_loads_total", **outcome) == 2
    hold.unlink()
    assert await running == 5.0
    assert _sample(served.metrics, "tensorgate_model_evictions_total", model="busy") == 0


async def test_a_model_larger_than_the_budget_fails_its_load_naming_the_sizes(tmp_path: Path, serve: object) -> None:
    write_weights_model(tmp_path, "big", mib=16)
    served = await serve(8 * MIB, ["big"])  # type: ignore[operator]
    with pytest.raises(Unavailable, match=r"measured 1\d\.\d MiB .* memory budget of 8\.0 MiB") as failed:
        await _answer(served.service, "big")
    assert failed.value.retry_after_s is None  # waiting does not help
    assert served.held() == 0 and not served.manager.models["big"].versions
    with pytest.raises(Unavailable, match=r"memory budget of 8\.0 MiB"):  # not loaded again to find out
        await _answer(served.service, "big")
    assert _sample(served.metrics, "tensorgate_model_residency_loads_total", model="big", outcome="too_large") == 1
