"""Hot reload in poll mode: versions copied into the repository under load
swap without a failed request; half-copied, corrupt and invalid changes never disturb what serves.

The server polls every 0.2 s; a change is applied once two scans agree on it.
"""

from __future__ import annotations

import asyncio
import datetime
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml
from load_loop import Answer, Load
from model_builders import metric, v2_body, wait_until, write_admin_keys, write_version, write_versioned_model
from onnx import TensorProto, helper, numpy_helper

from tensorgate.testing import ServerProcess

POLL = ("--model-control", "poll", "--repository-poll-secs", "0.2")
ADMIN_KEY = "hot-reload-admin-key-0123456789"


def _log_times(server: ServerProcess, model: str, event: str) -> dict[int, float]:
    """When each version of ``model`` logged ``event`` ("is READY", "is draining"), as time.time()."""
    times = {}
    prefix = f"model {model} version "
    for record in server.log_records():
        message = str(record.get("message", ""))
        if message.startswith(prefix) and message.endswith(event):
            version = int(message[len(prefix) :].split()[0])
            stamp = datetime.datetime.strptime(record["ts"], "%Y-%m-%dT%H:%M:%S.%fZ")
            times[version] = stamp.replace(tzinfo=datetime.UTC).timestamp()
    return times


def _versions_seen_after(answers: list[Answer], version: str) -> bool:
    """Every client has had an answer from ``version``."""
    return len({a.client for a in answers if a.version == version}) == 16


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    root.mkdir()
    return root


async def test_h1_versions_copied_in_under_load_swap_with_no_failed_request(repo: Path, tmp_path: Path) -> None:
    model_dir = write_versioned_model(repo, "m", [1], dynamic_batching={"max_queue_delay_ms": 1})
    with ServerProcess("--model-repository", str(repo), *POLL, "--no-access-log") as server:
        async with Load(f"{server.url}/v2/models/m/infer", clients=16, body=v2_body([[0, 0, 0, 0]])) as load:
            await load.until(lambda answers: len(answers) >= 200)
            for version in (2, 3, 4):
                write_version(model_dir, version, delay_ms=1, staging=tmp_path)
                await load.until(lambda answers, v=str(version): _versions_seen_after(answers, v))
            answers = list(load.answers)
        ready = _log_times(server, "m", "is READY")
        draining = _log_times(server, "m", "is draining")
    assert load.failures() == [], load.failures()[:3]
    assert {a.version for a in answers} == {"1", "2", "3", "4"}
    # The version that computed each answer is the one the answer names: admitted to v1, finished on v1.
    assert all(a.computed_by == float(a.version) for a in answers)
    for answer in answers:  # READY before the answer came, and not yet draining when it was sent
        number = int(answer.version)
        assert ready.get(number, 0.0) <= answer.received + 0.005
        assert answer.sent <= draining.get(number, float("inf")) + 0.005
    for client in range(16):  # latest: 1, so each client moves forward only, one version at a time
        seen = [int(a.version) for a in answers if a.client == client]
        assert seen == sorted(seen)
    assert sorted(draining) == [1, 2, 3]


def _big_onnx(factor: float, megabytes: int) -> bytes:
    """y = x * factor, with a large unused initializer so the file takes a while to write."""
    k = numpy_helper.from_array(np.array([factor], dtype=np.float32), "k")
    pad = numpy_helper.from_array(np.zeros(megabytes * 262_144, dtype=np.float32), "pad")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "k"], ["y"])],
        "scale",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        [k, pad],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _answer(client: httpx.Client, url: str) -> tuple[str, float]:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 1]}]}
    response = client.post(f"{url}/v2/models/scale/infer", json=body)
    assert response.status_code == 200, response.text
    document = response.json()
    return document["model_version"], document["outputs"][0]["data"][0]


@pytest.fixture
def scale_server(repo: Path, tmp_path: Path) -> Iterator[tuple[ServerProcess, Path]]:
    (repo / "scale" / "1").mkdir(parents=True)
    (repo / "scale" / "1" / "model.onnx").write_bytes(_big_onnx(1.0, 1))
    keys = write_admin_keys(tmp_path, ADMIN_KEY)
    with ServerProcess("--model-repository", str(repo), *POLL, "--admin-keys-file", str(keys)) as server:
        yield server, repo / "scale"


def test_a_model_written_slowly_is_loaded_only_once_complete(repo: Path) -> None:
    # Scans 1 s apart against a write every 0.05 s for 2.5 s: the file is seen still growing unless
    # the writer stalls for a whole second, which the test would then report as a failed load.
    (repo / "scale" / "1").mkdir(parents=True)
    (repo / "scale" / "1" / "model.onnx").write_bytes(_big_onnx(1.0, 1))
    model_dir = repo / "scale"
    slow_poll = ("--model-control", "poll", "--repository-poll-secs", "1")
    data = _big_onnx(2.0, 16)
    step = len(data) // 50
    with (
        ServerProcess("--model-repository", str(repo), *slow_poll) as server,
        httpx.Client(timeout=10.0) as client,
    ):
        (model_dir / "2").mkdir()
        with open(model_dir / "2" / "model.onnx", "wb") as out:
            for start in range(0, len(data), step):  # a slow copy
                out.write(data[start : start + step])
                out.flush()
                assert _answer(client, server.url) == ("1", 1.0)  # v1 serves throughout
                time.sleep(0.05)
        wait_until(lambda: _answer(client, server.url) == ("2", 2.0), timeout_s=30)
        # Never tried half-written: no failed load, and v2 loaded once.
        assert metric(server.metrics_url, "tensorgate_model_load_failures_total", model="scale") == 0
        count = metric(server.metrics_url, "tensorgate_model_load_duration_seconds_count", model="scale", version="2")
        assert count == 1


