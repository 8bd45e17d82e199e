"""Fair sharing between tenants and deadline admission on a real server, over HTTP and gRPC
(docs/fairness.md): the tenant header is honoured, a tenant's max_queued refuses that tenant
alone, a tenant arriving behind another's burst is served next, and a request that cannot meet its
deadline is refused at once with 503 and counted as deadline_refused."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from model_builders import metric, v2_body, wait_until, write_python_model
from tritonclient.utils import InferenceServerException

from tensorgate.testing import ServerProcess

ROW = [[0.0, 0.0, 0.0, 0.0]]


def _queued(server: ServerProcess, model: str) -> float:
    return metric(server.metrics_url, "tensorgate_queue_depth", model=model)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("tenants")
    repo = root / "models"
    hold = root / "hold"
    # One request at a time, each waiting while the hold file exists and then taking its delay: the
    # test decides when the instance is free, so what is queued behind it is known exactly, and
    # the answers come back far enough apart for their order to be the order they were served in.
    for name, delay_ms, policy in (
        ("gated", 25, {}),
        ("timed", 40, {"deadline_admission": True}),
        ("urgent_first", 25, {"order": "deadline"}),
    ):
        write_python_model(
            repo,
            name,
            code=GATED_MODEL,
            max_batch_size=0,
            parameters={"hold_file": str(hold), "delay_ms": delay_ms},
            dynamic_batching={"max_queue_size": 64, **policy},
        )
    config = root / "server.yaml"
    config.write_text(
        f"server: {{model_repository: {repo}, tenants: {{noisy: {{max_queued: 2}}, heavy: {{weight: 3}}}}}}\n"
    )
    with ServerProcess("--config", str(config), "--no-access-log", grpc=True) as process:
        process.hold = hold  # type: ignore[attr-defined]
        yield process


GATED_MODEL = """
import os
import time

import numpy as np

from tensorgate import PythonModel


class Gated(PythonModel):
    def load(self, context):
        self.hold = context.parameters["hold_file"]
        self.delay = float(context.parameters["delay_ms"]) / 1000.0

    def execute(self, inputs):
        end = time.monotonic() + 30.0
        while os.path.exists(self.hold) and time.monotonic() < end:
            time.sleep(0.002)
        time.sleep(self.delay)
        return {"OUTPUT": (inputs["INPUT"] + 1.0).astype(np.float32)}
