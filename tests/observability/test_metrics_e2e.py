"""Prometheus metrics against what a client saw, parsed with prometheus_client's own parser."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from model_builders import metric, v2_body, write_python_model
from prometheus_client.parser import text_string_to_metric_families

from tensorgate.testing import ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    repo = tmp_path_factory.mktemp("metrics")
    write_python_model(repo, "fast", parameters={"delay_ms": 0})
    write_python_model(
        repo, "slow", parameters={"delay_ms": 1000}, dynamic_batching={"max_batch_size": 1, "max_queue_size": 1}
    )
    with ServerProcess("--model-repository", str(repo)) as process:
        yield process


def _families(server: ServerProcess) -> dict[str, object]:
    text = httpx.get(server.metrics_url).text
    return {family.name: family for family in text_string_to_metric_families(text)}


def test_counters_reconcile_exactly_with_what_clients_saw(server: ServerProcess) -> None:
    before = {
        o: metric(server.metrics_url, "tensorgate_requests_total", model="fast", outcome=o)
        for o in ("success", "invalid")
    }
    with httpx.Client(timeout=10.0) as client:
        for i in range(100):
            assert client.post(f"{server.url}/v2/models/fast/infer", json=v2_body([[i, 0, 0, 0]])).status_code == 200
        bad = {"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}
        for _ in range(3):
            assert client.post(f"{server.url}/v2/models/fast/infer", json=bad).status_code == 400
    assert metric(server.metrics_url, "tensorgate_requests_total", model="fast", outcome="success") == (
        before["success"] + 100
    )
    assert metric(server.metrics_url, "tensorgate_requests_total", model="fast", outcome="invalid") == (
        before["invalid"] + 3
    )
    count = metric(server.metrics_url, "tensorgate_request_duration_seconds_count", model="fast")
    assert count >= 100


async def test_queue_full_rejections_are_counted_exactly(server: ServerProcess) -> None:
    rejected = metric(server.metrics_url, "tensorgate_requests_total", model="slow", outcome="queue_full")
    succeeded = metric(server.metrics_url, "tensorgate_requests_total", model="slow", outcome="success")
    async with httpx.AsyncClient(timeout=30.0) as client:
        url = f"{server.url}/v2/models/slow/infer"
        running = asyncio.ensure_future(client.post(url, json=v2_body([[0, 0, 0, 0]])))
        deadline = time.monotonic() + 10
        while await asyncio.to_thread(metric, server.metrics_url, "tensorgate_inflight_requests", model="slow") < 1:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        queued = asyncio.ensure_future(client.post(url, json=v2_body([[1, 0, 0, 0]])))
        while await asyncio.to_thread(metric, server.metrics_url, "tensorgate_queue_depth", model="slow") < 1:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        answers = await asyncio.gather(*(client.post(url, json=v2_body([[2, 0, 0, 0]])) for _ in range(7)))
        assert [a.status_code for a in answers] == [503] * 7
        assert (await running).status_code == 200 and (await queued).status_code == 200
    assert metric(server.metrics_url, "tensorgate_requests_total", model="slow", outcome="queue_full") == rejected + 7
    assert metric(server.metrics_url, "tensorgate_requests_total", model="slow", outcome="success") == succeeded + 2


def test_unknown_model_names_create_no_series(server: ServerProcess) -> None:
    def series() -> int:
        return sum(len(f.samples) for f in _families(server).values())  # type: ignore[attr-defined]

    before = series()
    with httpx.Client() as client:
        for i in range(200):
            assert client.post(f"{server.url}/v2/models/nope{i}/infer", json=v2_body([[0, 0, 0, 0]])).status_code == 404
    assert series() == before
    text = httpx.get(server.metrics_url).text
    assert "nope" not in text


def test_expected_families_are_exported(server: ServerProcess) -> None:
    names = set(_families(server))
    for expected in (
        "tensorgate_requests",
        "tensorgate_request_duration_seconds",
        "tensorgate_queue_duration_seconds",
        "tensorgate_compute_duration_seconds",
        "tensorgate_batch_size",
        "tensorgate_batch_releases",
        "tensorgate_queue_depth",
        "tensorgate_inflight_requests",
        "tensorgate_instance_healthy",
        "tensorgate_model_load_duration_seconds",
        "tensorgate_model_warmup_duration_seconds",
        "tensorgate_process_cpu_seconds",
        "tensorgate_process_resident_memory_bytes",
    ):
        assert expected in names, expected


def test_request_id_is_echoed_or_generated_and_logged(server: ServerProcess) -> None:
    with httpx.Client() as client:
        given = client.post(
            f"{server.url}/v2/models/fast/infer", json=v2_body([[0, 0, 0, 0]]), headers={"X-Request-Id": "abc-123"}
        )
        generated = client.post(f"{server.url}/v2/models/fast/infer", json=v2_body([[0, 0, 0, 0]]))
    assert given.headers["x-request-id"] == "abc-123"
    assert generated.headers["x-request-id"]
    # Too long, or not plain: replaced by the server's own id, not echoed.
    for unfit in (b"x" * 129, b"has space", "caf\u00e9".encode()):
        answer = httpx.post(
            f"{server.url}/v2/models/fast/infer", json=v2_body([[0, 0, 0, 0]]), headers={"X-Request-Id": unfit}
        )
        assert answer.status_code == 200
        assert answer.headers["x-request-id"] not in ("", unfit.decode("latin-1"))
    deadline = time.monotonic() + 5
    while True:
        lines = [r for r in server.log_records() if r.get("logger") == "tensorgate.access"]
        match = [r for r in lines if r.get("request_id") == "abc-123"]
        if match or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert match, "no access log line for the request"
    line = match[0]
    assert line["model"] == "fast" and line["version"] == "1" and line["status"] == 200
    assert line["protocol"] == "http" and "queue_ms" in line and "compute_ms" in line
