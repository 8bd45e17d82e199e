"""Traffic between versions, served for real: a weighted split and its
band, sticky keys, weights changed live, a canary that rolls back or promotes itself, a shadow."""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import httpx
import yaml
from load_loop import Load
from model_builders import metric, v2_body, wait_until, write_version, write_versioned_model
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tensorgate.testing import ServerProcess

POLL = ("--model-control", "poll", "--repository-poll-secs", "0.2")


def _set_traffic(model_dir: Path, traffic: dict[str, Any] | None) -> None:
    document = yaml.safe_load((model_dir / "config.yaml").read_text())
    document.pop("traffic", None)
    if traffic is not None:
        document["traffic"] = traffic
    staged = model_dir / ".config.yaml.new"
    staged.write_text(yaml.safe_dump(document))
    staged.replace(model_dir / "config.yaml")


async def _versions(url: str, count: int, headers: dict[str, str] | None = None, clients: int = 16) -> Counter[str]:
    """``count`` requests from ``clients`` concurrent clients: how many each version answered."""
    seen: Counter[str] = Counter()
    remaining = [count]
    async with httpx.AsyncClient(timeout=30.0) as client:

        async def one_client() -> None:
            while remaining[0] > 0:
                remaining[0] -= 1
                response = await client.post(url, json=v2_body([[0, 0, 0, 0]]), headers=headers)
                assert response.status_code == 200, response.text
                document = response.json()
                assert document["outputs"][0]["data"][0] == float(document["model_version"])
                seen[document["model_version"]] += 1

        await asyncio.gather(*(one_client() for _ in range(clients)))
    return seen


async def test_a_90_10_split_over_5000_requests_is_within_its_band(tmp_path: Path) -> None:
    write_versioned_model(tmp_path, "m", [1, 2], traffic={"weights": {1: 90, 2: 10}})
    with ServerProcess("--model-repository", str(tmp_path), "--no-access-log") as server:
        seen = await _versions(f"{server.url}/v2/models/m/infer", 5000)
        share = seen["2"] / 5000
        assert abs(share - 0.10) <= 0.015, seen
        assert metric(server.metrics_url, "tensorgate_traffic_share", model="m", version="2") == 10
        assert metric(server.metrics_url, "tensorgate_traffic_share", model="m", version="1") == 90
        # A version named in the URL always wins over the split.
        async with httpx.AsyncClient() as client:
            pinned = await client.post(f"{server.url}/v2/models/m/versions/2/infer", json=v2_body([[0] * 4]))
        assert pinned.json()["model_version"] == "2"
        counted = {
            v: metric(server.metrics_url, "tensorgate_requests_total", model="m", version=v, outcome="success")
            for v in "12"
        }
        assert counted == {"1": seen["1"], "2": seen["2"] + 1}  # the metrics count requests per version


async def test_one_sticky_key_always_meets_one_version(tmp_path: Path) -> None:
    write_versioned_model(tmp_path, "m", [1, 2], traffic={"weights": {1: 50, 2: 50}})
    with ServerProcess("--model-repository", str(tmp_path), "--no-access-log") as server:
        url = f"{server.url}/v2/models/m/infer"
        by_key: dict[str, set[str]] = {}
        async with httpx.AsyncClient(timeout=10.0) as client:
            for round_ in range(3):
                for user in range(100):
                    headers = {"X-Traffic-Key": f"user-{user}"}
                    response = await client.post(url, json=v2_body([[round_] * 4]), headers=headers)
                    by_key.setdefault(f"user-{user}", set()).add(response.json()["model_version"])
        assert all(len(versions) == 1 for versions in by_key.values())
        assert {next(iter(v)) for v in by_key.values()} == {"1", "2"}  # and the keys spread over both
        # The same key over gRPC metadata meets the same version as over HTTP.
        with grpc.insecure_channel(server.grpc_address) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            request = service_pb2.ModelInferRequest(model_name="m")
            tensor = request.inputs.add(name="INPUT", datatype="FP32", shape=[1, 4])
            tensor.contents.fp32_contents.extend([0, 0, 0, 0])
            for user in range(20):
                answer = stub.ModelInfer(request, metadata=(("x-traffic-key", f"user-{user}"),))
                assert {answer.model_version} == by_key[f"user-{user}"]


async def test_weights_changed_live_move_traffic_without_a_reload_or_a_readiness_dip(tmp_path: Path) -> None:
    model_dir = write_versioned_model(tmp_path, "m", [1, 2], traffic={"weights": {1: 100, 2: 0}})
    with ServerProcess("--model-repository", str(tmp_path), *POLL, "--no-access-log") as server:
        url = f"{server.url}/v2/models/m/infer"
        loads = metric(server.metrics_url, "tensorgate_model_load_duration_seconds_count", model="m")
        readiness: list[int] = []
        stop = asyncio.Event()

        async def watch_readiness() -> None:
            async with httpx.AsyncClient(timeout=5.0) as client:
                while not stop.is_set():
                    readiness.append((await client.get(f"{server.url}/v2/health/ready")).status_code)
                    await asyncio.sleep(0.01)

        watcher = asyncio.create_task(watch_readiness())
        async with Load(url, clients=8, body=v2_body([[0, 0, 0, 0]])) as load:
            for weights, only in (({1: 50, 2: 50}, None), ({1: 0, 2: 100}, "2"), ({1: 100, 2: 0}, "1")):
                _set_traffic(model_dir, {"weights": weights})
                mark = len(load.answers)
                if only is None:
                    await load.until(lambda a, m=mark: {x.version for x in a[m:]} == {"1", "2"})
                else:  # once the new split holds, only its version answers
                    await load.until(
                        lambda a, m=mark, v=only: len(a) > m + 200 and {x.version for x in a[-100:]} == {v}
                    )
        stop.set()
        await watcher
        assert load.failures() == []
        assert set(readiness) == {200}
        assert metric(server.metrics_url, "tensorgate_model_load_duration_seconds_count", model="m") == loads


