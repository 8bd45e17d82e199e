"""Prometheus metrics against what a client saw, parsed with prometheus_client's own parser."""

from __future__ import annotations

import asyncio
import time

import grpc
import httpx
import numpy as np
import pytest
from model_builders import metric, v2_body, wait_until, write_python_model
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tensorgate.testing import ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    repo = tmp_path_factory.mktemp("metrics")
    write_python_model(repo, "fast", parameters={"delay_ms": 0})
    write_python_model(
        repo, "slow", parameters={"delay_ms": 1000}, dynamic_batching={"max_batch_size": 1, "max_queue_size": 1}
    )
    write_python_model(repo, "lazy", parameters={"delay_ms": 400}, dynamic_batching={"max_batch_size": 1})
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


def test_s18_unknown_model_names_create_no_series(server: ServerProcess) -> None:
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
    # Every loaded version recorded its load and its warm-up once.
    for model in ("fast", "slow", "lazy"):
        assert metric(server.metrics_url, "tensorgate_model_load_duration_seconds_count", model=model) == 1
        assert metric(server.metrics_url, "tensorgate_model_warmup_duration_seconds_count", model=model) == 1
        assert metric(server.metrics_url, "tensorgate_model_load_duration_seconds_sum", model=model) > 0
        assert metric(server.metrics_url, "tensorgate_model_ready", model=model) == 1


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


def _grpc_request(model: str, value: float) -> service_pb2.ModelInferRequest:
    message = service_pb2.ModelInferRequest(model_name=model)
    message.inputs.add(name="INPUT", datatype="FP32", shape=[1, 4])
    message.raw_input_contents.append(np.full((1, 4), value, np.float32).tobytes())
    return message