def test_a_corrupt_version_leaves_the_serving_one_and_loads_once_fixed(
    scale_server: tuple[ServerProcess, Path], tmp_path: Path
) -> None:
    server, model_dir = scale_server
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "model.onnx").write_bytes(b"not an onnx model at all")
    (tmp_path / "v2").rename(model_dir / "2")
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.Client(timeout=10.0) as client:

        def state_of_2() -> dict[str, str]:
            rows = client.post(f"{server.url}/v2/repository/index", headers=auth).json()
            return next((r for r in rows if r["name"] == "scale" and r["version"] == "2"), {})

        wait_until(lambda: state_of_2().get("state") == "FAILED")
        assert state_of_2()["reason"]
        # The model's status (TF Serving's, on V1) names the failure too.
        statuses = client.get(f"{server.url}/v1/models/scale").json()["model_version_status"]
        states = {s["version"]: s for s in statuses}
        assert states["1"]["state"] == "AVAILABLE" and states["2"]["state"] == "END"
        assert states["2"]["status"]["error_message"] == state_of_2()["reason"]
        assert [_answer(client, server.url) for _ in range(50)] == [("1", 1.0)] * 50  # all of it to v1
        assert client.get(f"{server.url}/v2/health/ready").status_code == 200
        pinned = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 1]}]}
        assert client.post(f"{server.url}/v2/models/scale/versions/2/infer", json=pinned).status_code == 503
        # Fixed in place: the changed file is tried again, and v2 takes over.
        (model_dir / "2" / "model.onnx").write_bytes(_big_onnx(2.0, 1))
        wait_until(lambda: _answer(client, server.url) == ("2", 2.0), timeout_s=30)
        wait_until(lambda: state_of_2().get("state") == "READY")
    assert metric(server.metrics_url, "tensorgate_model_load_failures_total", model="scale", version="2") == 1


def _config(model_dir: Path) -> dict[str, object]:
    return dict(yaml.safe_load((model_dir / "config.yaml").read_text()))


def _write_config(model_dir: Path, document: dict[str, object]) -> None:
    staged = model_dir / ".config.yaml.new"
    staged.write_text(yaml.safe_dump(document))
    staged.replace(model_dir / "config.yaml")


def test_a_changed_config_reloads_the_model_and_an_invalid_one_is_refused(repo: Path) -> None:
    model_dir = write_versioned_model(repo, "m", [1])
    with ServerProcess("--model-repository", str(repo), *POLL) as server, httpx.Client(timeout=10.0) as client:
        url = f"{server.url}/v2/models/m"

        def max_batch() -> object:
            return client.get(f"{url}/config").json()["max_batch_size"]

        assert max_batch() == 8
        document = _config(model_dir)
        _write_config(model_dir, {**document, "max_batch_size": 4})
        wait_until(lambda: max_batch() == 4, timeout_s=30)
        body = v2_body([[0, 0, 0, 0]] * 6)
        assert client.post(f"{url}/infer", json=body).status_code == 400  # the new limit holds
        # An invalid config: logged with its file, key and expectation; counted; the old one serves on.
        _write_config(model_dir, {**document, "max_batch_size": -3})
        wait_until(lambda: metric(server.metrics_url, "tensorgate_model_config_errors_total", model="m") == 1)
        assert max_batch() == 4
        assert client.post(f"{url}/infer", json=v2_body([[0, 0, 0, 0]])).status_code == 200
        assert client.get(f"{server.url}/v2/health/ready").status_code == 200
        errors = [r["message"] for r in server.log_records() if r.get("level") == "error"]
    assert any("config.yaml" in m and "max_batch_size" in m and "greater than or equal to 0" in m for m in errors)