def _canary_model(root: Path, fail_every: int) -> Path:
    canary = {"version": 2, "steps": [10, 50, 100], "step_s": 0.3, "min_requests": 30, "max_p99_ratio": 20}
    model_dir = write_versioned_model(
        root, "m", [1], traffic={"canary": canary}, dynamic_batching={"max_batch_size": 1}
    )
    write_version(model_dir, 2, fail_every=fail_every)
    return model_dir


def _rollout(server: ServerProcess) -> dict[str, Any]:
    return httpx.get(f"{server.url}/v2/models/m/rollout").json()


async def test_a_canary_that_fails_is_rolled_back_at_its_first_step(tmp_path: Path) -> None:
    _canary_model(tmp_path, fail_every=5)  # one request in five fails
    with ServerProcess("--model-repository", str(tmp_path), "--no-access-log") as server:
        assert _rollout(server)["rollout"]["share"] == 10
        url = f"{server.url}/v2/models/m/infer"
        async with Load(url, clients=8, body=v2_body([[0, 0, 0, 0]])) as load:
            await load.until(lambda a: _rollout(server)["rollout"]["state"] != "stepping", timeout_s=60)
            decided, mark = time.time(), len(load.answers)
            await load.until(lambda a, m=mark: len(a) > m + 200)
        rollout = _rollout(server)["rollout"]
        assert rollout["state"] == "rolled_back" and rollout["step"] == 0 and rollout["share"] == 0
        assert "error rate" in rollout["reason"]
        after = [a for a in load.answers if a.sent > decided]
        assert after and {a.version for a in after} == {"1"}  # the stable version serves everything
        assert metric(server.metrics_url, "tensorgate_traffic_share", model="m", version="2") == 0
        assert metric(server.metrics_url, "tensorgate_rollout_state", model="m", state="rolled_back") == 1
        assert any("rolled back" in str(r.get("message")) for r in server.log_records())


async def test_a_healthy_canary_is_promoted_through_every_step(tmp_path: Path) -> None:
    _canary_model(tmp_path, fail_every=0)
    with ServerProcess("--model-repository", str(tmp_path), "--no-access-log") as server:
        url = f"{server.url}/v2/models/m/infer"
        async with Load(url, clients=8, body=v2_body([[0, 0, 0, 0]])) as load:
            await load.until(lambda a: _rollout(server)["rollout"]["state"] != "stepping", timeout_s=60)
            decided, mark = time.time(), len(load.answers)
            await load.until(lambda a, m=mark: len(a) > m + 100)
        assert load.failures() == []
        rollout = _rollout(server)["rollout"]
        assert rollout["state"] == "promoted" and rollout["share"] == 100
        assert [step["action"] for step in rollout["history"]] == ["advance", "promote"]
        assert all(step["canary"]["requests"] >= 30 for step in rollout["history"])
        after = [a for a in load.answers if a.sent > decided]
        assert after and {a.version for a in after} == {"2"}
        # Promoted: the old version goes as the version policy (latest: 1) says.
        wait_until(lambda: httpx.get(f"{server.url}/v2/models/m/versions/1/ready").status_code != 200)
        assert metric(server.metrics_url, "tensorgate_rollout_state", model="m", state="promoted") == 1
        steps = [str(r["message"]) for r in server.log_records() if "canary version 2" in str(r.get("message"))]
        assert any("moves to 50" in m for m in steps) and any("promoted" in m for m in steps)


async def test_a_shadow_gets_copies_that_clients_never_see(tmp_path: Path) -> None:
    model_dir = write_versioned_model(tmp_path, "m", [1], traffic={"shadow": {"version": 2, "fraction": 0.5}})
    write_version(model_dir, 2)  # answers 2 where version 1 answers 1: every compared copy differs
    with ServerProcess("--model-repository", str(tmp_path), "--no-access-log") as server:
        seen = await _versions(f"{server.url}/v2/models/m/infer", 400)
        assert seen == {"1": 400}  # the shadow is never the answer, though it is the latest version

        def compared() -> float:
            return metric(server.metrics_url, "tensorgate_shadow_requests_total", model="m", outcome="compared")

        wait_until(
            lambda: compared() > 0 and httpx.get(f"{server.url}/v2/models/m/rollout").json()["shadow"]["inflight"] == 0
        )
        copies = compared() + metric(server.metrics_url, "tensorgate_shadow_requests_total", model="m", outcome="shed")
        assert math.isclose(copies / 400, 0.5, abs_tol=0.1)
        assert metric(server.metrics_url, "tensorgate_shadow_mismatches_total", model="m") == compared()
        assert metric(server.metrics_url, "tensorgate_shadow_requests_total", model="m", outcome="failed") == 0
        assert metric(server.metrics_url, "tensorgate_shadow_max_abs_difference_count", model="m") == compared()
