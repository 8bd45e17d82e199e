"""The seed's scenario: one of four instances goes bad under load (it raises, or hangs; at a marker,
or after N calls), and clients see no failed request while it is taken out of rotation, restarted
and put back. An idle instance that answers NaN, or hangs, is found by its probes. A model whose
only instance goes bad turns not ready over HTTP and gRPC, and ready again once it heals. An input
the model refuses on every instance is the client's error, and no instance's fault."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import httpx
import pytest
from load_loop import Load
from model_builders import metric, v2_body, write_faulty_model
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tensorgate.testing import ServerProcess

BAD = "m_1_2"
DEVICE_ERROR = "device error: the accelerator stopped answering"  # what FAULTY_MODEL's "fail" raises
HUNG = "hung|past"  # a batch or a probe that ran past its limit


async def _until(holds: Callable[[], Awaitable[bool]], timeout_s: float = 30.0) -> None:
    """Poll the server (another process: nothing here to wait on) until ``holds``, with a deadline."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        if await holds():
            return
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.02)


def _instance_metric(server: ServerProcess, name: str, instance: str = BAD) -> Callable[[], Awaitable[float]]:
    async def read() -> float:
        return await asyncio.to_thread(metric, server.metrics_url, name, model="m", instance=instance)

    return read


def _in_flight(server: ServerProcess) -> Callable[[], Awaitable[bool]]:
    async def read() -> bool:
        return await asyncio.to_thread(metric, server.metrics_url, "tensorgate_inflight_requests", model="m") > 0

    return read


def _left_and_rejoined(server: ServerProcess, error: str, instance: str = BAD) -> None:
    """The warning that took ``instance`` out names it, its device and its last error (matching
    the pattern ``error``); a later line says it is back."""
    messages = [str(r.get("message")) for r in server.log_records()]
    out = [m for m in messages if "out of rotation" in m]
    ejection = rf"^instance {instance} of m/1 on cpu is out of rotation after \d+ failure\(s\): .*(?:{error})"
    assert out and re.search(ejection, out[0]), out[:1]
    assert any(instance in m and "back in rotation" in m for m in messages)


@pytest.mark.parametrize(
    ("fault", "isolation", "error"),
    [
        ("fail", "thread", DEVICE_ERROR),
        ("hang", "thread", HUNG),
        ("fail", "process", DEVICE_ERROR),
        ("hang", "process", HUNG),  # the hung worker process is killed and started again
    ],
    ids=["fail-thread", "hang-thread", "fail-process", "hang-process"],
)
async def test_one_bad_instance_of_four_leaves_and_rejoins_with_no_failed_request(
    tmp_path: Path, fault: str, isolation: str, error: str
) -> None:
    marker = tmp_path / "broken"
    write_faulty_model(tmp_path / "models", "m", marker, fault=fault, isolation=isolation)
    with ServerProcess("--model-repository", str(tmp_path / "models"), "--no-access-log") as server:
        healthy = _instance_metric(server, "tensorgate_instance_healthy")
        restarts = _instance_metric(server, "tensorgate_instance_restarts_total")
        async with Load(f"{server.url}/v2/models/m/infer", clients=16, body=v2_body([[1, 2, 3, 4]])) as load:
            await load.until(lambda a: len(a) >= 200)
            marker.touch()  # the instance goes bad
            await _until(lambda: _equals(healthy, 0.0))
            await _until(lambda: _equals(restarts, 1.0, at_least=True))
            mark = len(load.answers)
            await load.until(lambda a, m=mark: len(a) >= m + 200)  # still serving, on three instances
            marker.unlink()  # it heals: the next restart's probes pass
            await _until(lambda: _equals(healthy, 1.0))
            mark = len(load.answers)
            await load.until(lambda a, m=mark: len(a) >= m + 300)
        assert load.failures() == [], load.failures()[:3]
        assert all(a.computed_by == 2.0 for a in load.answers)  # no wrong answer reached a client either
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"{server.url}/v2/health/ready")).status_code == 200
        _left_and_rejoined(server, error)


