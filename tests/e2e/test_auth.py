"""Authentication, roles, models and rate limits end to end, the same on HTTP and gRPC: exact 401,
403 and 429 answers (UNAUTHENTICATED, PERMISSION_DENIED, RESOURCE_EXHAUSTED), refused before the
body is read, counted per identity, and the access log naming the caller, never the key."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import yaml
from model_builders import metric
from tls_material import Signer, key_line
from tritonclient.utils import InferenceServerException

from tensorgate.testing import ServerProcess

TEAM_KEY = "team-a-key-0123456789"  # infer, the mlp model only
OPS_KEY = "ops-key-0123456789abcd"  # metrics only
LIMITED_HTTP = "limited-http-key-0123456"  # infer, a bucket of 3 that does not refill during the test
LIMITED_GRPC = "limited-grpc-key-0123456"
ADMIN_KEY = "admin-key-from-the-admin-file-01"
MLP_BODY = {"inputs": [{"name": "features", "shape": [1, 16], "datatype": "FP32", "data": [0.0] * 16}]}


@pytest.fixture(scope="module")
def signer() -> Signer:
    return Signer()


@pytest.fixture(scope="module")
def server(example_repo: Path, tmp_path_factory: pytest.TempPathFactory, signer: Signer) -> Iterator[ServerProcess]:
    directory = tmp_path_factory.mktemp("auth")
    keys = directory / "api_keys"
    keys.write_text(
        "\n".join(
            [
                key_line(TEAM_KEY, "team-a", "infer", "mlp"),
                key_line(OPS_KEY, "ops", "metrics"),
                key_line(LIMITED_HTTP, "limited-http", "infer", "*", "rate=0.001", "burst=3"),
                key_line(LIMITED_GRPC, "limited-grpc", "infer", "*", "rate=0.001", "burst=3"),
            ]
        )
        + "\n"
    )
    (directory / "admin_keys").write_text(ADMIN_KEY + "\n")
    jwt = {"jwks_file": str(signer.write_jwks(directory / "jwks.json")), "issuer": signer.issuer}
    config = {
        "server": {
            "model_repository": str(example_repo),
            "model_control": "explicit",
            "admin_keys_file": str(directory / "admin_keys"),
            "auth": {"api_keys_file": str(keys), "jwt": {**jwt, "audience": signer.audience}},
        }
    }
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    with ServerProcess("--config", str(directory / "config.yaml")) as server:
        yield server


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def test_http_answers_401_403_and_200_by_the_caller(server: ServerProcess) -> None:
    url = f"{server.url}/v2/models/mlp/infer"
    missing = httpx.post(url, json=MLP_BODY)
    assert missing.status_code == 401 and missing.headers["www-authenticate"].startswith("Bearer")
    assert "needs credentials" in missing.json()["error"]
    assert httpx.post(url, json=MLP_BODY, headers=_bearer("a-wrong-key-0000000000")).status_code == 401
    assert httpx.post(url, json=MLP_BODY, headers=_bearer(TEAM_KEY)).status_code == 200
    assert httpx.post(url, json=MLP_BODY, headers={"x-api-key": TEAM_KEY}).status_code == 200
    other = httpx.post(f"{server.url}/v2/models/cnn/infer", json=MLP_BODY, headers=_bearer(TEAM_KEY))
    assert other.status_code == 403 and "may not use this model" in other.json()["error"]
    assert httpx.get(f"{server.url}/v2/models/cnn", headers=_bearer(TEAM_KEY)).status_code == 403
    assert httpx.get(f"{server.url}/v2/models/mlp", headers=_bearer(TEAM_KEY)).status_code == 200
    assert httpx.get(f"{server.url}/v2/models/stats", headers=_bearer(TEAM_KEY)).status_code == 403
    assert httpx.post(url, json=MLP_BODY, headers=_bearer(OPS_KEY)).status_code == 403  # no infer role
    index = f"{server.url}/v2/repository/index"
    assert httpx.post(index, headers=_bearer(TEAM_KEY)).status_code == 403  # infer is not admin
    assert httpx.post(index, headers=_bearer(ADMIN_KEY)).status_code == 200
    # Health stays open for load balancers and kubelets.
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200
    assert httpx.get(f"{server.url}/v2/health/live").status_code == 200


def test_grpc_answers_the_same_codes(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_address)
    features = grpcclient.InferInput("features", [1, 16], "FP32")
    features.set_data_from_numpy(np.zeros((1, 16), np.float32))

    def status(model: str, headers: dict[str, str] | None) -> str:
        try:
            client.infer(model, [features], headers=headers)
        except InferenceServerException as exc:
            return str(exc.status())
        return "OK"

    try:
        assert client.is_server_live() and client.is_server_ready()  # health open without a key
        assert status("mlp", None) == "StatusCode.UNAUTHENTICATED"
        assert status("mlp", _bearer("a-wrong-key-0000000000")) == "StatusCode.UNAUTHENTICATED"
        assert status("mlp", _bearer(TEAM_KEY)) == "OK"
        assert status("mlp", {"x-api-key": TEAM_KEY}) == "OK"
        assert status("cnn", _bearer(TEAM_KEY)) == "StatusCode.PERMISSION_DENIED"
        assert status("mlp", _bearer(OPS_KEY)) == "StatusCode.PERMISSION_DENIED"
        with pytest.raises(InferenceServerException) as caught:
            client.get_model_repository_index(headers=_bearer(TEAM_KEY))
        assert str(caught.value.status()) == "StatusCode.PERMISSION_DENIED"
        assert client.get_model_repository_index(headers=_bearer(ADMIN_KEY)) is not None
        with pytest.raises(InferenceServerException) as caught:
            client.get_model_metadata("mlp")
        assert str(caught.value.status()) == "StatusCode.UNAUTHENTICATED"
    finally:
        client.close()


def test_rate_limits_are_exact_within_one_bucket(server: ServerProcess) -> None:
    url = f"{server.url}/v2/models/mlp/infer"
    answers = [httpx.post(url, json=MLP_BODY, headers=_bearer(LIMITED_HTTP)) for _ in range(5)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429, 429]
    assert int(answers[-1].headers["retry-after"]) >= 1
    assert "over its rate" in answers[-1].json()["error"]
    assert httpx.post(url, json=MLP_BODY, headers=_bearer(TEAM_KEY)).status_code == 200  # its own bucket
    with grpc.insecure_channel(server.grpc_address) as channel:
        ready = channel.unary_unary(
            "/inference.GRPCInferenceService/ServerMetadata",
            request_serializer=lambda m: b"",
            response_deserializer=lambda b: b,
        )
        codes = []
        for _ in range(5):
            try:
                ready(b"", metadata=tuple(_bearer(LIMITED_GRPC).items()), timeout=10)
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                codes.append(exc.code())
    assert codes == [grpc.StatusCode.OK] * 3 + [grpc.StatusCode.RESOURCE_EXHAUSTED] * 2
    metrics = _metrics(server)
    assert metrics("tensorgate_refused_requests_total", identity="limited-http", outcome="rate_limited") == 2
    assert metrics("tensorgate_refused_requests_total", identity="limited-grpc", outcome="rate_limited") == 2


def _metrics(server: ServerProcess) -> Any:
    def read(name: str, **labels: str) -> float:
        return metric(server.metrics_url, name, headers=_bearer(OPS_KEY), **labels)

    return read


def test_the_metrics_port_needs_the_metrics_role(server: ServerProcess) -> None:
    assert httpx.get(server.metrics_url).status_code == 401
    assert httpx.get(server.metrics_url, headers=_bearer(TEAM_KEY)).status_code == 403
    scraped = httpx.get(server.metrics_url, headers=_bearer(OPS_KEY))
    assert scraped.status_code == 200 and "tensorgate_refused_requests_total" in scraped.text


def test_tokens_from_the_jwks_are_callers_too(server: ServerProcess, signer: Signer) -> None:
    url = f"{server.url}/v2/models/mlp/infer"
    good = signer.token(scope="infer")
    assert httpx.post(url, json=MLP_BODY, headers=_bearer(good)).status_code == 200
    for bad, reason in (
        (signer.token(scope="infer", exp=int(time.time()) - 3600), "expired"),
        (signer.token(scope="infer", aud="someone-else"), "another audience"),
        (Signer().token(scope="infer"), "not valid"),
    ):
        answer = httpx.post(url, json=MLP_BODY, headers=_bearer(bad))
        assert answer.status_code == 401 and reason in answer.json()["error"]
    assert httpx.post(url, json=MLP_BODY, headers=_bearer(signer.token(scope="metrics"))).status_code == 403


def test_an_unauthenticated_64_mib_body_is_refused_before_it_is_read(server: ServerProcess) -> None:
    """Only the headers are sent: the 401 comes back at once, so the server read nothing more."""
    head = (
        "POST /v2/models/mlp/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {64 * 1024 * 1024}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=10) as sock:
        sock.sendall(head)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(4096)
            assert chunk, "the server closed without an answer"
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]


def test_the_access_log_names_the_caller_and_never_the_key(server: ServerProcess) -> None:
    httpx.post(f"{server.url}/v2/models/mlp/infer", json=MLP_BODY, headers=_bearer(TEAM_KEY))
    deadline = time.monotonic() + 10
    while not any(r.get("identity") == "team-a" for r in server.log_records()):
        assert time.monotonic() < deadline, "no access line named the caller"
        time.sleep(0.05)
    log = server.log()
    for secret in (TEAM_KEY, OPS_KEY, LIMITED_HTTP, ADMIN_KEY):
        assert secret not in log


@pytest.fixture
def capped(example_repo: Path) -> Iterator[ServerProcess]:
    with ServerProcess("--model-repository", str(example_repo), "--max-connections", "2") as server:
        yield server


@pytest.mark.parametrize("port", ["http", "grpc"])
def test_connections_past_the_cap_are_closed_as_accepted(capped: ServerProcess, port: str) -> None:
    address = ("127.0.0.1", capped.ports[port])
    held = [socket.create_connection(address, timeout=10) for _ in range(2)]
    try:
        # Accepted in order: the two held ones are counted before this one is looked at.
        extra = socket.create_connection(address, timeout=10)
        with extra:
            extra.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            try:
                data = extra.recv(1024)
            except ConnectionResetError:
                data = b""
            assert data == b""  # closed before a byte was read
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 10
    while True:  # with the two gone, a new connection is served
        try:
            if port == "http" and httpx.get(f"{capped.url}/v2/health/live", timeout=5).status_code == 200:
                break
            if port == "grpc":
                client = grpcclient.InferenceServerClient(capped.grpc_address)
                try:
                    if client.is_server_live():
                        break
                finally:
                    client.close()
        except (httpx.TransportError, InferenceServerException):
            pass
        assert time.monotonic() < deadline
        time.sleep(0.05)


HTTP_ROUTES = [
    ("GET", "/v2"),
    ("GET", "/v2/models/mlp"),
    ("GET", "/v2/models/mlp/ready"),
    ("GET", "/v2/models/mlp/config"),
    ("GET", "/v2/models/mlp/stats"),
    ("GET", "/v2/models/stats"),
    ("GET", "/v2/models/mlp/rollout"),
    ("POST", "/v2/models/mlp/infer"),
    ("POST", "/v2/models/mlp/versions/1/infer"),
    ("GET", "/v1/models/mlp"),
    ("POST", "/v1/models/mlp:predict"),
    ("GET", "/v1/models"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v2/models/mlp/generate"),
    ("POST", "/v2/repository/index"),
    ("POST", "/v2/repository/models/mlp/load"),
    ("POST", "/v2/repository/models/mlp/unload"),
    ("GET", "/v2/no/such/route"),
    ("DELETE", "/v2/models/mlp"),
]
GRPC_METHODS = [
    "ServerMetadata",
    "ModelReady",
    "ModelMetadata",
    "ModelInfer",
    "ModelConfig",
    "ModelStatistics",
    "RepositoryIndex",
    "RepositoryModelLoad",
    "RepositoryModelUnload",
]


def test_s19_auth_never_fails_open(server: ServerProcess) -> None:
    """Every route and method but health, on both protocols, answers 401 (UNAUTHENTICATED) to a
    caller without credentials, or with a malformed one, before any handler runs: no route is
    forgotten, and not even an unknown one tells what exists."""
    for credentials in ({}, {"authorization": "Bearer"}, {"authorization": "Basic YTpi"}, {"x-api-key": ""}):
        for method, path in HTTP_ROUTES:
            answer = httpx.request(method, f"{server.url}{path}", headers=credentials, json=MLP_BODY)
            assert answer.status_code == 401, (method, path, credentials, answer.status_code)
    with grpc.insecure_channel(server.grpc_address) as channel:
        for name in GRPC_METHODS:
            call = channel.unary_unary(
                f"/inference.GRPCInferenceService/{name}",
                request_serializer=lambda m: b"",
                response_deserializer=lambda b: b,
            )
            with pytest.raises(grpc.RpcError) as caught:
                call(b"", timeout=10)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED, name
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check", request_serializer=lambda m: b"", response_deserializer=lambda b: b
        )
        assert check(b"", timeout=10) is not None  # health stays open