def test_a_new_model_is_loaded_and_a_removed_one_unloaded_after_its_drain(repo: Path, tmp_path: Path) -> None:
    write_versioned_model(repo, "stays", [1])
    write_versioned_model(repo, "goes", [1], parameters={})
    slow = repo / "goes" / "1" / "model.py"
    slow.write_text(slow.read_text().replace("DELAY_S = 0.0", "DELAY_S = 2.0"))
    with ServerProcess("--model-repository", str(repo), *POLL) as server, httpx.Client(timeout=10.0) as client:
        staged = write_versioned_model(tmp_path, "arrives", [1])
        shutil.move(staged, repo / "arrives")
        wait_until(lambda: client.get(f"{server.url}/v2/models/arrives/ready").status_code == 200, timeout_s=30)
        assert client.post(f"{server.url}/v2/models/arrives/infer", json=v2_body([[0] * 4])).json()["model_version"]
        # A request running on "goes" when its directory disappears still gets its answer.
        result: dict[str, int] = {}

        def slow_request() -> None:
            with httpx.Client(timeout=10.0) as own:
                result["status"] = own.post(f"{server.url}/v2/models/goes/infer", json=v2_body([[0] * 4])).status_code

        thread = threading.Thread(target=slow_request)
        thread.start()
        wait_until(lambda: metric(server.metrics_url, "tensorgate_inflight_requests", model="goes") == 1)
        shutil.rmtree(repo / "goes")
        thread.join(10)
        assert result == {"status": 200}
        wait_until(lambda: client.get(f"{server.url}/v2/models/goes").status_code == 404, timeout_s=30)
        assert client.get(f"{server.url}/v2/health/ready").status_code == 200
        assert client.post(f"{server.url}/v2/models/stays/infer", json=v2_body([[0] * 4])).status_code == 200


# Version 2's load waits for the test to open a gate (a file): the server is caught mid-load.
GATED_LOAD = """
import os
import time

import numpy as np

from tensorgate import PythonModel

GATE = {gate!r}


class Gated(PythonModel):
    def load(self, context):
        deadline = time.monotonic() + 60
        while not os.path.exists(GATE) and time.monotonic() < deadline:
            time.sleep(0.01)
        self.version = float(context.version)

    def execute(self, inputs):
        return {{"OUTPUT": np.full(inputs["INPUT"].shape, self.version, dtype=np.float32)}}
"""


async def test_h3_a_slow_load_blocks_neither_health_nor_the_serving_version(repo: Path, tmp_path: Path) -> None:
    model_dir = write_versioned_model(repo, "m", [1])
    gate = tmp_path / "gate"
    keys = write_admin_keys(tmp_path, ADMIN_KEY)
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with ServerProcess("--model-repository", str(repo), *POLL, "--admin-keys-file", str(keys)) as server:
        async with (
            httpx.AsyncClient(base_url=server.url, timeout=10.0) as client,
            Load(f"{server.url}/v2/models/m/infer", clients=4, body=v2_body([[0, 0, 0, 0]])) as load,
        ):

            async def state_of_2() -> str:
                rows = (await client.post("/v2/repository/index", headers=auth)).json()
                return next((r["state"] for r in rows if r["name"] == "m" and r["version"] == "2"), "")

            staged = tmp_path / "v2"
            staged.mkdir()
            (staged / "model.py").write_text(GATED_LOAD.format(gate=str(gate)))
            staged.rename(model_dir / "2")
            deadline = time.monotonic() + 30
            while await state_of_2() != "LOADING":
                assert time.monotonic() < deadline, "version 2 never showed LOADING"
                await asyncio.sleep(0.02)
            # Mid-load: liveness, readiness and version 1's answers come as usual, and promptly.
            before = len(load.answers)
            for _ in range(20):
                started = time.monotonic()
                assert (await client.get("/v2/health/live")).status_code == 200
                assert (await client.get("/v2/health/ready")).status_code == 200
                answer = await client.post("/v2/models/m/infer", json=v2_body([[0, 0, 0, 0]]))
                assert (answer.status_code, answer.json()["model_version"]) == (200, "1")
                assert time.monotonic() - started < 2.0  # bounded, not timed: a blocked loop waits 60 s
            await load.until(lambda answers: len(answers) >= before + 50)
            assert await state_of_2() == "LOADING"  # still loading all along
            gate.touch()
            await load.until(lambda answers: any(a.version == "2" for a in answers))
    assert load.failures() == [], load.failures()[:3]


async def test_h6_an_instance_count_changed_under_load_swaps_with_no_failed_request(repo: Path) -> None:
    model_dir = write_versioned_model(repo, "m", [1], instance_group=[{"count": 1, "kind": "cpu"}])
    with ServerProcess("--model-repository", str(repo), *POLL, "--no-access-log") as server:
        async with (
            httpx.AsyncClient(base_url=server.url, timeout=10.0) as client,
            Load(f"{server.url}/v2/models/m/infer", clients=16, body=v2_body([[0, 0, 0, 0]])) as load,
        ):

            async def instances() -> int:
                document = (await client.get("/v2/models/m/config")).json()
                return sum(group["count"] for group in document["instance_group"])

            await load.until(lambda answers: len(answers) >= 200)
            assert await instances() == 1
            _write_config(model_dir, {**_config(model_dir), "instance_group": [{"count": 3, "kind": "cpu"}]})
            deadline = time.monotonic() + 30
            while await instances() != 3:
                assert time.monotonic() < deadline, "the new instance count never took over"
                await asyncio.sleep(0.02)
            swapped = len(load.answers)
            await load.until(lambda answers: len(answers) >= swapped + 200)
            # The copy with the old configuration drains and unloads while the new one serves.
            deadline = time.monotonic() + 30
            while 1 not in _log_times(server, "m", "is unloaded"):
                assert time.monotonic() < deadline, "the copy with the old configuration never unloaded"
                await asyncio.sleep(0.02)
    assert load.failures() == [], load.failures()[:3]
