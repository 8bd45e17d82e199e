"""At shutdown the HTTP listener closes its port with connections still on their way in, and serves
them: a client that connected before the port closed gets its answer, whatever it had sent by then.

- A connection that had sent nothing yet, and one halfway through its headers, both finish their
  requests after the port has closed: 200, ``connection: close``, then closed by the server.
- A connection that never sends is closed quietly within ``SHUTDOWN_FIRST_REQUEST_S``, so it cannot
  hold the exit for the header timeout.

(Connections the kernel had completed but the server not yet accepted are taken before the port
closes; that race is timing's, exercised by the container drain under 8 clients in
tests/delivery/test_image.py.)
"""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path

from port_probe import until_refused

from tensorgate.protocols.http.listener import SHUTDOWN_FIRST_REQUEST_S
from tensorgate.testing import ServerProcess

DRAIN_S = 1.0
BODY = json.dumps({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]}).encode()


def _request(port: int) -> bytes:
    head = f"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {len(BODY)}\r\n\r\n"
    return head.encode() + BODY


def _answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_connections_opened_before_the_port_closed_are_served(example_repo: Path) -> None:
    server = ServerProcess("--model-repository", str(example_repo), "--drain-delay", str(DRAIN_S))
    with server:
        port = server.ports["http"]
        request = _request(port)
        fresh = socket.create_connection(("127.0.0.1", port), timeout=15)
        halfway = socket.create_connection(("127.0.0.1", port), timeout=15)
        split = request.index(b"Content-Length")
        halfway.sendall(request[:split])
        server.signal(signal.SIGTERM)
        until_refused(port, timeout_s=DRAIN_S + 10)  # the drain delay is over: the port has closed
        fresh.sendall(request)
        halfway.sendall(request[split:])
        for sock in (fresh, halfway):
            answer = _answer(sock)
            sock.close()
            head = answer.split(b"\r\n\r\n", 1)[0].lower()
            assert head.startswith(b"http/1.1 200"), answer[:300]
            assert b"\r\nconnection: close" in head
        assert server.process is not None
        assert server.process.wait(timeout=30) == 0, server.log()


def test_a_connection_that_never_sends_is_closed_quietly_and_holds_nothing(example_repo: Path) -> None:
    server = ServerProcess("--model-repository", str(example_repo), "--drain-delay", str(DRAIN_S))
    with server:
        port = server.ports["http"]
        silent = socket.create_connection(("127.0.0.1", port), timeout=30)
        server.signal(signal.SIGTERM)
        sent = time.monotonic()
        assert _answer(silent) == b"", "closed without an unasked-for answer"
        closed_after = time.monotonic() - sent
        silent.close()
        assert server.process is not None
        assert server.process.wait(timeout=30) == 0, server.log()
        # The header timeout (10 s) would have held it far longer.
        assert closed_after < DRAIN_S + SHUTDOWN_FIRST_REQUEST_S + 3.0
