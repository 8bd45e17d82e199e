"""The gRPC listener's startup: a taken port fails the start with a clear message and exit code 1."""

from __future__ import annotations

import socket
import subprocess
import sys


def test_busy_grpc_port_fails_the_start() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [sys.executable, "-m", "tensorgate", "serve", "--http-port", "0", "--metrics-port", "0"]
        result = subprocess.run(
            [*command, "--grpc-port", str(port)], capture_output=True, text=True, timeout=60, check=False
        )
    assert result.returncode == 1
    assert f"gRPC cannot bind 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr
