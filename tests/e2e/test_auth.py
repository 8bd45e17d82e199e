"""Authentication, roles, models and rate limits end to end, the same on HTTP and gRPC: exact 401,
403 and 429 answers (UNAUTHENTICATED, PERMISSION_DENIED, RESOURCE_EXHAUSTED), refused before the
body is read, counted per identity, and the access log naming the caller, never the key."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
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
    now = int(time.time())
    for bad, reason in (
        (signer.token(scope="infer", exp=now - 3600), "expired"),
        (signer.token(scope="infer", nbf=now + 3600), "not valid yet"),  # past the 30 s leeway
        (signer.token(scope="infer", aud="someone-else"), "another audience"),
        (signer.token(scope="infer", iss="https://elsewhere.test"), "another issuer"),
        (Signer().token(scope="infer"), "not valid"),
        (_unsigned(signer), "algorithm is not accepted"),
        (_hs256_with_the_public_key(signer), "algorithm is not accepted"),
    ):
        answer = httpx.post(url, json=MLP_BODY, headers=_bearer(bad))
        assert answer.status_code == 401 and reason in answer.json()["error"], (reason, answer.text)
    assert httpx.post(url, json=MLP_BODY, headers=_bearer(signer.token(scope="metrics"))).status_code == 403


def _b64(part: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(part).encode()).rstrip(b"=").decode()


def _claims(signer: Signer) -> dict[str, Any]:
    return {"iss": signer.issuer, "aud": signer.audience, "sub": "x", "exp": int(time.time()) + 300, "scope": "infer"}


def _unsigned(signer: Signer) -> str:
    """``alg: none``: a token with no signature at all."""
    return f"{_b64({'alg': 'none', 'typ': 'JWT', 'kid': 'rsa-1'})}.{_b64(_claims(signer))}."


def _hs256_with_the_public_key(signer: Signer) -> str:
    """HS/RS confusion: the RSA public key (which anyone may have) used as an HMAC secret."""
    signed = f"{_b64({'alg': 'HS256', 'typ': 'JWT', 'kid': 'rsa-1'})}.{_b64(_claims(signer))}"
    mac = hmac.new(signer.public_pem(), signed.encode(), hashlib.sha256).digest()
    return f"{signed}.{base64.urlsafe_b64encode(mac).rstrip(b'=').decode()}"


def test_an_unauthenticated_64_mib_body_is_refused_before_it_is_read(server: ServerProcess) -> None:
    """The 401 comes on the headers alone and closes the connection, so the server never takes the
    body: sending it fails (reset) long before 64 MiB. Kept open, the server would read and discard
    all 64 MiB; what a send gets through here is the sockets' buffers."""
    size = 64 * 1024 * 1024
    head = (
        "POST /v2/models/mlp/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {size}\r\n\r\n"
    ).encode()
    chunk = b"x" * (1 << 20)
    sent = 0
    with socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=10) as sock:
        sock.sendall(head)
        answer = b""
        while b"\r\n\r\n" not in answer:
            data = sock.recv(4096)
            assert data, "the server closed without an answer"
            answer += data
        sock.settimeout(2.0)  # a send that stalls means the server is not reading either
        try:
            while sent < size:
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:  # reset by the server, or stalled
            pass
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert b"connection: close" in answer.lower()
    assert sent <= 16 * len(chunk), f"the server took {sent >> 20} MiB of a refused body"


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


@pytest.fixture(scope="module")
def strict(example_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Health closed (``public_health: false``) and one request in flight per caller by default."""
    directory = tmp_path_factory.mktemp("strict")
    (directory / "api_keys").write_text(
        key_line(TEAM_KEY, "team-a", "infer", "*") + "\n" + key_line(OPS_KEY, "ops", "metrics") + "\n"
    )
    auth = {"api_keys_file": str(directory / "api_keys"), "public_health": False, "max_inflight": 1}
    config = {"server": {"model_repository": str(example_repo), "auth": auth}}
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    # The readiness probe of ServerProcess has no key: wait here with one.
    with ServerProcess("--config", str(directory / "config.yaml"), wait_ready=False) as server:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{server.url}/v2/health/ready", headers=_bearer(OPS_KEY)).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.05)
        yield server


def test_public_health_false_closes_health_to_callers_without_credentials(strict: ServerProcess) -> None:
    for path in ("/v2/health/live", "/v2/health/ready"):
        refused = httpx.get(f"{strict.url}{path}")
        assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Bearer")
        assert httpx.get(f"{strict.url}{path}", headers=_bearer(OPS_KEY)).status_code == 200  # any caller, any role
    client = grpcclient.InferenceServerClient(strict.grpc_address)
    try:
        with pytest.raises(InferenceServerException) as caught:
            client.is_server_live()
        assert str(caught.value.status()) == "StatusCode.UNAUTHENTICATED"
        assert client.is_server_live(headers=_bearer(OPS_KEY))
    finally:
        client.close()
    with grpc.insecure_channel(strict.grpc_address) as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check", request_serializer=lambda m: b"", response_deserializer=lambda b: b
        )
        with pytest.raises(grpc.RpcError) as refused_call:
            check(b"", timeout=10)
        assert refused_call.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert check(b"", metadata=tuple(_bearer(OPS_KEY).items()), timeout=10) is not None


def test_max_inflight_refuses_a_second_request_while_one_is_in_flight(strict: ServerProcess) -> None:
    """The config's default ``max_inflight: 1``: a request holds its place from its headers until its
    answer. The first one here waits for its body (the server asks for it with 100 Continue once it
    has admitted it), so the second comes while it is in flight, and is refused with 429."""
    body = json.dumps(MLP_BODY).encode()
    url = f"{strict.url}/v2/models/mlp/infer"
    with socket.create_connection(("127.0.0.1", strict.ports["http"]), timeout=10) as held:
        held.sendall(
            b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Expect: 100-continue\r\n"
            + f"Authorization: Bearer {TEAM_KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        )
        assert held.recv(4096).startswith(b"HTTP/1.1 100 Continue")
        refused = httpx.post(url, json=MLP_BODY, headers=_bearer(TEAM_KEY))
        assert refused.status_code == 429 and "in flight" in refused.json()["error"]
        assert int(refused.headers["retry-after"]) >= 1
        held.sendall(body)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = held.recv(65536)
            assert chunk, "closed without an answer"
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    assert httpx.post(url, json=MLP_BODY, headers=_bearer(TEAM_KEY)).status_code == 200  # its place is free again


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