def test_every_outcome_reconciles_over_http_and_grpc(server: ServerProcess) -> None:
    """Successes, refusals, model errors, timeouts and cancellations, some over each protocol: the
    counters move by exactly what the clients saw."""
    outcomes = ("success", "invalid", "error", "timeout", "cancelled")

    def counts(model: str) -> dict[str, float]:
        return {o: metric(server.metrics_url, "tensorgate_requests_total", model=model, outcome=o) for o in outcomes}

    fast, lazy = counts("fast"), counts("lazy")
    statuses: list[object] = []
    with httpx.Client(timeout=30.0) as http, grpc.insecure_channel(server.grpc_address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        url = f"{server.url}/v2/models"
        for i in range(5):
            statuses.append(http.post(f"{url}/fast/infer", json=v2_body([[i, 0, 0, 0]])).status_code)
        for i in range(4):
            statuses.append(stub.ModelInfer(_grpc_request("fast", i), timeout=30).model_name)
        bad = {"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}
        statuses += [http.post(f"{url}/fast/infer", json=bad).status_code for _ in range(2)]
        # A malformed version names no version: refused, and counted against none (the latest included).
        statuses.append(http.post(f"{url}/fast/versions/v1/infer", json=v2_body([[0, 0, 0, 0]])).status_code)
        malformed = _grpc_request("fast", 0.0)
        malformed.model_version = "v1"
        with pytest.raises(grpc.RpcError) as unparsable:
            stub.ModelInfer(malformed, timeout=30)
        statuses.append(unparsable.value.code())
        statuses += [http.post(f"{url}/fast/infer", json=v2_body([[-2e6, 0, 0, 0]])).status_code for _ in range(3)]
        for _ in range(2):
            with pytest.raises(grpc.RpcError) as failed:
                stub.ModelInfer(_grpc_request("fast", -2e6), timeout=30)
            statuses.append(failed.value.code())
        # lazy runs 400 ms a request, one at a time: a 50 ms timeout passes while running or queued.
        statuses += [
            http.post(f"{url}/lazy/infer", json=v2_body([[0, 0, 0, 0]], timeout=50_000)).status_code for _ in range(2)
        ]
        with pytest.raises(grpc.RpcError) as late:
            stub.ModelInfer(_grpc_request("lazy", 0.0), timeout=0.1)  # the gRPC deadline is the request's
        statuses.append(late.value.code())
        # The server learns of that deadline on its own clock: once all three timeouts are counted,
        # the in-flight gauge below can only be counting the two requests sent next.
        wait_until(lambda: counts("lazy")["timeout"] == lazy["timeout"] + 3)
        running = stub.ModelInfer.future(_grpc_request("lazy", 1.0), timeout=30)
        queued = stub.ModelInfer.future(_grpc_request("lazy", 2.0), timeout=30)
        wait_until(lambda: metric(server.metrics_url, "tensorgate_inflight_requests", model="lazy") == 2)
        queued.cancel()
        statuses.append(running.result().model_name)
    assert statuses == (
        [200] * 5
        + ["fast"] * 4
        + [400] * 3
        + [grpc.StatusCode.INVALID_ARGUMENT]
        + [500] * 3
        + [grpc.StatusCode.INTERNAL] * 2
        + [504] * 2
        + [grpc.StatusCode.DEADLINE_EXCEEDED, "lazy"]
    )
    expected_fast = {**fast, "success": fast["success"] + 9, "invalid": fast["invalid"] + 2, "error": fast["error"] + 5}
    expected_lazy = {**lazy, "success": lazy["success"] + 1, "timeout": lazy["timeout"] + 3}
    expected_lazy["cancelled"] = lazy["cancelled"] + 1
    wait_until(lambda: counts("fast") == expected_fast and counts("lazy") == expected_lazy, timeout_s=10)


def test_batch_sizes_and_release_reasons_are_recorded(server: ServerProcess) -> None:
    before_rows = metric(server.metrics_url, "tensorgate_batch_size_sum", model="fast")
    before_batches = metric(server.metrics_url, "tensorgate_batch_size_count", model="fast")
    before_single = metric(server.metrics_url, "tensorgate_batch_releases_total", model="fast", reason="single")
    with httpx.Client(timeout=30.0) as http:
        for rows in (1, 3, 2):  # unbatched model (no dynamic_batching): one release each
            body = v2_body([[r, 0, 0, 0] for r in range(rows)])
            assert http.post(f"{server.url}/v2/models/fast/infer", json=body).status_code == 200
    assert metric(server.metrics_url, "tensorgate_batch_size_sum", model="fast") == before_rows + 6
    assert metric(server.metrics_url, "tensorgate_batch_size_count", model="fast") == before_batches + 3
    assert (
        metric(server.metrics_url, "tensorgate_batch_releases_total", model="fast", reason="single")
        == before_single + 3
    )


def test_grpc_requests_get_an_access_line_naming_the_version_that_served(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        _, call = stub.ModelInfer.with_call(
            _grpc_request("fast", 1.0), metadata=(("x-request-id", "grpc-line-1"),), timeout=30
        )
        assert ("x-request-id", "grpc-line-1") in tuple(call.trailing_metadata())
        with pytest.raises(grpc.RpcError):
            stub.ModelInfer(_grpc_request("fast", -2e6), metadata=(("x-request-id", "grpc-line-2"),), timeout=30)

    def lines() -> dict[str, dict[str, object]]:
        records = [r for r in server.log_records() if r.get("logger") == "tensorgate.access"]
        return {str(r["request_id"]): r for r in records if str(r.get("request_id", "")).startswith("grpc-line-")}

    wait_until(lambda: len(lines()) == 2, timeout_s=5)
    ok, failed = lines()["grpc-line-1"], lines()["grpc-line-2"]
    assert (ok["protocol"], ok["method"], ok["model"], ok["version"], ok["status"]) == (
        "grpc",
        "ModelInfer",
        "fast",
        "1",  # the client named no version: the line says which one served
        "OK",
    )
    assert float(ok["compute_ms"]) > 0  # type: ignore[arg-type]
    assert failed["status"] == "INTERNAL"


def test_replica_id_names_the_server_in_its_logs_and_metrics(tmp_path_factory: pytest.TempPathFactory) -> None:
    repo = tmp_path_factory.mktemp("replica")
    write_python_model(repo, "fast", parameters={"delay_ms": 0})
    with ServerProcess("--model-repository", str(repo), "--replica-id", "r7") as process:
        assert httpx.post(f"{process.url}/v2/models/fast/infer", json=v2_body([[1, 2, 3, 4]])).status_code == 200
        assert metric(process.metrics_url, "tensorgate_server_info", replica="r7") == 1
        wait_until(lambda: any(r.get("logger") == "tensorgate.access" for r in process.log_records()))
        records = process.log_records()
    assert records and all(r.get("replica") == "r7" for r in records)
