"""Instances over real HTTP: worker processes that die under load, warm-up before readiness."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from pathlib import Path

import httpx
import psutil
import pytest
from model_builders import metric, v2_body, wait_until, write_python_model

from tensorgate.testing import ServerProcess


def _workers(server: ServerProcess) -> list[int]:
    assert server.process is not None
    children = psutil.Process(server.process.pid).children()
    return [c.pid for c in children if "tensorgate.instances.worker_main" in " ".join(c.cmdline())]


async def test_killing_a_worker_under_load_loses_no_request(tmp_path: Path) -> None:
    running = tmp_path / "running"
    running.mkdir()
    write_python_model(
        tmp_path / "repo",
        "delay",
        parameters={"delay_ms": 150, "running_dir": str(running)},
        dynamic_batching={"max_queue_delay_ms": 2},
        instance_group=[{"count": 2, "isolation": "process"}],
    )
    with ServerProcess("--model-repository", str(tmp_path / "repo")) as server:
        workers = _workers(server)
        assert len(workers) == 2
        failures: list[str] = []
        done = 0

        async def client(index: int, until: float) -> None:
            nonlocal done
            async with httpx.AsyncClient(timeout=30.0) as http:
                while time.monotonic() < until:
                    response = await http.post(f"{server.url}/v2/models/delay/infer", json=v2_body([[index] * 4]))
                    if response.status_code != 200 or response.json()["outputs"][0]["data"] != [index + 1.0] * 4:
                        failures.append(f"{response.status_code} {response.text[:200]}")
                    done += 1

        async def killer() -> None:
            # In the middle of a batch: the worker's marker exists only while it runs one (150 ms).
            await asyncio.to_thread(wait_until, (running / str(workers[0])).exists, 10.0)
            os.kill(workers[0], signal.SIGKILL)

        until = time.monotonic() + 3.0
        await asyncio.gather(*(client(i, until) for i in range(8)), killer())
        assert failures == []
        assert done > 20
        # The batch the worker died in was retried on the other instance, not lost or failed.
        assert metric(server.metrics_url, "tensorgate_request_retries_total", model="delay") >= 1
        await asyncio.to_thread(
            wait_until, lambda: metric(server.metrics_url, "tensorgate_instance_restarts_total", model="delay") == 1
        )
        replaced = _workers(server)
        assert len(replaced) == 2 and workers[0] not in replaced
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"{server.url}/v2/health/ready")).status_code == 200
        assert metric(server.metrics_url, "tensorgate_instance_healthy", model="delay") == 2


def test_a_restarted_worker_is_warmed_up_before_it_takes_requests(tmp_path: Path) -> None:
    """The first call of each new worker process is slow; a worker restarted after a crash runs the
    warm-up before it rejoins, so the first request it serves is as fast as any."""
    write_python_model(
        tmp_path,
        "cold",
        parameters={"delay_ms": 1, "first_call_ms": 1500},
        instance_group=[{"count": 1, "isolation": "process"}],
        warmup=[{"name": "zeros", "inputs": "zeros", "batch_size": 1, "count": 1}],
    )
    with ServerProcess("--model-repository", str(tmp_path)) as server:
        [worker] = _workers(server)
        os.kill(worker, signal.SIGKILL)
        wait_until(lambda: metric(server.metrics_url, "tensorgate_instance_restarts_total", model="cold") == 1, 30)
        # Back in rotation only after its warm-up (the restart took the 1.5 s first call itself).
        assert httpx.get(f"{server.url}/v2/models/cold/ready").status_code == 200
        first, steady = _first_and_steady(server)
    assert first < 0.5
    assert first < steady * 5 + 0.05


def test_worker_processes_run_on_the_cpus_their_group_names(tmp_path: Path) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    sets = [[allowed[0]], allowed[-1:]]
    write_python_model(tmp_path, "pinned", instance_group=[{"count": 2, "isolation": "process", "cpus": sets}])
    with ServerProcess("--model-repository", str(tmp_path)) as server:
        pinned = sorted(sorted(os.sched_getaffinity(pid)) for pid in _workers(server))
        assert pinned == sorted(sets)
        response = httpx.post(f"{server.url}/v2/models/pinned/infer", json=v2_body([[1, 2, 3, 4]]), timeout=30)
        assert response.status_code == 200
        # Each worker's own CPU and memory are exported beside the server's.
        for instance in ("pinned_1_0", "pinned_1_1"):
            rss = metric(server.metrics_url, "tensorgate_worker_resident_memory_bytes", instance=instance)
            assert rss > 20 * 1024 * 1024, instance  # an interpreter with numpy and the model loaded
            assert metric(server.metrics_url, "tensorgate_worker_cpu_seconds_total", instance=instance) > 0


def _first_and_steady(server: ServerProcess) -> tuple[float, float]:
    with httpx.Client(timeout=30.0) as http:
        timings = []
        for _ in range(6):
            started = time.perf_counter()
            response = http.post(f"{server.url}/v2/models/cold/infer", json=v2_body([[1, 2, 3, 4]]))
            assert response.status_code == 200
            timings.append(time.perf_counter() - started)
    steady = sorted(timings[1:])[len(timings[1:]) // 2]
    return timings[0], steady


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_warm_up_absorbs_the_slow_first_call(tmp_path: Path, isolation: str) -> None:
    write_python_model(
        tmp_path,
        "cold",
        parameters={"delay_ms": 1, "first_call_ms": 1500},
        instance_group=[{"count": 1, "isolation": isolation}],
        warmup=[{"name": "zeros", "inputs": "zeros", "batch_size": 2, "count": 1}],
    )
    with ServerProcess("--model-repository", str(tmp_path), wait_ready=False) as server:
        # Listening at once, but not ready until warm-up has run on every instance.
        ready_codes = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            code = httpx.get(f"{server.url}/v2/health/ready").status_code
            ready_codes.append(code)
            if code == 200:
                break
            time.sleep(0.02)
        assert ready_codes[0] == 400 and ready_codes[-1] == 200
        first, steady = _first_and_steady(server)
    # The first client call costs what any call costs, not the 1.5 s the model spends on its first run.
    assert first < 0.5
    assert first < steady * 5 + 0.05


def test_without_warm_up_the_first_call_is_slow(tmp_path: Path) -> None:
    """The negative control: the same model without warm-up makes its first client wait."""
    write_python_model(tmp_path, "cold", parameters={"delay_ms": 1, "first_call_ms": 1500})
    with ServerProcess("--model-repository", str(tmp_path)) as server:
        first, steady = _first_and_steady(server)
    assert first >= 1.5 > steady


CRASHY_MODEL = """
import os
from pathlib import Path

