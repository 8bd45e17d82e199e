"""The security checklist of docs/security.md, one test named after each rule that this module
proves (the others live next to the feature they guard and carry the rule's id in their names:
see docs/security.md for the whole table)."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import re
import shutil
import socket
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import psutil
import pytest
import yaml
from model_builders import v2_body, write_python_model

from tensorgate.testing import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
MLP_BODY = {"inputs": [{"name": "features", "shape": [1, 16], "datatype": "FP32", "data": [0.0] * 16}]}
# What an error body must never hold (S-11): a stack trace, an absolute path, a memory address.
_LEAKS = re.compile(r"Traceback|File \"|/(?:tmp|etc|home|root|usr|work|proc)/|0x[0-9a-f]{6,}", re.IGNORECASE)


@pytest.fixture(scope="module")
def server(example_repo: Path) -> Iterator[ServerProcess]:
    with ServerProcess("--model-repository", str(example_repo)) as server:
        yield server


def _listening(pid: int) -> set[str]:
    process = psutil.Process(pid)
    addresses = set()
    for p in [process, *process.children(recursive=True)]:
        # net_connections from psutil 6 on; kserve, in the test dependencies, holds psutil below 6
        list_connections = getattr(p, "net_connections", None) or p.connections
        for connection in list_connections(kind="tcp"):
            if connection.status == psutil.CONN_LISTEN:
                addresses.add(connection.laddr.ip)
    return addresses


def test_s01_safe_binds(server: ServerProcess, example_repo: Path) -> None:
    """Every port binds loopback by default; binding all interfaces is explicit and warned about."""
    assert server.process is not None
    assert _listening(server.process.pid) == {"127.0.0.1"}
    with ServerProcess("--model-repository", str(example_repo), "--host", "0.0.0.0") as wide:
        warnings = [r for r in wide.log_records() if r.get("level") == "warning"]
        assert any("reachable from the network" in str(r.get("message")) for r in warnings)


def test_s02_management_off_by_default(server: ServerProcess) -> None:
    for action in ("load", "unload"):
        answer = httpx.post(f"{server.url}/v2/repository/models/mlp/{action}")
        assert answer.status_code == 403 and "disabled" in answer.json()["error"]
    assert httpx.get(f"{server.url}/v2/models/mlp/ready").status_code == 200  # unchanged
    with grpc.insecure_channel(server.grpc_address) as channel:
        unload = channel.unary_unary(
            "/inference.GRPCInferenceService/RepositoryModelUnload",
            request_serializer=lambda m: b"\n\x03mlp",  # model_name: "mlp"
            response_deserializer=lambda b: b,
        )
        with pytest.raises(grpc.RpcError) as caught:
            unload(b"", timeout=10)
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_s03_model_names_are_validated_and_never_echoed(server: ServerProcess) -> None:
    long_name = "a" * 1024
    for name in (long_name, "..", "a%00b", "%2e%2e", " ..", "model/.."):
        answer = httpx.get(f"{server.url}/v2/models/{name}/ready")
        assert answer.status_code in (400, 404), name
        assert long_name not in answer.text
    answer = httpx.get(f"{server.url}/v2/models/{long_name}")
    assert answer.status_code == 400 and "invalid model name" in answer.json()["error"]
    assert httpx.get(f"{server.url}/v2/models/model..1/ready").status_code == 404  # odd but valid: not found


def test_s04_a_model_directory_leaving_the_root_is_not_loaded(example_repo: Path, tmp_path: Path) -> None:
    outside, root = tmp_path / "outside", tmp_path / "repo"
    shutil.copytree(example_repo / "mlp", outside / "mlp")
    shutil.copytree(example_repo / "cnn", root / "cnn")
    (root / "escaped").symlink_to(outside / "mlp", target_is_directory=True)
    with ServerProcess("--model-repository", str(root), wait_ready=False) as server:
        server.wait_loaded()  # never ready: a model of the repository was refused
        assert httpx.get(f"{server.url}/v2/models/cnn/ready").status_code == 200
        assert httpx.get(f"{server.url}/v2/models/escaped/ready").status_code != 200
        assert httpx.post(f"{server.url}/v2/models/escaped/infer", json=MLP_BODY).status_code in (404, 503)


class _Marker:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.path}",))


def test_s05_no_deserializer_runs_code(server: ServerProcess, tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    payload = pickle.dumps(_Marker(str(marker)))
    for content_type in ("application/x-python-pickle", "application/octet-stream", "application/json", ""):
        for path in ("/v2/models/mlp/infer", "/v1/models/mlp:predict", "/v1/completions"):
            headers = {"content-type": content_type} if content_type else {}
            answer = httpx.post(f"{server.url}{path}", content=payload, headers=headers)
            assert 400 <= answer.status_code < 500, (path, content_type, answer.status_code)
    binary = {"inference-header-content-length": "2", "content-type": "application/octet-stream"}
    assert httpx.post(f"{server.url}/v2/models/mlp/infer", content=b"{}" + payload, headers=binary).status_code == 400
    assert not marker.exists()


ENV_MODEL = """
import os

