"""The status document (``models/status.py``) in process, over real Python-model instances: states,
traffic shares, instances, queues and the last minute's figures, with the window on a manual clock."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from model_builders import write_version, write_versioned_model

from tensorgate.clock import ManualClock, MonotonicClock
from tensorgate.errors import InvalidInput, QueueFull
from tensorgate.models.manager import ModelManager
from tensorgate.models.service import InferenceService
from tensorgate.models.status import StatusReport
from tensorgate.observability.metrics import Metrics
from tensorgate.repository.scanner import scan_model
from tensorgate.repository.source import ModelSource
from tensorgate.types import InferRequest, Tenant


def _source(root: Path, name: str) -> ModelSource:
    source = scan_model(root, root / name)
    return replace(source, on_disk=tuple(replace(v, revision="r1") for v in source.on_disk))


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[tuple[InferenceService, StatusReport, ManualClock]]:
    window_clock = ManualClock()
    metrics = Metrics(process=False, enabled=False, clock=window_clock)
    manager = ModelManager(MonotonicClock(), metrics, drain_timeout_s=5.0, rng=random.Random(3))
    write_versioned_model(tmp_path, "split", [1, 2], traffic={"weights": {1: 75, 2: 25}})
    broken = write_versioned_model(tmp_path, "broken", [1], version_policy={"all": True})
    write_version(broken, 2)
    (broken / "2" / "model.py").write_text("raise RuntimeError('broken on import')\n")
    await manager.load_all([_source(tmp_path, "split"), _source(tmp_path, "broken")])
    service = InferenceService(manager)
    service.started = True
    report = StatusReport(service, window_clock, metrics.status, replica="r-1", tenants=metrics.tenants)
    yield service, report, window_clock
    await manager.aclose(5.0)


def _request(model: str, version: int, rows: int = 1) -> InferRequest:
    return InferRequest(model, {"INPUT": np.zeros((rows, 4), dtype=np.float32)}, version=version)


async def test_the_document_shows_states_shares_and_instances(
    setup: tuple[InferenceService, StatusReport, ManualClock],
) -> None:
    _service, report, _ = setup
    document = report.document()
    server = document["server"]
    assert server["name"] == "tensorgate" and server["replica"] == "r-1"
    assert server["ready"] is True and server["live"] is True and server["draining"] is False
    assert server["models"] == 2 and server["models_ready"] == 2 and server["memory"] is None
    assert document["tenants"] is None  # no request has named a tenant
    models = {m["name"]: m for m in document["models"]}
    split = models["split"]
    assert split["state"] == "READY" and split["generative"] is False and split["residency"] is None
    assert split["traffic"]["shares"] == {"1": 75.0, "2": 25.0}
    assert [(v["version"], v["state"], v["share"]) for v in split["versions"]] == [
        ("1", "READY", 75.0),
        ("2", "READY", 25.0),
    ]
    first = split["versions"][0]
    assert first["ready"] is True and first["generation"] is None
    assert first["queue"] == {"queued": 0, "running": 0, "max_queue_size": 1024}
    assert first["instances"] and {i["health"] for i in first["instances"]} == {"ok"}
    assert {i["device"] for i in first["instances"]} == {"cpu"}
    broken = models["broken"]
    assert broken["state"] == "READY"  # version 1 serves; version 2 failed beside it
    states = {v["version"]: (v["state"], v["reason"]) for v in broken["versions"]}
    assert states["1"] == ("READY", "")
    assert states["2"][0] == "FAILED" and "broken on import" in states["2"][1]
    assert broken["traffic"]["shares"] == {"1": 100.0}  # no split: the latest ready version takes all


async def test_figures_follow_the_traffic_and_leave_with_the_minute(
    setup: tuple[InferenceService, StatusReport, ManualClock],
) -> None:
    service, report, clock = setup
    for _ in range(5):
        await service.infer(_request("split", 1, rows=2))
    with pytest.raises(InvalidInput):
        await service.infer(InferRequest("split", {"INPUT": np.zeros((1, 3), dtype=np.float32)}, version=1))
    clock.advance(2.0)
    first = report.document()
    split = next(m for m in first["models"] if m["name"] == "split")
    version = split["versions"][0]
    window = version["window"]
    assert window["requests"] == 6 and window["outcomes"] == {"invalid": 1, "success": 5}
    assert window["errors"] == {"invalid": 1}
    assert window["batch_sizes"] == {"2": 5}
    assert window["requests_per_s"] == pytest.approx(6 / 2.0, abs=0.01)  # the window is 2 s old
    assert window["p50_ms"] is not None and window["p99_ms"] >= window["p50_ms"]
    assert split["requests_per_s"] == window["requests_per_s"]
    assert first["server"]["requests_per_s"] == window["requests_per_s"]
    clock.advance(61.0)
    later = report.document()
    assert later["server"]["sequence"] == first["server"]["sequence"] + 1
    quiet = next(m for m in later["models"] if m["name"] == "split")["versions"][0]["window"]
    assert quiet["requests"] == 0 and quiet["requests_per_s"] == 0.0 and quiet["p99_ms"] is None


async def test_a_caller_limited_to_some_models_sees_only_those(
    setup: tuple[InferenceService, StatusReport, ManualClock],
) -> None:
    _, report, _ = setup
    document = report.document(frozenset({"split"}))
    assert [m["name"] for m in document["models"]] == ["split"] and document["server"]["models"] == 1


async def test_a_model_whose_only_version_failed_is_failed(tmp_path: Path) -> None:
    metrics = Metrics(process=False, enabled=False)
    manager = ModelManager(MonotonicClock(), metrics, drain_timeout_s=5.0)
    model_dir = write_versioned_model(tmp_path, "bad", [1])
    (model_dir / "1" / "model.py").write_text("raise RuntimeError('no good')\n")
    await manager.load_all([_source(tmp_path, "bad")])
    service = InferenceService(manager)
    service.started = True
    try:
        document = StatusReport(service, MonotonicClock()).document()
        (model,) = document["models"]
        assert model["state"] == "FAILED" and "no good" in model["reason"]
        assert model["versions"][0]["window"] is None  # never loaded: no window, no instances
        assert model["versions"][0]["instances"] == [] and model["versions"][0]["queue"] is None
        assert document["server"]["ready"] is False and document["server"]["models_ready"] == 0
    finally:
        await manager.aclose(5.0)


async def test_each_tenant_is_shown_served_or_refused_to_callers_who_see_every_model(
    setup: tuple[InferenceService, StatusReport, ManualClock],
) -> None:
    service, report, clock = setup
    flood, steady, capped = Tenant("flood"), Tenant("steady"), Tenant("capped", max_queued=0)
    for _ in range(6):
        await service.infer(replace(_request("split", 1), tenant=flood))
    for _ in range(2):
        await service.infer(replace(_request("split", 2), tenant=steady))
    await service.infer(_request("split", 1))  # names no tenant: the shared one, shown as ""
    with pytest.raises(QueueFull, match="tenant 'capped'"):
        await service.infer(replace(_request("split", 1), tenant=capped))
    clock.advance(2.0)
    tenants = report.document()["tenants"]
    assert tenants["others"] is None and tenants["shown"] >= 4
    rows = {row["name"]: row for row in tenants["rows"]}
    assert [row["name"] for row in tenants["rows"]] == ["flood", "steady", "", "capped"]  # busiest first
    assert (rows["flood"]["answered"], rows["flood"]["refused"], rows["flood"]["errors"]) == (6, 0, 0)
    assert rows["flood"]["requests_per_s"] == pytest.approx(6 / 2.0, abs=0.01)
    assert rows["steady"]["answered"] == 2 and rows["steady"]["p99_ms"] >= rows["steady"]["p50_ms"] > 0
    assert rows[""]["answered"] == 1
    capped_row = rows["capped"]
    assert (capped_row["answered"], capped_row["refused"], capped_row["p99_ms"]) == (0, 1, None)
    assert capped_row["outcomes"] == {"queue_full": 1}
    assert report.document(frozenset({"split"}))["tenants"] is None  # across models: not for a limited caller
