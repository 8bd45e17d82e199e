"""Triton's model repository extension with Triton's own clients (HTTP and gRPC): who may call it
(403 outside explicit mode, 401 without the admin key), index, load with a config override, unload
(which drains what was admitted), and what it refuses (model files in the request)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from load_loop import Load
from model_builders import metric, v2_body, wait_until, write_admin_keys, write_versioned_model
from tritonclient.utils import InferenceServerException

from tensorgate.testing import ServerProcess

KEY = "repository-api-admin-key-3141592653"
ADMIN = {"authorization": f"Bearer {KEY}"}


def _repo(root: Path) -> Path:
    repo = root / "models"
    write_versioned_model(repo, "alpha", [1, 2], version_policy={"all": True})
    write_versioned_model(repo, "beta", [1], dynamic_batching={"max_batch_size": 4}, parameters={})
    slow = repo / "beta" / "1" / "model.py"
    slow.write_text(slow.read_text().replace("DELAY_S = 0.0", "DELAY_S = 0.02"))
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("explicit")
    keys = write_admin_keys(root, KEY, "a-second-admin-key-for-rotation")
    args = ("--model-repository", str(_repo(root)), "--model-control", "explicit", "--admin-keys-file", str(keys))
    with ServerProcess(*args, "--no-access-log") as process:
        yield process


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[Any]:
    if request.param == "http":
        with httpclient.InferenceServerClient(server.http_address) as http:
            yield http
    else:
        with grpcclient.InferenceServerClient(server.grpc_address) as grpc:
            yield grpc


def _status(error: InferenceServerException) -> str:
    return str(error.status())


def _index(client: Any, **kwargs: Any) -> list[dict[str, str]]:
    if isinstance(client, grpcclient.InferenceServerClient):
        rows = client.get_model_repository_index(as_json=True, **kwargs).get("models", [])
        return [{"version": "", "reason": "", **row} for row in rows]
    return list(client.get_model_repository_index(**kwargs))


def test_without_the_admin_key_every_call_is_401(server: ServerProcess, client: Any) -> None:
    for headers in (None, {"authorization": "Bearer not-a-key-that-exists"}, {"authorization": KEY}):
        for call in (
            lambda h=headers: client.get_model_repository_index(headers=h),
            lambda h=headers: client.load_model("alpha", headers=h),
            lambda h=headers: client.unload_model("alpha", headers=h),
        ):
            with pytest.raises(InferenceServerException) as caught:
                call()
            assert _status(caught.value) in ("401", "StatusCode.UNAUTHENTICATED")
    assert client.is_model_ready("alpha")


def test_a_401_names_the_bearer_scheme(server: ServerProcess) -> None:
    response = httpx.post(f"{server.url}/v2/repository/index")
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert "admin key" in response.json()["error"]


def test_index_lists_every_model_with_its_versions_and_states(server: ServerProcess, client: Any) -> None:
    rows = _index(client, headers=ADMIN)
    found = {(r["name"], r["version"]): r["state"] for r in rows}
    assert found[("alpha", "1")] == found[("alpha", "2")] == found[("beta", "1")] == "READY"
    assert _index(client, headers={"authorization": "Bearer a-second-admin-key-for-rotation"})


def test_unload_then_load_again(server: ServerProcess, client: Any) -> None:
    client.unload_model("alpha", headers=ADMIN)
    assert not client.is_model_ready("alpha")
    assert [r for r in _index(client, headers=ADMIN) if r["name"] == "alpha"] == [
        {"name": "alpha", "version": "", "state": "UNAVAILABLE", "reason": "unloaded"}
    ]
    answer = httpx.post(f"{server.url}/v2/models/alpha/infer", json=v2_body([[0, 0, 0, 0]]))
    assert answer.status_code == 503
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200  # an unloaded model does not count
    client.load_model("alpha", headers=ADMIN)
    assert client.is_model_ready("alpha") and client.is_model_ready("alpha", "1")
    assert httpx.post(f"{server.url}/v2/models/alpha/infer", json=v2_body([[0, 0, 0, 0]])).status_code == 200


def test_a_load_with_only_new_weights_moves_traffic_without_reloading(server: ServerProcess, client: Any) -> None:
    loads = metric(server.metrics_url, "tensorgate_model_load_duration_seconds_count", model="alpha")
    config = {
        "backend": "python",
        "max_batch_size": 8,
        "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "OUTPUT", "datatype": "FP32", "shape": [-1, 4]}],
        "version_policy": {"all": True},
    }
    for weights, expected in (({"1": 100, "2": 0}, {"1"}), ({"1": 0, "2": 100}, {"2"})):
        client.load_model("alpha", headers=ADMIN, config=json.dumps({**config, "traffic": {"weights": weights}}))
        with httpx.Client(timeout=10.0) as http:
            seen = {
                http.post(f"{server.url}/v2/models/alpha/infer", json=v2_body([[0] * 4])).json()["model_version"]
                for _ in range(40)
            }
        assert seen == expected
    assert metric(server.metrics_url, "tensorgate_model_load_duration_seconds_count", model="alpha") == loads
    client.load_model("alpha", headers=ADMIN)  # back to the file's configuration


def test_loading_refuses_files_and_unknown_models(server: ServerProcess, client: Any) -> None:
    with pytest.raises(InferenceServerException) as caught:
        client.load_model("alpha", headers=ADMIN, config="{}", files={"file:1/model.py": b"print('pwned')"})
    assert _status(caught.value) in ("400", "StatusCode.INVALID_ARGUMENT")
    assert "file:" in str(caught.value)
    with pytest.raises(InferenceServerException) as caught:
        client.load_model("not_in_the_repository", headers=ADMIN)
    assert _status(caught.value) in ("404", "StatusCode.NOT_FOUND")
    with pytest.raises(InferenceServerException) as caught:
        client.load_model("alpha", headers=ADMIN, config='{"max_batch_size": "eight"}')
    assert _status(caught.value) in ("400", "StatusCode.INVALID_ARGUMENT")
    assert "max_batch_size" in str(caught.value)
    assert client.is_model_ready("alpha")


async def test_unload_under_load_drains_what_was_admitted(server: ServerProcess) -> None:
    url = f"{server.url}/v2/models/beta/infer"
    async with httpx.AsyncClient(timeout=30.0) as admin:
        async with Load(url, clients=16, body=v2_body([[0, 0, 0, 0]])) as load:
            await load.until(lambda answers: len(answers) >= 100)
            assert (
                await admin.post(f"{server.url}/v2/repository/models/beta/unload", headers=ADMIN)
            ).status_code == 200
            await load.until(lambda answers: sum(a.status == 503 for a in answers) >= 16)
        answers = load.answers
        # Admitted before the unload: answered by the model. Arrived after: 503 "has no available versions",
        # never the scheduler's refusal of a queued request ("unloading").
        assert {a.status for a in answers} == {200, 503}
        assert all("has no available versions" in a.body or "not ready" in a.body for a in answers if a.status == 503)
        served = sum(a.status == 200 for a in answers)
        assert metric(server.metrics_url, "tensorgate_requests_total", model="beta", outcome="success") == served
        assert (await admin.post(f"{server.url}/v2/repository/models/beta/load", headers=ADMIN)).status_code == 200
    wait_until(lambda: httpx.get(f"{server.url}/v2/models/beta/ready").status_code == 200)


@pytest.mark.parametrize("mode", ["none", "poll"])
def test_outside_explicit_mode_changes_are_refused_with_403(tmp_path: Path, mode: str) -> None:
    keys = write_admin_keys(tmp_path, KEY)
    args = ["--model-repository", str(_repo(tmp_path)), "--model-control", mode]
    with ServerProcess(*args, "--admin-keys-file", str(keys)) as process:
        http = httpclient.InferenceServerClient(process.http_address)
        grpc = grpcclient.InferenceServerClient(process.grpc_address)
        for client, denied in ((http, "403"), (grpc, "StatusCode.PERMISSION_DENIED")):
            for call in (
                lambda c=client: c.load_model("alpha", headers=ADMIN),
                lambda c=client: c.unload_model("alpha", headers=ADMIN),
            ):
                with pytest.raises(InferenceServerException) as caught:
                    call()
                assert _status(caught.value) == denied
            if mode == "none":
                with pytest.raises(InferenceServerException) as caught:
                    client.get_model_repository_index(headers=ADMIN)
                assert _status(caught.value) == denied
            else:  # poll mode: the index, which changes nothing, answers an admin
                assert {r["name"] for r in _index(client, headers=ADMIN)} == {"alpha", "beta"}
        http.close()
        grpc.close()
        assert httpx.get(f"{process.url}/v2/models/alpha/ready").status_code == 200


def test_explicit_mode_needs_an_admin_keys_file(tmp_path: Path) -> None:
    server = ServerProcess("--model-repository", str(_repo(tmp_path)), "--model-control", "explicit")
    with pytest.raises(RuntimeError) as caught:
        server.start()
    assert "admin_keys_file" in str(caught.value)