import numpy as np

from tensorgate import PythonModel


class Env(PythonModel):
    def execute(self, inputs):
        seen = [name for name in ("AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "DB_PASSWORD") if name in os.environ]
        kept = "OMP_NUM_THREADS" in os.environ
        return {"OUTPUT": np.full(inputs["INPUT"].shape, len(seen) * 10 + kept, dtype=np.float32)}
"""


def test_s06_workers_get_no_credentials(tmp_path: Path) -> None:
    """A model is code: the worker process that runs it sees the server's settings, not its secrets."""
    write_python_model(tmp_path / "repo", "env", code=ENV_MODEL, instance_group=[{"count": 1, "isolation": "process"}])
    secrets = {"AWS_SECRET_ACCESS_KEY": "x", "HF_TOKEN": "y", "DB_PASSWORD": "z", "OMP_NUM_THREADS": "1"}
    with ServerProcess("--model-repository", str(tmp_path / "repo"), env=secrets) as server:
        answer = httpx.post(f"{server.url}/v2/models/env/infer", json=v2_body([[0, 0, 0, 0]]))
        assert answer.status_code == 200
        assert answer.json()["outputs"][0]["data"] == [1.0, 1.0, 1.0, 1.0]  # no secret seen, settings kept


def test_s07_no_api_sets_a_file_path(server: ServerProcess, tmp_path: Path) -> None:
    target = tmp_path / "written-by-a-request"
    for path in ("/v2/logging", "/v2/trace/setting", "/v2/models/mlp/trace/setting"):
        answer = httpx.post(f"{server.url}{path}", json={"log_file": str(target), "trace_file": str(target)})
        assert answer.status_code == 404, path
    assert not target.exists()


def test_s08_counts_and_sizes_are_bounded_before_allocation(server: ServerProcess) -> None:
    url = f"{server.url}/v2/models/mlp/infer"
    huge = {"inputs": [{"name": "features", "shape": [2**40, 2**40], "datatype": "FP32", "data": [0.0]}]}
    answer = httpx.post(url, json=huge)
    assert answer.status_code == 400
    deep = "[" * 101 + "]" * 101
    answer = httpx.post(url, content=f'{{"inputs": {deep}}}', headers={"content-type": "application/json"})
    assert answer.status_code == 400 and "depth" in answer.json()["error"]
    with socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=10) as sock:
        sock.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n" % (1 << 40))
        assert sock.recv(4096).startswith(b"HTTP/1.1 413")  # a declared terabyte: refused unread
    assert httpx.get(f"{server.url}/v2/health/live").status_code == 200


def _until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """What the server sends until it closes the connection, and how long that took."""
    started = time.monotonic()
    answer = b""
    while chunk := sock.recv(4096):
        answer += chunk
    return answer, time.monotonic() - started


def test_s09_slow_headers_slow_bodies_and_idle_connections_are_cut_off(example_repo: Path, tmp_path: Path) -> None:
    limits = {"header_timeout_s": 0.5, "body_timeout_s": 0.5, "keep_alive_s": 0.5}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"server": {"model_repository": str(example_repo), **limits}}))
    with ServerProcess("--config", str(config)) as server:
        address = ("127.0.0.1", server.ports["http"])
        with socket.create_connection(address, timeout=10) as sock:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the end of the headers
            answer, elapsed = _until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 408") and b"headers not received" in answer and 0.4 < elapsed < 0.5 + 1.0
        with socket.create_connection(address, timeout=10) as sock:
            sock.sendall(
                b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: 1000\r\n\r\n{"  # and never the rest of the body
            )
            answer, elapsed = _until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 408") and b"body not received" in answer and 0.4 < elapsed < 0.5 + 1.0
        with socket.create_connection(address, timeout=10) as sock:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            answer, elapsed = _until_closed(sock)  # the answer, then the idle connection is closed
        assert answer.startswith(b"HTTP/1.1 200") and 0.4 < elapsed < 0.5 + 1.0


SLOW_MODEL = """
import time

from tensorgate import PythonModel


class Slow(PythonModel):
    def execute(self, inputs):
        time.sleep(0.2)
        return {"OUTPUT": inputs["INPUT"]}
"""


async def test_s10_a_full_queue_answers_at_once_with_retry_after(tmp_path: Path) -> None:
    write_python_model(
        tmp_path / "repo",
        "slow",
        code=SLOW_MODEL,
        max_batch_size=1,
        dynamic_batching={"max_queue_size": 2, "max_queue_delay_ms": 0},
        health_check={"enabled": False},
    )
    with ServerProcess("--model-repository", str(tmp_path / "repo")) as server:
        async with httpx.AsyncClient(timeout=30) as client:
            url = f"{server.url}/v2/models/slow/infer"
            answers = await asyncio.gather(*(client.post(url, json=v2_body([[1, 2, 3, 4]])) for _ in range(12)))
    refused = [a for a in answers if a.status_code == 503]
    assert refused and all(int(a.headers["retry-after"]) >= 1 for a in refused)
    assert {a.status_code for a in answers} <= {200, 503}
    assert sum(a.status_code == 200 for a in answers) >= 3  # one running and two queued at least


FAILING_MODEL = """
from tensorgate import PythonModel


class Failing(PythonModel):
    def execute(self, inputs):
        raise RuntimeError(f"cannot open /etc/tensorgate/secret.key at {hex(id(self))}")
"""


def test_s11_errors_leak_nothing_internal(server: ServerProcess, tmp_path: Path) -> None:
    bodies = [
        httpx.post(f"{server.url}/v2/models/mlp/infer", content=b"{not json").text,
        httpx.post(f"{server.url}/v2/models/mlp/infer", json={"inputs": [{"name": "x"}]}).text,
        httpx.get(f"{server.url}/v2/models/nope").text,
        httpx.post(f"{server.url}/v2/models/mlp/infer", content=b"\x00" * 64).text,
    ]
    write_python_model(tmp_path / "repo", "failing", code=FAILING_MODEL, health_check={"enabled": False})
    with ServerProcess("--model-repository", str(tmp_path / "repo")) as failing:
        answer = httpx.post(f"{failing.url}/v2/models/failing/infer", json=v2_body([[1, 2, 3, 4]]))
        assert answer.status_code == 500
        bodies.append(answer.text)
        assert "secret.key" in failing.log()  # the detail goes to the server's log instead
    for body in bodies:
        assert json.loads(body)["error"]
        assert not _LEAKS.search(body), body


def test_s12_shared_memory_is_off(server: ServerProcess) -> None:
    """Shared memory is off by default: registering a region is refused (403 / PERMISSION_DENIED,
    saying how to turn it on), nothing is mapped, and naming a region in a request is refused too.
    The rules that hold once it is on are tests/e2e/test_shared_memory.py."""
    register = {"key": "/anything", "offset": 0, "byte_size": 64}
    answer = httpx.post(f"{server.url}/v2/systemsharedmemory/region/r/register", json=register)
    assert answer.status_code == 403
    assert "server.shared_memory" in answer.json()["error"]
    body = {"inputs": [{**MLP_BODY["inputs"][0], "parameters": {"shared_memory_region": "r"}}]}
    del body["inputs"][0]["data"]
    body["inputs"][0]["parameters"]["shared_memory_byte_size"] = 64
    assert httpx.post(f"{server.url}/v2/models/mlp/infer", json=body).status_code == 403
    with grpc.insecure_channel(server.grpc_address) as channel:
        call = channel.unary_unary(
            "/inference.GRPCInferenceService/SystemSharedMemoryRegister",
            request_serializer=lambda m: b"",
            response_deserializer=lambda b: b,
        )
        with pytest.raises(grpc.RpcError) as caught:
            call(b"", timeout=10)
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_s13_no_route_runs_caller_supplied_code(server: ServerProcess) -> None:
    job = {"entrypoint": "touch /tmp/ran", "runtime_env": {}, "command": ["id"]}
    for path in (
        "/api/jobs/",
        "/v2/run",
        "/v1/exec",
        "/v2/models/mlp/execute",
        "/v2/profile",
        "/api/serve/applications/",
    ):
        assert httpx.post(f"{server.url}{path}", json=job).status_code in (404, 405), path
        assert httpx.put(f"{server.url}{path}", json=job).status_code in (404, 405), path


def test_s15_dependencies_are_pinned_to_compatible_ranges() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        requirements += extra
    for requirement in requirements:
        name = re.split(r"[\[<>=!~ ]", requirement, maxsplit=1)[0]
        if name.startswith("types-"):
            continue  # type stubs: no code that runs
        assert "<" in requirement or "==" in requirement, f"{requirement}: no upper bound"
    torch = [r for r in requirements if r.startswith("torch")]
    assert torch and all(tuple(map(int, r.split("==")[1].split(".")[:2])) >= (2, 10) for r in torch)


def test_s16_no_cors_and_admin_credentials_only_from_headers(tmp_path: Path, example_repo: Path) -> None:
    """An admin key counts only in a header (Authorization or X-API-Key), never from a cookie or the
    URL, and no answer carries CORS headers."""
    key = "an-admin-key-for-the-s16-test"
    (tmp_path / "admin").write_text(key + "\n")
    args = ("--model-repository", str(example_repo), "--model-control", "poll", "--admin-keys-file")
    with ServerProcess(*args, str(tmp_path / "admin")) as server:
        index = f"{server.url}/v2/repository/index"
        origin = {"origin": "https://evil.example"}
        assert httpx.post(index, headers=origin, cookies={"authorization": f"Bearer {key}"}).status_code == 401
        assert httpx.post(f"{index}?authorization=Bearer+{key}", headers=origin).status_code == 401
        assert httpx.post(index, headers={**origin, "authorization": f"Bearer {key}"}).status_code == 200
        assert httpx.post(index, headers={**origin, "x-api-key": key}).status_code == 200
        preflight = httpx.options(index, headers={**origin, "access-control-request-method": "POST"})
        for answer in (preflight, httpx.get(f"{server.url}/v2", headers=origin)):
            assert not any(h.startswith("access-control-") for h in answer.headers)


def test_s16_a_name_rebound_to_loopback_is_refused(server: ServerProcess, example_repo: Path) -> None:
    """DNS rebinding: a page whose name now resolves to 127.0.0.1 reaches the loopback server with its
    own name in Host; that is refused (403, the name not echoed) on every route and on the metrics
    port, while the server's own names are answered, and --allowed-host adds one."""
    rebound = {"host": "evil.example:8080"}
    for answer in (
        httpx.get(f"{server.url}/v2/health/ready", headers=rebound),
        httpx.post(f"{server.url}/v2/models/mlp/infer", json=MLP_BODY, headers=rebound),
        httpx.get(f"http://127.0.0.1:{server.ports['metrics']}/metrics", headers=rebound),
    ):
        assert answer.status_code == 403, answer.request.url
        assert "allowed_hosts" in answer.json()["error"] and "evil" not in answer.text
    port = server.ports["http"]
    for own in (f"localhost:{port}", f"127.0.0.1:{port}", "[::1]"):
        assert httpx.get(f"{server.url}/v2/health/ready", headers={"host": own}).status_code == 200
    with ServerProcess("--model-repository", str(example_repo), "--allowed-host", "models.example") as named:
        ready = f"{named.url}/v2/health/ready"
        assert httpx.get(ready, headers={"host": "models.example:443"}).status_code == 200
        assert httpx.get(ready, headers=rebound).status_code == 403


def test_s20_every_answer_says_nosniff_and_json(server: ServerProcess) -> None:
    answers = [
        httpx.get(f"{server.url}/v2"),
        httpx.get(f"{server.url}/v2/models/nope"),
        httpx.post(f"{server.url}/v2/models/mlp/infer", content=b"<script>alert(1)</script>"),
        httpx.delete(f"{server.url}/v2/models/mlp"),
        httpx.post(f"{server.url}/v2/models/mlp/infer", json=MLP_BODY),
        httpx.post(f"{server.url}/v2/repository/index"),
    ]
    for answer in answers:
        assert answer.headers["x-content-type-options"] == "nosniff", answer.request.url
        assert answer.headers["content-type"] == "application/json"
    # "/" is JSON to a client and the status page to a browser (which asks for HTML).
    assert httpx.get(f"{server.url}/").headers["content-type"] == "application/json"
    # The two answers that are not JSON: the status page, and the metrics in Prometheus' text format.
    page = httpx.get(f"{server.url}/", headers={"accept": "text/html"})
    for answer, kind in ((page, "text/html"), (httpx.get(server.metrics_url), "text/plain")):
        assert answer.status_code == 200 and answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["content-type"].startswith(kind), answer.request.url
    with socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=10) as sock:
        sock.sendall(b"GARBAGE\r\n\r\n")
        raw = sock.recv(4096).lower()
    assert b"x-content-type-options: nosniff" in raw and b"content-type: application/json" in raw