async def test_a_hung_instance_costs_no_client_a_timeout_with_default_settings(tmp_path: Path) -> None:
    """Four worker processes of a millisecond model, health checks as the server ships them; one
    instance starts sleeping 20 s per call under six clients with a 15 s timeout. Its batches run
    past its pace within a second and are answered by the others (hedged); its second such batch
    in a row takes it out, and it is restarted and rejoins once it heals. No client times out, and
    every answer is the model's."""
    marker = tmp_path / "broken"
    write_faulty_model(
        tmp_path / "models", "m", marker, fault="hang", isolation="process", hang_s=20.0, default_checks=True
    )
    with ServerProcess("--model-repository", str(tmp_path / "models"), "--no-access-log") as server:
        healthy = _instance_metric(server, "tensorgate_instance_healthy")
        async with Load(
            f"{server.url}/v2/models/m/infer", clients=6, body=v2_body([[1, 2, 3, 4]]), timeout_s=15.0
        ) as load:
            await load.until(lambda a: len(a) >= 300)  # each instance learns its pace
            marker.touch()  # its next batch hangs
            await _until(lambda: _equals(healthy, 0.0), timeout_s=90)
            marker.unlink()
            await _until(lambda: _equals(healthy, 1.0), timeout_s=60)
            mark = len(load.answers)
            await load.until(lambda a, m=mark: len(a) >= m + 200)
        assert load.failures() == [], load.failures()[:3]
        assert all(a.computed_by == 2.0 for a in load.answers)
        assert max(a.received - a.sent for a in load.answers) < 15.0
        hedged, won, suspect = [
            await asyncio.to_thread(metric, server.metrics_url, name, model="m", **labels)
            for name, labels in (
                ("tensorgate_hedged_batches_total", {}),
                ("tensorgate_hedge_wins_total", {"side": "hedge"}),
                ("tensorgate_suspect_batches_total", {"instance": BAD}),
            )
        ]
        assert hedged >= 2 and won >= 2 and suspect >= 2, (hedged, won, suspect)
        _left_and_rejoined(server, "batches in a row ran past its pace")


async def test_an_instance_that_goes_bad_after_n_calls_leaves_and_rejoins_each_time(tmp_path: Path) -> None:
    """No marker: the instance fails from its 151st call on. Its restart loads it afresh, so it
    serves 150 more calls and goes bad again: two restarts show the whole cycle twice over."""
    write_faulty_model(tmp_path / "models", "m", None, after_calls=150)
    with ServerProcess("--model-repository", str(tmp_path / "models"), "--no-access-log") as server:
        restarts = _instance_metric(server, "tensorgate_instance_restarts_total")
        async with Load(f"{server.url}/v2/models/m/infer", clients=16, body=v2_body([[1, 2, 3, 4]])) as load:
            await _until(lambda: _equals(restarts, 2.0, at_least=True))
            mark = len(load.answers)
            await load.until(lambda a, m=mark: len(a) >= m + 200)
        assert load.failures() == [], load.failures()[:3]
        assert all(a.computed_by == 2.0 for a in load.answers)
        _left_and_rejoined(server, DEVICE_ERROR)
        messages = [str(r.get("message")) for r in server.log_records()]
        assert sum(f"instance {BAD} of m/1 on cpu is out of rotation" in m for m in messages) >= 2


@pytest.mark.parametrize(
    ("fault", "error", "failures"),
    [
        ("nan", "non-finite", 3.0),  # failure_threshold probes in a row
        ("hang", "the probe ran past its timeout", 1.0),  # a hang is fatal at once; its restart frees it
    ],
    ids=["nan", "hang"],
)
async def test_an_idle_instance_going_bad_is_found_by_its_probes(
    tmp_path: Path, fault: str, error: str, failures: float
) -> None:
    marker = tmp_path / "broken"
    write_faulty_model(tmp_path / "models", "m", marker, fault=fault)
    with ServerProcess("--model-repository", str(tmp_path / "models"), "--no-access-log") as server:
        healthy = _instance_metric(server, "tensorgate_instance_healthy")
        probes = _instance_metric(server, "tensorgate_instance_probes_total")
        await _answered_once(server)  # probes send only inputs the model has answered: this request's
        await _until(lambda: _equals(probes, 1.0, at_least=True))  # probed while healthy: it passes
        marker.touch()
        await _until(lambda: _equals(healthy, 0.0))
        others = [
            await asyncio.to_thread(metric, server.metrics_url, "tensorgate_instance_healthy", instance=f"m_1_{i}")
            for i in (0, 1, 3)
        ]
        assert others == [1.0, 1.0, 1.0]
        marker.unlink()
        await _until(lambda: _equals(healthy, 1.0))
        failed = await asyncio.to_thread(
            metric, server.metrics_url, "tensorgate_instance_probes_total", instance=BAD, outcome="failed"
        )
        assert failed >= failures
        restarted = await asyncio.to_thread(
            metric, server.metrics_url, "tensorgate_instance_restarts_total", instance=BAD
        )
        assert restarted >= 1
        _left_and_rejoined(server, error)


