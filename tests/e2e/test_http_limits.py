"""Request size limits, enforced before decoding work (and, for a declared length, before reading).

The server runs with ``--max-body-bytes 1048576``. Valid requests just under the limit pass as JSON,
binary and gzip; anything over it is 413, whether declared, chunked or decompressed.
"""

from __future__ import annotations

import gzip
import json
import select
import socket
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tensorgate.testing import ServerProcess

LIMIT = 1 << 20
KIB = 1024


@pytest.fixture(scope="module")
def server(example_repo: Path) -> Iterator[ServerProcess]:
    args = ("--model-repository", str(example_repo), "--max-body-bytes", str(LIMIT), "--log-level", "warning")
    with ServerProcess(*args) as process:
        yield process


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30.0) as c:
        yield c


def _json_body(size: int, images: int = 4) -> bytes:
    """A valid cnn request of exactly ``size`` bytes (JSON padded with whitespace)."""
    data = np.full((images, 3, 32, 32), 0.5, dtype=np.float32)
    text = json.dumps(
        {"inputs": [{"name": "image", "datatype": "FP32", "shape": list(data.shape), "data": data.ravel().tolist()}]}
    ).encode()
    assert len(text) <= size
    return text + b" " * (size - len(text))


def _binary_body(size: int, images: int = 16) -> tuple[bytes, dict[str, str]]:
    blob = np.full((images, 3, 32, 32), 0.25, dtype=np.float32).tobytes()
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "image",
                    "datatype": "FP32",
                    "shape": [images, 3, 32, 32],
                    "parameters": {"binary_data_size": len(blob)},
                }
            ]
        }
    ).encode()
    header += b" " * (size - len(header) - len(blob))
    return header + blob, {"Inference-Header-Content-Length": str(len(header))}


def _assert_ok(response: httpx.Response, rows: int) -> None:
    assert response.status_code == 200, response.text[:300]
    assert response.json()["outputs"][0]["shape"] == [rows, 10]


def _assert_413(response: httpx.Response) -> None:
    assert response.status_code == 413, response.text[:300]
    assert "exceeds the maximum allowed size" in response.json()["error"]


def test_json_just_under_the_limit(client: httpx.Client) -> None:
    body = _json_body(LIMIT - KIB)
    _assert_ok(client.post("/v2/models/cnn/infer", content=body), 4)


def test_binary_just_under_the_limit(client: httpx.Client) -> None:
    body, headers = _binary_body(LIMIT - KIB)
    assert len(body) == LIMIT - KIB
    _assert_ok(client.post("/v2/models/cnn/infer", content=body, headers=headers), 16)


def test_gzip_just_under_the_limit(client: httpx.Client) -> None:
    body = gzip.compress(_json_body(LIMIT - KIB))
    _assert_ok(client.post("/v2/models/cnn/infer", content=body, headers={"Content-Encoding": "gzip"}), 4)


def test_json_over_the_limit(client: httpx.Client) -> None:
    _assert_413(client.post("/v2/models/cnn/infer", content=_json_body(LIMIT + KIB)))
    assert client.get("/v2/health/live").status_code == 200


def test_binary_over_the_limit(client: httpx.Client) -> None:
    body, headers = _binary_body(LIMIT + KIB)
    _assert_413(client.post("/v2/models/cnn/infer", content=body, headers=headers))


def test_v1_over_the_limit(client: httpx.Client) -> None:
    _assert_413(client.post("/v1/models/cnn:predict", content=b"{" + b" " * (LIMIT + KIB)))


def test_chunked_over_the_limit(client: httpx.Client) -> None:
    body = _json_body(LIMIT + KIB)

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(body), 64 * KIB):
            yield body[start : start + 64 * KIB]

    response = client.post("/v2/models/cnn/infer", content=chunks())
    _assert_413(response)
    assert client.get("/v2/health/live").status_code == 200


def test_chunked_under_the_limit(client: httpx.Client) -> None:
    body = _json_body(LIMIT - KIB)
    response = client.post("/v2/models/cnn/infer", content=iter([body[: len(body) // 2], body[len(body) // 2 :]]))
    _assert_ok(response, 4)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_decompression_bomb(client: httpx.Client, encoding: str) -> None:
    raw = b"{" + b" " * (LIMIT + (1 << 20))
    body = gzip.compress(raw) if encoding == "gzip" else zlib.compress(raw)
    assert len(body) < (1 << 20)
    response = client.post("/v2/models/cnn/infer", content=body, headers={"Content-Encoding": encoding})
    assert response.status_code == 413
    assert "decompressed request body exceeds" in response.json()["error"]
    assert client.get("/v2/health/live").status_code == 200


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"connection closed before a response; got {data[:200]!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return int(lines[0].split()[1]), headers, rest


def test_declared_length_over_the_limit_is_refused_before_the_body(server: ServerProcess) -> None:
    """Content-Length over the limit and a few body bytes: the 413 arrives without the rest being sent."""
    with socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=10) as sock:
        sock.sendall(
            b"POST /v2/models/cnn/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {LIMIT + KIB}\r\n\r\n".encode()
            + b'{"inputs": '
        )
        status, _headers, body = _read_response(sock)
    assert status == 413
    assert "exceeds the maximum allowed size" in json.loads(body)["error"]
    assert httpx.get(server.url + "/v2/health/live").status_code == 200


def test_too_many_chunks(server: ServerProcess) -> None:
    """65 537 one-byte chunks (Triton's CVE-2025-23310 regression) -> 400, even for a valid body."""
    valid = json.dumps(
        {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16], "data": [0.0] * 16}]}
    ).encode()
    body = valid + b" " * (65537 - len(valid))
    framed = b"".join(b"1\r\n" + body[i : i + 1] + b"\r\n" for i in range(len(body))) + b"0\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=20) as sock:
        sock.sendall(
            b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Type: application/json\r\n\r\n"
        )
        try:
            sock.sendall(framed)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer and close before every chunk is sent
        status, _headers, payload = _read_response(sock)
    assert status == 400
    assert "chunks" in json.loads(payload)["error"]
    assert httpx.get(server.url + "/v2/health/live").status_code == 200


