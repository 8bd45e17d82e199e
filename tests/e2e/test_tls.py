"""HTTPS and gRPC over TLS with the clients users have (tritonclient HTTP and gRPC, openai, curl),
mutual TLS refused in the handshake without a certificate from the client CA, TLS 1.2+ only, and a
certificate rotated on disk served to the next handshake without a restart (S-14, S-T10)."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml
from tls_material import Authority, Issued, serial_of

from tensorgate.testing import ServerProcess


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[Authority, Issued]:
    ca = Authority(tmp_path_factory.mktemp("pki"))
    return ca, ca.issue("server")


@pytest.fixture(scope="module")
def tls_server(example_repo: Path, pki: tuple[Authority, Issued]) -> Iterator[ServerProcess]:
    ca, cert = pki
    args = ("--model-repository", str(example_repo), "--tls-cert", str(cert.cert), "--tls-key", str(cert.key))
    with ServerProcess(*args, tls_ca=ca.cert) as server:
        yield server


def _features() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)


def test_tritonclient_http_over_https(tls_server: ServerProcess, pki: tuple[Authority, Issued]) -> None:
    client = httpclient.InferenceServerClient(
        tls_server.http_address, ssl=True, ssl_options={"ca_certs": str(pki[0].cert)}
    )
    try:
        assert client.is_server_ready()
        features = httpclient.InferInput("features", [2, 16], "FP32")
        features.set_data_from_numpy(_features(), binary_data=True)
        assert client.infer("mlp", [features]).as_numpy("probabilities").shape == (2, 3)
    finally:
        client.close()


def test_tritonclient_grpc_over_tls(tls_server: ServerProcess, pki: tuple[Authority, Issued]) -> None:
    client = grpcclient.InferenceServerClient(tls_server.grpc_address, ssl=True, root_certificates=str(pki[0].cert))
    try:
        assert client.is_server_ready()
        features = grpcclient.InferInput("features", [2, 16], "FP32")
        features.set_data_from_numpy(_features())
        assert client.infer("mlp", [features]).as_numpy("probabilities").shape == (2, 3)
    finally:
        client.close()


def test_openai_client_and_curl_over_https(tls_server: ServerProcess, pki: tuple[Authority, Issued]) -> None:
    verify = ssl.create_default_context(cafile=str(pki[0].cert))
    with httpx.Client(verify=verify) as http:
        client = openai.OpenAI(base_url=f"{tls_server.url}/v1", api_key="unused", http_client=http)
        assert [m.id for m in client.models.list()] == []  # no text model here: an empty list, over TLS
    if shutil.which("curl"):
        out = subprocess.run(
            ["curl", "-sS", "--cacert", str(pki[0].cert), f"{tls_server.url}/v2"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        assert '"name":"tensorgate"' in out.stdout.replace(" ", "")


def _handshake(port: int, ca: Path, *, version: ssl.TLSVersion | None = None, alpn: list[str] | None = None) -> str:
    """Connect with TLS; returns the negotiated version and ALPN protocol."""
    context = ssl.create_default_context(cafile=str(ca))
    if version is not None:
        context.minimum_version = context.maximum_version = version
    if alpn:
        context.set_alpn_protocols(alpn)
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        return f"{tls.version()} {tls.selected_alpn_protocol()}"


def test_s14_tls_1_2_and_1_3_only_with_alpn_per_port(tls_server: ServerProcess, pki: tuple[Authority, Issued]) -> None:
    ca = pki[0].cert
    http, grpc_port = tls_server.ports["http"], tls_server.ports["grpc"]
    assert _handshake(http, ca, version=ssl.TLSVersion.TLSv1_2) == "TLSv1.2 None"
    assert _handshake(http, ca, version=ssl.TLSVersion.TLSv1_3, alpn=["h2", "http/1.1"]) == "TLSv1.3 http/1.1"
    assert _handshake(grpc_port, ca, alpn=["h2"]) == "TLSv1.3 h2"
    if shutil.which("openssl") is None:
        return
    for port in (http, grpc_port):
        # The client offers TLS 1.1 for real (security level 0 lets OpenSSL 3 send it); the server refuses.
        old = _s_client(port, "-tls1_1", "-cipher", "DEFAULT@SECLEVEL=0")
        assert old.returncode != 0 and "Cipher is (NONE)" in old.stdout  # no session was made
        assert _s_client(port, "-tls1_2").returncode == 0


def _s_client(port: int, *options: str) -> subprocess.CompletedProcess[str]:
    command = ["openssl", "s_client", "-connect", f"127.0.0.1:{port}", *options]
    return subprocess.run(command, input="", capture_output=True, text=True, errors="replace", timeout=30, check=False)


def test_plain_text_to_the_tls_port_is_not_served(tls_server: ServerProcess) -> None:
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{tls_server.ports['http']}/v2/health/ready", timeout=5)


@pytest.fixture(scope="module")
def mtls(example_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Authority]]:
    ca = Authority(tmp_path_factory.mktemp("mtls"))
    cert = ca.issue("server")
    args = ["--model-repository", str(example_repo), "--tls-cert", str(cert.cert), "--tls-key", str(cert.key)]
    args += ["--tls-client-ca", str(ca.cert)]
    # Readiness is asked with a client certificate: ServerProcess's probe has none, so wait here.
    with ServerProcess(*args, tls_ca=ca.cert, wait_ready=False) as server:
        client = ca.issue("probe", server=False)
        context = ssl.create_default_context(cafile=str(ca.cert))
        context.load_cert_chain(client.cert, client.key)
        with httpx.Client(verify=context, timeout=5) as http:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if http.get(f"{server.url}/v2/health/ready").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, server.log()
                time.sleep(0.05)
        yield server, ca


def test_s14_mutual_tls_refuses_a_client_without_a_certificate_of_the_ca(
    mtls: tuple[ServerProcess, Authority], tmp_path: Path
) -> None:
    server, ca = mtls
    own = ca.issue("client-a", server=False)
    stranger = Authority(tmp_path / "other").issue("client-b", server=False)
    for cert, accepted in ((None, False), (stranger, False), (own, True)):
        context = ssl.create_default_context(cafile=str(ca.cert))
        if cert is not None:
            context.load_cert_chain(cert.cert, cert.key)
        with httpx.Client(verify=context, timeout=5) as http:
            if accepted:
                assert http.get(f"{server.url}/v2/health/ready").status_code == 200
            else:
                with pytest.raises(httpx.TransportError):
                    http.get(f"{server.url}/v2/health/ready")
        channel_options = {"root_certificates": ca.cert.read_bytes()}
        if cert is not None:
            channel_options |= {"private_key": cert.key.read_bytes(), "certificate_chain": cert.cert.read_bytes()}
        credentials = grpc.ssl_channel_credentials(**channel_options)
        with grpc.secure_channel(server.grpc_address, credentials) as channel:
            try:
                grpc.channel_ready_future(channel).result(timeout=5)
                ready = True
            except grpc.FutureTimeoutError:
                ready = False
        assert ready is accepted


def _served_serial(port: int, ca: Path) -> int:
    context = ssl.create_default_context(cafile=str(ca))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return serial_of(der)


def test_a_rotated_certificate_is_served_without_a_restart(example_repo: Path, tmp_path: Path) -> None:
    ca = Authority(tmp_path / "ca")
    first, second = ca.issue("first"), ca.issue("second")
    live_cert, live_key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(first.cert, live_cert)
    shutil.copy(first.key, live_key)
    args = ("--model-repository", str(example_repo), "--tls-cert", str(live_cert), "--tls-key", str(live_key))
    with ServerProcess(*args, tls_ca=ca.cert) as server:
        pid = server.process.pid if server.process else None
        assert _served_serial(server.ports["http"], ca.cert) == first.serial
        verify = ssl.create_default_context(cafile=str(ca.cert))
        with httpx.Client(verify=verify, timeout=5) as kept_open:
            assert kept_open.get(f"{server.url}/v2/health/ready").status_code == 200
            for source, target in ((second.key, live_key), (second.cert, live_cert)):
                shutil.copy(source, target.with_suffix(".new"))
                os.replace(target.with_suffix(".new"), target)  # as a secret mount swaps files
            deadline = time.monotonic() + 20
            while _served_serial(server.ports["http"], ca.cert) != second.serial:
                assert time.monotonic() < deadline, "the new certificate was not served in time"
                time.sleep(0.1)
            assert _served_serial(server.ports["grpc"], ca.cert) == second.serial
            assert kept_open.get(f"{server.url}/v2/health/ready").status_code == 200  # its connection lives on
        assert server.process is not None and server.process.pid == pid and server.process.poll() is None
        assert any("reloaded the TLS certificate" in str(r.get("message")) for r in server.log_records())


# -- the connection limits over TLS, and the metrics port over TLS ----------------------------------

LIMIT_S = 0.5  # header_timeout_s and body_timeout_s of the capped server (also its TLS handshake time)


@pytest.fixture(scope="module")
def capped_tls(example_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    directory = tmp_path_factory.mktemp("capped-tls")
    ca = Authority(directory / "ca")
    cert = ca.issue("server")
    server_section = {
        "model_repository": str(example_repo),
        "tls": {"cert_file": str(cert.cert), "key_file": str(cert.key)},
        "metrics_tls": True,
        "header_timeout_s": LIMIT_S,
        "body_timeout_s": LIMIT_S,
        "max_connections": 2,
    }
    (directory / "config.yaml").write_text(yaml.safe_dump({"server": server_section}))
    with ServerProcess("--config", str(directory / "config.yaml"), tls_ca=ca.cert) as server:
        yield server, ca.cert


def _tls_socket(port: int, ca: Path, alpn: list[str] | None = None) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=str(ca))
    if alpn:
        context.set_alpn_protocols(alpn)
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    return context.wrap_socket(raw, server_hostname="127.0.0.1")


def _until_closed(sock: socket.socket) -> bytes:
    """What the server sends before it closes the connection (a reset or a TLS alert ends it too)."""
    received = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, ssl.SSLError):
            return received
        if not chunk:
            return received
        received += chunk


def test_the_header_and_body_timeouts_hold_over_tls(capped_tls: tuple[ServerProcess, Path]) -> None:
    """A handshake never begun is cut off at the header timeout (not asyncio's 60 s); late headers
    and a trickled body get 408 and a close, as in plain text (S-09 over TLS)."""
    server, ca = capped_tls
    port = server.ports["http"]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as silent:
        started = time.monotonic()
        assert _until_closed(silent) == b""
        assert time.monotonic() - started < LIMIT_S + 1.5
    for request, late in (
        (b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n", b"request headers"),
        (b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n{", b"request body"),
    ):
        with _tls_socket(port, ca) as tls:
            tls.sendall(request)
            started = time.monotonic()
            answer = _until_closed(tls)
            assert time.monotonic() - started < LIMIT_S + 1.5
        assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer[:200]
        assert late + b" not received within 0.5 s" in answer and b"connection: close" in answer


def _served(port: int, ca: Path, alpn: list[str] | None = None) -> bool:
    """Whether a new TLS connection is served (it gets an answer, or the server's HTTP/2 settings)."""
    try:
        with _tls_socket(port, ca, alpn) as tls:
            if alpn is None:
                tls.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            return _until_closed(tls) != b"" if alpn is None else tls.recv(9) != b""
    except (ConnectionResetError, ssl.SSLError):
        return False


@pytest.mark.parametrize("port", ["http", "grpc"])
def test_max_connections_holds_over_tls(capped_tls: tuple[ServerProcess, Path], port: str) -> None:
    """Two TLS connections held: a third is closed unanswered; once they go, one is served again."""
    server, ca = capped_tls
    alpn = ["h2"] if port == "grpc" else None
    number = server.ports[port]
    held = [_tls_socket(number, ca, alpn) for _ in range(2)]
    try:
        for tls in held:  # each is counted once the server has made it (HTTP answers; gRPC sends its settings)
            if alpn is None:
                tls.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                assert tls.recv(4096).startswith(b"HTTP/1.1 200")
            else:
                assert tls.recv(9) != b""
        assert not _served(number, ca, alpn)
    finally:
        for tls in held:
            tls.close()
    deadline = time.monotonic() + 10
    while not _served(number, ca, alpn):
        assert time.monotonic() < deadline, "no connection was served after the held ones closed"
        time.sleep(0.05)


def test_failed_grpc_handshakes_hold_no_connection_place(capped_tls: tuple[ServerProcess, Path]) -> None:
    """Plain text to the gRPC TLS port fails its handshake; more such failures than max_connections
    still leave room for a real client (asyncio never reports a failed handshake's connection lost,
    so counting connections at accept leaked a place each time)."""
    server, ca = capped_tls
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", server.ports["grpc"]), timeout=10) as plain:
            plain.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            _until_closed(plain)
    client = grpcclient.InferenceServerClient(server.grpc_address, ssl=True, root_certificates=str(ca))
    try:
        assert client.is_server_live()
    finally:
        client.close()


def test_the_metrics_port_speaks_https_with_metrics_tls(capped_tls: tuple[ServerProcess, Path]) -> None:
    server, ca = capped_tls
    url = f"https://127.0.0.1:{server.ports['metrics']}/metrics"
    with httpx.Client(verify=ssl.create_default_context(cafile=str(ca)), timeout=10) as client:
        scraped = client.get(url)
    assert scraped.status_code == 200 and "tensorgate_" in scraped.text
    with pytest.raises(httpx.TransportError):
        httpx.get(url.replace("https://", "http://"), timeout=5)