async def _answered_once(server: ServerProcess) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=10.0) as client:
        answer = await client.post("/v2/models/m/infer", json=v2_body([[1, 2, 3, 4]]))
    assert answer.status_code == 200


async def test_no_instance_is_probed_with_inputs_the_model_has_not_answered(tmp_path: Path) -> None:
    """Without a warm-up sample, an idle model is not probed until it has answered a request: invented
    inputs (zeros) could fail a healthy instance. Once one is answered, its inputs are the probe."""
    write_faulty_model(tmp_path / "models", "m", tmp_path / "never-created", count=1, bad_index=0)
    with ServerProcess("--model-repository", str(tmp_path / "models"), "--no-access-log") as server:
        probes = _instance_metric(server, "tensorgate_instance_probes_total", "m_1_0")
        async with httpx.AsyncClient(base_url=server.url, timeout=10.0) as client:

            async def uptime() -> float:
                return float((await client.get("/v2/status")).json()["server"]["uptime_s"])

            await _until(lambda: _at_least(uptime, 1.5))  # seven probe intervals of 0.2 s have gone by
            assert await probes() == 0.0
            answer = await client.post("/v2/models/m/infer", json=v2_body([[1, 2, 3, 4]]))
            assert answer.status_code == 200
        await _until(lambda: _equals(probes, 2.0, at_least=True))
        assert await _instance_metric(server, "tensorgate_instance_healthy", "m_1_0")() == 1.0


async def _at_least(read: Callable[[], Awaitable[float]], value: float) -> bool:
    return await read() >= value


async def _equals(read: Callable[[], Awaitable[float]], value: float, *, at_least: bool = False) -> bool:
    measured = await read()
    return measured >= value if at_least else measured == value


async def test_a_model_whose_only_instance_goes_bad_is_not_ready_until_it_heals(tmp_path: Path) -> None:
    marker = tmp_path / "broken"
    write_faulty_model(tmp_path / "models", "m", marker, count=1, bad_index=0)
    with ServerProcess("--model-repository", str(tmp_path / "models"), "--no-access-log") as server:
        async with (
            httpx.AsyncClient(base_url=server.url, timeout=10.0) as client,
            grpc.aio.insecure_channel(server.grpc_address) as channel,
        ):
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

            async def ready() -> bool:
                return (await client.get("/v2/health/ready")).status_code == 200

            async def not_ready() -> bool:
                return not await ready()

            async def grpc_ready() -> tuple[bool, bool]:
                """(ModelReady, ServerReady) over gRPC."""
                model = await stub.ModelReady(service_pb2.ModelReadyRequest(name="m"), timeout=10)
                whole = await stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=10)
                return model.ready, whole.ready

            assert await grpc_ready() == (True, True)
            answered = await client.post("/v2/models/m/infer", json=v2_body([[1, 2, 3, 4]]))
            assert answered.status_code == 200  # the inputs its probes will send, once it has answered them
            marker.touch()
            await _until(not_ready)  # its probes take it out: nothing is left in rotation
            assert (await client.get("/v2/models/m/ready")).status_code == 400
            assert await grpc_ready() == (False, False)
            assert (await client.get("/v2/health/live")).status_code == 200
            assert (await stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=10)).live
            answer = await client.post("/v2/models/m/infer", json=v2_body([[1, 2, 3, 4]]))
            assert answer.status_code == 503 and "has no available versions" in answer.json()["error"]
            marker.unlink()
            await _until(ready)
            assert (await client.get("/v2/models/m/ready")).status_code == 200
            assert await grpc_ready() == (True, True)
            assert (await client.post("/v2/models/m/infer", json=v2_body([[1, 2, 3, 4]]))).status_code == 200


