"""Whether a server in another process still listens on a port: known only by connecting."""

from __future__ import annotations

import socket
import time


def refused(port: int) -> bool:
    """Whether a connection to ``port`` on loopback is refused (nothing listens there)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return True
    return False


def until_refused(port: int, timeout_s: float) -> None:
    """Wait, by connecting, until nothing listens on ``port`` (another process: nothing to wait on)."""
    deadline = time.monotonic() + timeout_s
    while not refused(port):
        assert time.monotonic() < deadline, f"port {port} still accepted connections after {timeout_s} s"
        time.sleep(0.02)