"""


def _post(server: ServerProcess, model: str, tenant: str | None, **parameters: int) -> httpx.Response:
    headers = {} if tenant is None else {"x-tenant": tenant}
    return httpx.post(
        f"{server.url}/v2/models/{model}/infer", json=v2_body(ROW, **parameters), headers=headers, timeout=30
    )


def _grpc_infer(server: ServerProcess, model: str, tenant: str, timeout_s: float | None = None) -> None:
    with grpcclient.InferenceServerClient(server.grpc_address) as client:
        tensor = grpcclient.InferInput("INPUT", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 4), np.float32))
        client.infer(model, [tensor], headers={"x-tenant": tenant}, client_timeout=timeout_s)


def test_a_tenant_over_its_max_queued_gets_503_and_others_do_not(server: ServerProcess) -> None:
    hold: Path = server.hold  # type: ignore[attr-defined]
    hold.touch()
    with ThreadPoolExecutor(4) as pool:
        try:
            running = pool.submit(_post, server, "gated", None)  # holds the instance
            wait_until(lambda: metric(server.metrics_url, "tensorgate_inflight_requests", model="gated") >= 1)
            queued = [pool.submit(_post, server, "gated", "noisy") for _ in range(2)]
            wait_until(lambda: _queued(server, "gated") >= 2)
            refused = _post(server, "gated", "noisy")
            assert refused.status_code == 503 and "retry-after" in refused.headers
            assert "tenant 'noisy' has 2 requests waiting" in refused.json()["error"]
            with pytest.raises(InferenceServerException, match="tenant 'noisy'") as grpc_refused:
                _grpc_infer(server, "gated", "noisy")
            assert grpc_refused.value.status() == "StatusCode.UNAVAILABLE"
            other = pool.submit(_post, server, "gated", "quiet")  # another tenant still gets in
            wait_until(lambda: _queued(server, "gated") >= 3)
        finally:
            hold.unlink()
        assert [f.result().status_code for f in [running, *queued, other]] == [200] * 4


def test_a_tenant_behind_another_tenants_burst_is_served_next(server: ServerProcess) -> None:
    hold: Path = server.hold  # type: ignore[attr-defined]
    finished: list[str] = []
    lock = threading.Lock()

    def call(tenant: str, protocol: str) -> None:
        if protocol == "grpc":
            _grpc_infer(server, "gated", tenant)
        else:
            assert _post(server, "gated", tenant).status_code == 200
        with lock:
            finished.append(tenant)

    hold.touch()
    with ThreadPoolExecutor(12) as pool:
        try:
            first = pool.submit(call, "flood", "http")
            wait_until(lambda: metric(server.metrics_url, "tensorgate_inflight_requests", model="gated") >= 1)
            burst = [pool.submit(call, "flood", "http") for _ in range(8)]
            wait_until(lambda: _queued(server, "gated") >= 8)
            steady = pool.submit(call, "steady", "grpc")  # the tenant named in gRPC metadata
            wait_until(lambda: _queued(server, "gated") >= 9)
        finally:
            hold.unlink()
        for future in [first, *burst, steady]:
            future.result()
    # FIFO would have served it last (tenth); fair order serves it after one more of the burst.
    assert finished.index("steady") <= 2, finished


def test_a_request_that_cannot_meet_its_deadline_is_refused_at_once(server: ServerProcess) -> None:
    hold: Path = server.hold  # type: ignore[attr-defined]
    for _ in range(10):  # the version measures its cost (40 ms a request) before it judges
        assert _post(server, "timed", None).status_code == 200
    hold.touch()
    with ThreadPoolExecutor(8) as pool:
        try:
            backlog = [pool.submit(_post, server, "timed", "a") for _ in range(6)]  # ~240 ms of work, no deadline
            wait_until(lambda: _queued(server, "timed") >= 5)
            refused = _post(server, "timed", "b", timeout=100_000)  # 100 ms: it cannot make it
            assert refused.status_code == 503 and "retry-after" in refused.headers
            assert "cannot finish within its deadline of 100 ms" in refused.json()["error"]
            with pytest.raises(InferenceServerException, match="cannot finish within its deadline") as grpc_refused:
                _grpc_infer(server, "timed", "b", timeout_s=0.1)
            assert grpc_refused.value.status() == "StatusCode.UNAVAILABLE"
        finally:
            hold.unlink()
        assert all(f.result().status_code == 200 for f in backlog)
    refusals = metric(server.metrics_url, "tensorgate_requests_total", model="timed", outcome="deadline_refused")
    assert refusals == 2
    assert metric(server.metrics_url, "tensorgate_requests_total", model="timed", outcome="timeout") == 0
    # With nothing ahead, a request with the same deadline is admitted and answered.
    assert _post(server, "timed", "b", timeout=100_000).status_code == 200


def test_with_order_deadline_the_earliest_deadline_is_served_first(server: ServerProcess) -> None:
    hold: Path = server.hold  # type: ignore[attr-defined]
    finished: list[str] = []
    lock = threading.Lock()

    def call(label: str, timeout_us: int) -> None:
        assert _post(server, "urgent_first", None, timeout=timeout_us).status_code == 200
        with lock:
            finished.append(label)

    hold.touch()
    with ThreadPoolExecutor(8) as pool:
        try:
            running = pool.submit(call, "running", 20_000_000)
            wait_until(lambda: metric(server.metrics_url, "tensorgate_inflight_requests", model="urgent_first") >= 1)
            relaxed = [pool.submit(call, "relaxed", 20_000_000) for _ in range(4)]
            wait_until(lambda: _queued(server, "urgent_first") >= 4)
            urgent = pool.submit(call, "urgent", 10_000_000)  # arrives last, due first
            wait_until(lambda: _queued(server, "urgent_first") >= 5)
        finally:
            hold.unlink()
        for future in [running, *relaxed, urgent]:
            future.result()
    assert finished[:2] == ["running", "urgent"], finished