async def test_an_input_the_model_refuses_everywhere_is_a_500_and_no_instance_s_fault(tmp_path: Path) -> None:
    """The model raises on this input on every instance: the retry on another instance raises too,
    so the input is at fault, not a device. The client gets the 500 of the error table, and however
    many such requests come, no instance counts a failure (with failure_threshold 3, each would be
    out several times over if they did)."""
    write_faulty_model(tmp_path / "models", "m", tmp_path / "never-created")
    with ServerProcess("--model-repository", str(tmp_path / "models"), "--no-access-log") as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=10.0) as client:
            for _ in range(24):
                answer = await client.post("/v2/models/m/infer", json=v2_body([[-1e7, 0, 0, 0]]))
                assert answer.status_code == 500
                assert answer.json() == {
                    "error": "model 'm' failed to execute the request: model refuses inputs below -1e6"
                }
            good = await client.post("/v2/models/m/infer", json=v2_body([[1, 2, 3, 4]]))
            assert good.status_code == 200 and good.json()["outputs"][0]["data"][0] == 2.0
            assert (await client.get("/v2/health/ready")).status_code == 200
        scraped = [
            await asyncio.to_thread(metric, server.metrics_url, name, model="m")
            for name in ("tensorgate_instance_healthy", "tensorgate_instance_restarts_total")
        ]
        assert scraped == [4.0, 0.0]  # all four in rotation, none ever restarted
        retried = await asyncio.to_thread(metric, server.metrics_url, "tensorgate_request_retries_total", model="m")
        assert retried >= 24  # each was retried on another instance before the client got its 500
        assert not any("out of rotation" in str(r.get("message")) for r in server.log_records())


async def test_a_poisoned_request_fails_alone_and_its_batch_mates_are_answered(tmp_path: Path) -> None:
    """One instance (the default), dynamic batching: eight requests queue behind a running batch and
    go as one, one of them an input the model refuses. That one gets the 500 with the model's own
    message; the seven others get their answers; the instance stays in rotation and is not
    restarted (the batch failed because of the input, not the device)."""
    write_faulty_model(tmp_path / "models", "m", None, count=1, bad_index=9, delay_ms=100)
    with ServerProcess("--model-repository", str(tmp_path / "models"), "--no-access-log") as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=10.0) as client:
            assert (await client.post("/v2/models/m/infer", json=v2_body([[0, 0, 0, 0]]))).status_code == 200
            first = asyncio.ensure_future(client.post("/v2/models/m/infer", json=v2_body([[0, 0, 0, 0]])))
            await _until(_in_flight(server))  # the instance is busy: the next eight queue behind it
            values = [float(v) for v in range(8)]
            values[5] = -1e7
            answers = await asyncio.gather(
                *(client.post("/v2/models/m/infer", json=v2_body([[v, 0, 0, 0]])) for v in values)
            )
            assert (await first).status_code == 200
            for value, answer in zip(values, answers, strict=True):
                if value < -1e6:
                    assert answer.status_code == 500
                    assert answer.json() == {
                        "error": "model 'm' failed to execute the request: model refuses inputs below -1e6"
                    }
                else:
                    assert answer.status_code == 200, answer.text
                    assert answer.json()["outputs"][0]["data"][0] == value + 1
            assert (await client.get("/v2/health/ready")).status_code == 200
        batches = [
            int(m.group(1))
            for r in server.log_records()
            if (m := re.search(r"raised on a batch of (\d+)", str(r.get("message"))))
        ]
        assert batches and batches[0] > 1  # they went as one batch, and it was split to find the input
        scraped = [
            await asyncio.to_thread(metric, server.metrics_url, name, model="m")
            for name in ("tensorgate_instance_healthy", "tensorgate_instance_restarts_total")
        ]
        assert scraped == [1.0, 0.0]
