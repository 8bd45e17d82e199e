"""G-1 (subset): SIGTERM turns readiness false at once, keeps serving through the drain delay,
finishes in-flight requests, and exits 0.
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
from model_builders import metric, v2_body, wait_until, write_python_model
from port_probe import refused, until_refused

from tensorgate.testing import ServerProcess

DRAIN_S = 2.0
BODY = json.dumps({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]}).encode()


def _status_line(sock: socket.socket) -> int:
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError(f"closed before a status line: {data!r}")
        data += chunk
    return int(data.split(b"\r\n", 1)[0].split()[1])


def _start_slow_request(port: int) -> socket.socket:
    """Headers and half the body: the request is in flight until the rest is sent."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=15)
    head = f"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(BODY)}\r\n\r\n".encode()
    sock.sendall(head + BODY[: len(BODY) // 2])
    return sock


def test_sigterm_drains_then_exits_zero(example_repo: Path) -> None:
    server = ServerProcess(
        "--model-repository", str(example_repo), "--drain-delay", str(DRAIN_S), "--log-level", "info"
    )
    with server:
        port = server.ports["http"]
        url = server.url
        stop_load = threading.Event()
        statuses: list[int] = []
        errors: list[str] = []

        def load() -> None:
            # Steady traffic on keep-alive connections until the listener is about to close.
            with httpx.Client(base_url=url, timeout=10.0) as client:
                while not stop_load.is_set():
                    try:
                        statuses.append(client.post("/v2/models/mlp/infer", content=BODY).status_code)
                    except httpx.HTTPError as exc:
                        errors.append(repr(exc))

        worker = threading.Thread(target=load)
        worker.start()
        early = _start_slow_request(port)
        with httpx.Client(base_url=url, timeout=5.0) as probe:
            assert probe.get("/v2/health/ready").status_code == 200
            server.signal(signal.SIGTERM)
            sent = time.monotonic()
            # "At once" is an order, not a time: readiness turns false in the step that logs the
            # request, so the first probe after the log line must already see it.
            wait_until(lambda: any("shutdown requested" in str(r.get("message")) for r in server.log_records()))
            assert probe.get("/v2/health/ready").status_code == 400
            # During the drain delay: live, still serving, and telling keep-alive clients to leave.
            while time.monotonic() - sent < DRAIN_S * 0.6:
                assert probe.get("/v2/health/live").status_code == 200
                assert probe.get("/v2/health/ready").status_code == 400
                assert probe.get("/v2/models/mlp/ready").status_code == 400
                response = probe.post("/v2/models/mlp/infer", content=BODY)
                assert response.status_code == 200
                assert response.headers.get("connection") == "close"
                time.sleep(0.05)
        late = _start_slow_request(port)
        stop_load.set()
        worker.join(10)
        # Finish both in-flight requests, the late one after the listener has begun to close.
        early.sendall(BODY[len(BODY) // 2 :])
        assert _status_line(early) == 200
        early.close()
        until_refused(port, timeout_s=DRAIN_S + 5)  # the drain delay is over: the listener has closed
        late.sendall(BODY[len(BODY) // 2 :])
        assert _status_line(late) == 200
        late.close()

        assert server.process is not None
        code = server.process.wait(timeout=DRAIN_S + 5)
        elapsed = time.monotonic() - sent
        assert code == 0, server.log()
        assert elapsed < DRAIN_S + 4
        assert not errors, errors[:3]
        assert statuses and set(statuses) == {200}
        assert refused(port)
        messages = [json.loads(line).get("message", "") for line in server.log_path.read_text().splitlines()]
        assert any("shutdown requested" in m for m in messages)
        assert any("server stopped" in m for m in messages)


def test_the_exit_timeout_bounds_the_whole_exit_when_every_worker_is_stuck(tmp_path: Path) -> None:
    """Three process workers each stuck in a 60 s batch, a fourth request queued, an exit timeout
    under a second: the exit takes that timeout plus one worker kill grace (5 s), not a stage's
    timeout after another and a grace per worker, and never waits for the model."""
    write_python_model(
        tmp_path,
        "stuck",
        parameters={"delay_ms": 60_000},
        max_batch_size=1,
        dynamic_batching={"max_queue_delay_ms": 0},
        instance_group=[{"count": 3, "isolation": "process"}],
    )
    args = ("--model-repository", str(tmp_path), "--exit-timeout", "0.5", "--drain-delay", "0")
    with ServerProcess(*args) as server:
        body = json.dumps(v2_body([[1.0] * 4])).encode()
        head = (
            f"POST /v2/models/stuck/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        )
        clients = [socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=15) for _ in range(4)]
        for client in clients:
            client.sendall(head + body)
        wait_until(lambda: metric(server.metrics_url, "tensorgate_inflight_requests", model="stuck") == 4)
        assert server.process is not None
        sent = time.monotonic()
        server.signal(signal.SIGTERM)
        code = server.process.wait(timeout=30)
        elapsed = time.monotonic() - sent
        # Each client was answered from the error table (503, retry elsewhere), not left hanging.
        statuses = [_status_line(client) for client in clients]
        for client in clients:
            client.close()
    assert code == 0, server.log()
    assert elapsed < 0.5 + 5 + 3, f"exit took {elapsed:.1f} s"
    assert statuses == [503] * 4


def test_a_stop_signal_repeated_through_shutdown_never_kills_the_server(example_repo: Path) -> None:
    """A supervisor that repeats SIGTERM until the process is gone: every repeat, up to the exit
    itself, is absorbed, and the exit stays 0. Once, repeats landing as the signal handlers were
    taken down (briefly back to the default action) killed 4 servers in 30 with SIGTERM."""
    for _ in range(3):  # the gap was microseconds wide: several shutdowns, many signals each
        with ServerProcess("--model-repository", str(example_repo), "--drain-delay", "0") as server:
            assert server.process is not None
            server.signal(signal.SIGTERM)
            sent = time.monotonic()
            repeats = 0
            while server.process.poll() is None and time.monotonic() - sent < 20:
                try:
                    server.signal(signal.SIGTERM)
                except ProcessLookupError:  # exited between the poll and the signal
                    break
                repeats += 1
                time.sleep(0.0002)
            code = server.process.wait(timeout=10)
        assert code == 0, f"exit {code} after {repeats} repeated SIGTERMs:\n{server.log()[-2000:]}"
        assert repeats > 0