import numpy as np

from tensorgate import PythonModel


class Crashy(PythonModel):
    def load(self, context):
        # Loads fine the first time; once the marker exists every later start fails.
        if Path(context.parameters["marker"]).exists():
            raise RuntimeError("refusing to start")

    def execute(self, inputs):
        return {"OUTPUT": (inputs["INPUT"] + 1.0).astype(np.float32)}
"""


def test_a_crash_looping_worker_takes_the_model_out_of_readiness_until_it_recovers(tmp_path: Path) -> None:
    marker = tmp_path / "broken"
    repo = tmp_path / "repo"
    write_python_model(
        repo,
        "crashy",
        code=CRASHY_MODEL,
        parameters={"marker": str(marker)},
        instance_group=[{"count": 1, "isolation": "process"}],
    )
    with ServerProcess("--model-repository", str(repo)) as server:
        [worker] = _workers(server)
        marker.write_text("from now on the model fails to load")
        os.kill(worker, signal.SIGKILL)
        # Out of rotation at once; then backoff 0, 0.5, 1, 2, 4 s between failed starts, and it stays down.
        wait_until(lambda: httpx.get(f"{server.url}/v2/models/crashy/ready").status_code == 400, timeout_s=10)
        wait_until(lambda: "restarts in a row: a crash loop" in server.log(), timeout_s=30)
        assert len(re.findall(r"restart \d+ failed", server.log())) == 5, server.log()
        assert httpx.get(f"{server.url}/v2/health/ready").status_code == 400
        assert httpx.get(f"{server.url}/v2/health/live").status_code == 200
        response = httpx.post(f"{server.url}/v2/models/crashy/infer", json=v2_body([[1, 2, 3, 4]]))
        assert response.status_code == 503
        assert metric(server.metrics_url, "tensorgate_instance_healthy", model="crashy") == 0
        # No zombie: the dead workers were reaped.
        assert server.process is not None
        children = psutil.Process(server.process.pid).children()
        assert all(c.status() != psutil.STATUS_ZOMBIE for c in children)
        # Once the cause is gone the next try (the backoff has reached 8 s) brings the instance back.
        marker.unlink()
        wait_until(lambda: httpx.get(f"{server.url}/v2/models/crashy/ready").status_code == 200, timeout_s=45)
        assert httpx.post(f"{server.url}/v2/models/crashy/infer", json=v2_body([[1, 2, 3, 4]])).status_code == 200


SLOW_CRASHY_MODEL = CRASHY_MODEL.replace(
    "    def execute(self, inputs):\n",
    "    def execute(self, inputs):\n        import time\n\n        time.sleep(0.3)\n",
)


async def test_requests_queued_on_a_worker_that_cannot_restart_are_answered_not_stranded(tmp_path: Path) -> None:
    """One instance, requests running and queued on it, then it dies and cannot come back: they are
    answered with 503 as soon as the restart fails, instead of waiting out a crash loop (they carry
    no deadline, so nothing else would ever end them)."""
    marker = tmp_path / "broken"
    write_python_model(
        tmp_path / "repo",
        "crashy",
        code=SLOW_CRASHY_MODEL,
        max_batch_size=1,
        parameters={"marker": str(marker)},
        instance_group=[{"count": 1, "isolation": "process"}],
    )
    with ServerProcess("--model-repository", str(tmp_path / "repo")) as server:
        [worker] = _workers(server)
        async with httpx.AsyncClient(timeout=60.0) as http:
            calls = [
                asyncio.ensure_future(http.post(f"{server.url}/v2/models/crashy/infer", json=v2_body([[i] * 4])))
                for i in range(3)
            ]
            await asyncio.to_thread(
                wait_until, lambda: metric(server.metrics_url, "tensorgate_inflight_requests", model="crashy") == 3
            )
            marker.write_text("from now on the model fails to load")
            killed_at = time.monotonic()
            os.kill(worker, signal.SIGKILL)
            responses = await asyncio.wait_for(asyncio.gather(*calls), 20.0)
            answered_after = time.monotonic() - killed_at
        assert [r.status_code for r in responses] == [503, 503, 503]
        assert all("no healthy instance" in r.json()["error"] for r in responses)
        assert all(r.headers.get("retry-after") for r in responses)
        assert answered_after < 10.0  # the first restart (at once) failed: no waiting for the next tries
        assert metric(server.metrics_url, "tensorgate_inflight_requests", model="crashy") == 0
        marker.unlink()


def test_a_worker_killed_during_the_first_warm_up_is_restarted_and_the_version_serves(tmp_path: Path) -> None:
    """Killed while it warms up for the first time: the version still turns READY on the other
    instance, and the killed one rejoins once restarted and warmed (before, the whole version failed
    for good)."""
    running = tmp_path / "running"
    running.mkdir()
    repo = tmp_path / "repo"
    write_python_model(
        repo,
        "warming",
        parameters={"delay_ms": 1, "first_call_ms": 1500, "running_dir": str(running)},
        instance_group=[{"count": 2, "isolation": "process"}],
        warmup=[{"name": "zeros", "inputs": "zeros", "batch_size": 1, "count": 1}],
    )
    with ServerProcess("--model-repository", str(repo), wait_ready=False) as server:
        wait_until(lambda: any(running.iterdir()))  # a worker is inside its warm-up call
        victim = int(next(running.iterdir()).name)
        os.kill(victim, signal.SIGKILL)
        server.wait_ready()
        assert httpx.post(f"{server.url}/v2/models/warming/infer", json=v2_body([[1, 2, 3, 4]])).status_code == 200
        wait_until(lambda: metric(server.metrics_url, "tensorgate_instance_restarts_total", model="warming") == 1, 30)
        assert metric(server.metrics_url, "tensorgate_instance_healthy", model="warming") == 2
        assert victim not in _workers(server) and len(_workers(server)) == 2
        assert "died during warm-up" in server.log()
