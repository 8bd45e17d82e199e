"""The seed's scenario: one of four instances goes bad under load (it raises, or hangs), and clients
see no failed request while it is taken out of rotation, restarted and put back. An instance that
answers NaN is found by its idle probes. A model whose only instance goes bad turns not ready, and
ready again once it heals."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from load_loop import Load
from model_builders import metric, v2_body, write_faulty_model

from tensorgate.testing import ServerProcess

BAD = "m_1_2"


async def _until(holds: Callable[[], Awaitable[bool]], timeout_s: float = 30.0) -> None:
    """Poll the server (another process: nothing here to wait on) until ``holds``, with a deadline."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        if await holds():
            return
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.02)


def _instance_metric(server: ServerProcess, name: str) -> Callable[[], Awaitable[float]]:
    async def read() -> float:
        return await asyncio.to_thread(metric, server.metrics_url, name, model="m", instance=BAD)

    return read


def _left_and_rejoined(server: ServerProcess) -> None:
    messages = [str(r.get("message")) for r in server.log_records()]
    out = [m for m in messages if "out of rotation" in m]
    assert out and BAD in out[0] and " on cpu " in out[0]  # names the instance, its device, the error
    assert any(BAD in m and "back in rotation" in m for m in messages)


@pytest.mark.parametrize(("fault", "isolation"), [("fail", "thread"), ("hang", "thread"), ("fail", "process")])
async def test_one_bad_instance_of_four_leaves_and_rejoins_with_no_failed_request(
    tmp_path: Path, fault: str, isolation: str
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
        _left_and_rejoined(server)


async def test_an_instance_answering_nan_is_found_by_its_idle_probes(tmp_path: Path) -> None:
    marker = tmp_path / "broken"
    write_faulty_model(tmp_path / "models", "m", marker, fault="nan")
    with ServerProcess("--model-repository", str(tmp_path / "models"), "--no-access-log") as server:
        healthy = _instance_metric(server, "tensorgate_instance_healthy")
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
        assert failed >= 3
        _left_and_rejoined(server)


async def _equals(read: Callable[[], Awaitable[float]], value: float, *, at_least: bool = False) -> bool:
    measured = await read()
    return measured >= value if at_least else measured == value


async def test_a_model_whose_only_instance_goes_bad_is_not_ready_until_it_heals(tmp_path: Path) -> None:
    marker = tmp_path / "broken"
    write_faulty_model(tmp_path / "models", "m", marker, count=1, bad_index=0)
    with ServerProcess("--model-repository", str(tmp_path / "models"), "--no-access-log") as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=10.0) as client:

            async def ready() -> bool:
                return (await client.get("/v2/health/ready")).status_code == 200

            async def not_ready() -> bool:
                return not await ready()

            marker.touch()
            await _until(not_ready)  # its probes take it out: nothing is left in rotation
            assert (await client.get("/v2/models/m/ready")).status_code == 400
            assert (await client.get("/v2/health/live")).status_code == 200
            answer = await client.post("/v2/models/m/infer", json=v2_body([[1, 2, 3, 4]]))
            assert answer.status_code == 503 and "no ready version" in answer.json()["error"]
            marker.unlink()
            await _until(ready)
            assert (await client.get("/v2/models/m/ready")).status_code == 200
            assert (await client.post("/v2/models/m/infer", json=v2_body([[1, 2, 3, 4]]))).status_code == 200