def test_a_few_chunks_are_fine(server: ServerProcess) -> None:
    body = json.dumps(
        {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16], "data": [0.0] * 16}]}
    ).encode()
    framed = b"".join(b"%x\r\n" % len(body[i : i + 8]) + body[i : i + 8] + b"\r\n" for i in range(0, len(body), 8))
    with socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=20) as sock:
        sock.sendall(
            b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
            + framed
            + b"0\r\n\r\n"
        )
        status, _headers, _payload = _read_response(sock)
    assert status == 200


def _exchange(server: ServerProcess, request: bytes) -> tuple[int, dict[str, str], bytes]:
    with socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=20) as sock:
        try:
            sock.sendall(request)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused and closed before everything was sent
        return _read_response(sock)


def test_uri_too_long(server: ServerProcess) -> None:
    status, headers, body = _exchange(
        server, b"GET /v2/models/" + b"a" * (16 * KIB) + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    )
    assert status == 414
    assert headers["connection"] == "close"
    assert "URI exceeds" in json.loads(body)["error"]
    long_but_fine = (
        b"GET /v2/health/live?" + b"q" * (8 * KIB) + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    assert _exchange(server, long_but_fine)[0] == 200


@pytest.mark.parametrize(
    "headers",
    [
        b"".join(b"X-H%d: v\r\n" % i for i in range(200)),
        b"X-Big: " + b"v" * (80 * KIB) + b"\r\n",
        b"X-Endless: " + b"v" * (2 << 20),  # never completes: bounded while buffering
    ],
    ids=["200-headers", "80-KiB-header", "unterminated-2-MiB-header"],
)
def test_headers_too_large(server: ServerProcess, headers: bytes) -> None:
    status, _headers, body = _exchange(
        server, b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers + b"\r\n"
    )
    assert status == 431
    assert "headers exceed" in json.loads(body)["error"]
    assert httpx.get(server.url + "/v2/health/live").status_code == 200


def test_ordinary_headers_are_fine(server: ServerProcess) -> None:
    headers = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 100) for i in range(50))
    request = b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + headers + b"\r\n"
    assert _exchange(server, request)[0] == 200


def test_pipelined_requests_on_one_connection(server: ServerProcess) -> None:
    one = b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    last = b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    received = b""
    with socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=20) as sock:
        sock.sendall(one * 2 + last)
        while chunk := sock.recv(65536):
            received += chunk
    assert received.count(b"HTTP/1.1 200 OK\r\n") == 3, received


def test_large_v1_request(client: httpx.Client) -> None:
    """A V1 body past the off-loop decoding threshold (256 KiB) decodes like a small one."""
    images = np.full((16, 3, 32, 32), 0.25, dtype=np.float32)
    body = json.dumps({"instances": images.tolist()}).encode()
    assert len(body) > 256 * KIB
    response = client.post("/v1/models/cnn:predict", content=body)
    assert response.status_code == 200, response.text[:300]
    assert np.array(response.json()["predictions"]).shape == (16, 10)


@pytest.mark.slow
def test_header_timeout(server: ServerProcess) -> None:
    """Slowloris: headers that never complete get 408 and a close after the header timeout (10 s by
    default); a connection that never starts a request is closed quietly at the same time.
    """
    port = server.ports["http"]
    with (
        socket.create_connection(("127.0.0.1", port), timeout=20) as slow,
        socket.create_connection(("127.0.0.1", port), timeout=20) as idle,
    ):
        started = time.monotonic()
        slow.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        status, headers, body = _read_response(slow)
        assert 9.0 < time.monotonic() - started < 12.0
        assert status == 408
        assert headers["connection"] == "close"
        assert "not received within" in json.loads(body)["error"]
        assert idle.recv(1024) == b""
        assert time.monotonic() - started < 12.0
    assert httpx.get(server.url + "/v2/health/live").status_code == 200


def test_gzip_body_over_the_limit_before_inflating(client: httpx.Client) -> None:
    """A compressed body is limited as sent, too: incompressible gzip past the limit is 413 unread."""
    body = gzip.compress(np.random.default_rng(0).bytes(LIMIT + KIB), mtime=0)
    assert len(body) > LIMIT
    response = client.post("/v2/models/cnn/infer", content=body, headers={"Content-Encoding": "gzip"})
    _assert_413(response)


def test_a_chunked_body_is_refused_soon_after_it_passes_the_limit(server: ServerProcess) -> None:
    """No Content-Length to check ahead: the server counts the chunks as they come and answers 413
    within about a MiB past the limit, not after buffering megabytes more."""
    chunk = b"4" * (256 * KIB)
    sent = 0
    answered_at = None
    with socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=10) as sock:
        sock.sendall(
            b"POST /v2/models/cnn/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        while sent < 6 * LIMIT:
            try:
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except OSError:  # the server answered and closed while this was on its way
                answered_at = sent
                break
            sent += len(chunk)
            readable, _, _ = select.select([sock], [], [], 0.5)
            if readable:
                answered_at = sent
                break
        assert answered_at is not None and answered_at <= 3 * LIMIT, f"no answer after {sent} bytes"
        status, _, body = _read_response(sock)
    assert status == 413 and b"exceeds the maximum allowed size" in body
