"""Scheduling over real HTTP: queue limits, deadlines, priorities, disconnects, exact splitting."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from model_builders import metric, v2_body, wait_until, write_python_model

from tensorgate.testing import ServerProcess


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    repo = tmp_path_factory.mktemp("slow")
    # One instance, one request per execution, 8 waiting at most: Triton's test_max_queue_size setup.
    write_python_model(
        repo,
        "slow",
        parameters={"delay_ms": 400},
        dynamic_batching={"max_batch_size": 1, "max_queue_size": 8, "priority_levels": 2, "default_priority": 2},
    )
    write_python_model(
        repo,
        "batched",
        parameters={"delay_ms": 5},
        max_batch_size=16,
        dynamic_batching={"max_queue_delay_ms": 2, "max_queue_size": 256},
    )
    with ServerProcess("--model-repository", str(repo)) as server:
        yield server


def _idle(server: ServerProcess, model: str) -> bool:
    return metric(server.metrics_url, "tensorgate_inflight_requests", model=model) == 0


async def _until(server: ServerProcess, model: str, *, inflight: int, queued: int) -> None:
    """Wait until the server itself reports this many requests admitted and this many of them queued.

    Ordering by the server's own view, not by sleeping: under a loaded test run a request sent
    first can reach the queue after one sent 100 ms later.
    """

    def reached() -> bool:
        return (
            metric(server.metrics_url, "tensorgate_inflight_requests", model=model) == inflight
            and metric(server.metrics_url, "tensorgate_queue_depth", model=model) == queued
        )

    await asyncio.to_thread(wait_until, reached)


async def _post(client: httpx.AsyncClient, server: ServerProcess, model: str, body: dict) -> httpx.Response:  # type: ignore[type-arg]
    return await client.post(f"{server.url}/v2/models/{model}/infer", json=body)


async def test_exact_admission_when_the_queue_is_full(slow_server: ServerProcess) -> None:
    wait_until(lambda: _idle(slow_server, "slow"))
    async with httpx.AsyncClient(timeout=30.0) as client:
        running = asyncio.ensure_future(_post(client, slow_server, "slow", v2_body([[0, 0, 0, 0]])))
        await _until(slow_server, "slow", inflight=1, queued=0)  # the first request is executing
        rejected_before = metric(
            slow_server.metrics_url, "tensorgate_requests_total", model="slow", outcome="queue_full"
        )
        answers = await asyncio.gather(
            *(_post(client, slow_server, "slow", v2_body([[i, 0, 0, 0]])) for i in range(10))
        )
        statuses = sorted(r.status_code for r in answers)
        assert statuses == [200] * 8 + [503] * 2
        for r in answers:
            if r.status_code == 503:
                assert "queue is full" in r.json()["error"]
                assert int(r.headers["retry-after"]) >= 1
        assert (await running).status_code == 200
    rejected_after = metric(slow_server.metrics_url, "tensorgate_requests_total", model="slow", outcome="queue_full")
    assert rejected_after - rejected_before == 2


async def test_expired_requests_get_504_and_never_run(slow_server: ServerProcess) -> None:
    wait_until(lambda: _idle(slow_server, "slow"))
    executions = metric(slow_server.metrics_url, "tensorgate_executions_total", model="slow")
    async with httpx.AsyncClient(timeout=30.0) as client:
        blocker = asyncio.ensure_future(_post(client, slow_server, "slow", v2_body([[0, 0, 0, 0]])))
        await _until(slow_server, "slow", inflight=1, queued=0)  # the blocker is executing
        # 50 ms deadline (Triton's `timeout` parameter is in microseconds) behind a 400 ms backlog.
        expired = await asyncio.gather(
            *(_post(client, slow_server, "slow", v2_body([[1, 1, 1, 1]], timeout=50_000)) for _ in range(3))
        )
        assert [r.status_code for r in expired] == [504] * 3
        assert "deadline" in expired[0].json()["error"]
        assert (await blocker).status_code == 200
    wait_until(lambda: _idle(slow_server, "slow"))
    assert metric(slow_server.metrics_url, "tensorgate_executions_total", model="slow") - executions == 1


async def test_higher_priority_is_served_first(slow_server: ServerProcess) -> None:
    wait_until(lambda: _idle(slow_server, "slow"))
    finished: list[str] = []

    async def send(client: httpx.AsyncClient, tag: str, priority: int | None) -> None:
        params = {} if priority is None else {"priority": priority}
        response = await _post(client, slow_server, "slow", v2_body([[0, 0, 0, 0]], **params))
        assert response.status_code == 200
        finished.append(tag)

    async with httpx.AsyncClient(timeout=30.0) as client:
        blocker = asyncio.ensure_future(send(client, "blocker", None))
        await _until(slow_server, "slow", inflight=1, queued=0)  # executing
        low = asyncio.ensure_future(send(client, "low", 2))
        await _until(slow_server, "slow", inflight=2, queued=1)  # waiting behind it
        high = asyncio.ensure_future(send(client, "high", 1))
        await asyncio.gather(blocker, low, high)
    assert finished == ["blocker", "high", "low"]


async def test_a_client_that_disconnects_while_queued_is_removed_and_counted(slow_server: ServerProcess) -> None:
    wait_until(lambda: _idle(slow_server, "slow"))
    cancelled = metric(slow_server.metrics_url, "tensorgate_requests_total", model="slow", outcome="cancelled")
    executions = metric(slow_server.metrics_url, "tensorgate_executions_total", model="slow")
    async with httpx.AsyncClient(timeout=30.0) as client:
        blocker = asyncio.ensure_future(_post(client, slow_server, "slow", v2_body([[0, 0, 0, 0]])))
        await _until(slow_server, "slow", inflight=1, queued=0)
        async with httpx.AsyncClient(timeout=0.1) as impatient:
            with pytest.raises(httpx.ReadTimeout):
                await _post(impatient, slow_server, "slow", v2_body([[5, 5, 5, 5]]))
        assert (await blocker).status_code == 200
    wait_until(lambda: _idle(slow_server, "slow"))
    assert (
        metric(slow_server.metrics_url, "tensorgate_requests_total", model="slow", outcome="cancelled") == cancelled + 1
    )
    assert metric(slow_server.metrics_url, "tensorgate_executions_total", model="slow") == executions + 1


async def test_many_concurrent_clients_never_get_each_others_answers(slow_server: ServerProcess) -> None:
    async def client_loop(client: httpx.AsyncClient, index: int) -> None:
        for round_ in range(15):
            value = index * 1000 + round_
            rows = 1 + (index % 3)
            body = v2_body([[value, -value, index, round_]] * rows)
            response = await _post(client, slow_server, "batched", body)
            assert response.status_code == 200, response.text
            output = response.json()["outputs"][0]
            assert output["shape"] == [rows, 4]
            assert output["data"] == [value + 1, -value + 1, index + 1, round_ + 1] * rows

    limits = httpx.Limits(max_connections=32)
    async with httpx.AsyncClient(timeout=30.0, limits=limits) as client:
        await asyncio.gather(*(client_loop(client, i) for i in range(24)))
    batches = metric(slow_server.metrics_url, "tensorgate_batch_size_count", model="batched")
    requests = metric(slow_server.metrics_url, "tensorgate_requests_total", model="batched", outcome="success")
    assert requests == 24 * 15
    assert batches < requests  # requests really shared batches


def test_unknown_priority_level_is_a_client_error(slow_server: ServerProcess) -> None:
    response = httpx.post(f"{slow_server.url}/v2/models/slow/infer", json=v2_body([[0, 0, 0, 0]], priority=7))
    assert response.status_code == 400
    assert "priority 7" in response.json()["error"]
