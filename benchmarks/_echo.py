"""Bare endpoints that answer a fixed V2 response: what an HTTP front end costs with no server behind it.

Each reads the whole request body and answers the same small V2 JSON response the ``mlp`` model
gives, so a client sees the same bytes as from ``tensorgate serve``. They run in a child process
(``python benchmarks/_echo.py KIND PORT``) so that their CPU can be measured apart from the client's:

- ``uvicorn``: an ASGI app under uvicorn with httptools and uvloop (what tensorgate's listener is
  built on);
- ``granian-rsgi`` and ``granian-asgi``: Granian (HTTP in Rust, one worker, one runtime thread)
  through its own RSGI interface and through ASGI.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BODY = (
    b'{"model_name":"mlp","model_version":"1","outputs":[{"name":"probabilities","datatype":"FP32",'
    b'"shape":[1,3],"data":[0.2,0.3,0.5]}]}'
)
KINDS = ("uvicorn", "granian-rsgi", "granian-asgi")


async def asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": BODY})


async def rsgi_app(scope: Any, protocol: Any) -> None:
    await protocol()  # the whole body
    protocol.response_bytes(200, [("content-type", "application/json")], BODY)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def serve(kind: str, port: int) -> None:
    if kind == "uvicorn":
        import uvicorn

        config = uvicorn.Config(
            asgi_app,
            host="127.0.0.1",
            port=port,
            log_level="warning",
            access_log=False,
            loop="uvloop",
            http="httptools",
        )
        uvicorn.Server(config).run()
        return
    from granian import Granian
    from granian.constants import Interfaces, Loops

    interface = Interfaces.RSGI if kind == "granian-rsgi" else Interfaces.ASGINL
    target = "_echo:rsgi_app" if kind == "granian-rsgi" else "_echo:asgi_app"
    Granian(
        target,
        address="127.0.0.1",
        port=port,
        interface=interface,
        workers=1,
        runtime_threads=1,
        loop=Loops.uvloop,
        websockets=False,
        log_enabled=False,
    ).serve()


def wait_answering(port: int, process: subprocess.Popen[bytes], what: str, timeout_s: float = 30.0) -> None:
    """Until ``port`` answers an infer request with 200 (polled: the server is another process)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
                conn.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
                if conn.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        if time.monotonic() > deadline or process.poll() is not None:
            raise TimeoutError(f"{what} did not start")
        time.sleep(0.05)


class EchoServer:
    """One bare endpoint in a child process; ``pids()`` covers Granian's worker process too."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        here = Path(__file__).resolve().parent
        self.process = subprocess.Popen(
            [sys.executable, str(here / "_echo.py"), kind, str(self.port)], cwd=here, stdout=subprocess.DEVNULL
        )

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        wait_answering(self.port, self.process, f"the {self.kind} echo server", timeout_s)

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(10)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
