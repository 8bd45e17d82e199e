"""Front-end processes in front of one scheduler process: what the hop between them costs.

A fallback, should no HTTP server reach the bar on one core: HTTP parsed in front-end
processes sharing the port, each request handed to the one process that schedules and runs the
model. This measures that shape with nothing else in it, so the hop's own cost shows:

- the back end (``python _hop.py backend SOCKET``): the scheduler's side, one asyncio process that
  answers each framed request on a Unix socket with the fixed V2 answer of ``_echo.py``;
- the front ends (``python _hop.py frontend PORT SOCKET WORKERS``): uvicorn (httptools, uvloop) with
  ``WORKERS`` processes on one listening socket, each holding one Unix connection to the back end,
  requests multiplexed on it by id.

The back end's event-loop CPU per request is what the scheduler's core would pay per request in
place of HTTP; the front ends' req/s against the bare echo server, what the hop costs a client.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _echo import BODY, free_port, wait_answering

_HEAD = struct.Struct(">II")  # payload length, request id


class _Backend(asyncio.Protocol):
    def __init__(self) -> None:
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        out: list[bytes] = []
        pos = 0
        while len(buffer) - pos >= _HEAD.size:
            length, request_id = _HEAD.unpack_from(buffer, pos)
            if len(buffer) - pos - _HEAD.size < length:
                break
            pos += _HEAD.size + length  # the request's bytes: a scheduler would decode them here
            out.append(_HEAD.pack(len(BODY), request_id) + BODY)
        del buffer[:pos]
        if out and self._transport is not None:
            self._transport.write(b"".join(out))


class _Upstream(asyncio.Protocol):
    """One front end's connection to the back end: requests out, answers matched back by id."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._waiting: dict[int, asyncio.Future[bytes]] = {}
        self._ids = itertools.count()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        pos = 0
        while len(buffer) - pos >= _HEAD.size:
            length, request_id = _HEAD.unpack_from(buffer, pos)
            if len(buffer) - pos - _HEAD.size < length:
                break
            start = pos + _HEAD.size
            future = self._waiting.pop(request_id, None)
            if future is not None and not future.done():
                future.set_result(bytes(buffer[start : start + length]))
            pos = start + length
        del buffer[:pos]

    def ask(self, body: bytes) -> asyncio.Future[bytes]:
        request_id = next(self._ids) & 0xFFFFFFFF
        future = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        assert self.transport is not None
        self.transport.write(_HEAD.pack(len(body), request_id) + body)
        return future


_upstream: _Upstream | None = None


async def frontend_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    global _upstream
    if scope["type"] != "http":
        return
    if _upstream is None:
        loop = asyncio.get_running_loop()
        _, _upstream = await loop.create_unix_connection(_Upstream, os.environ["HOP_SOCKET"])
    parts = []
    more = True
    while more:
        message = await receive()
        parts.append(message.get("body", b""))
        more = message.get("more_body", False)
    answer = await _upstream.ask(b"".join(parts))
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": answer})


def serve_backend(path: str) -> None:
    import uvloop

    async def main() -> None:
        server = await asyncio.get_running_loop().create_unix_server(_Backend, path)
        await server.serve_forever()

    uvloop.run(main())


def serve_frontend(port: int, path: str, workers: int) -> None:
    import uvicorn

    os.environ["HOP_SOCKET"] = path
    uvicorn.run(
        "_hop:frontend_app",
        host="127.0.0.1",
        port=port,
        workers=workers,
        log_level="warning",
        access_log=False,
        loop="uvloop",
        http="httptools",
    )


class HopServer:
    """A back end and ``workers`` front-end processes; ``backend_pid`` is the scheduler side's loop."""

    def __init__(self, workers: int) -> None:
        here = Path(__file__).resolve().parent
        self._dir = tempfile.TemporaryDirectory(prefix="tg-hop-")
        socket_path = str(Path(self._dir.name) / "backend.sock")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.backend = subprocess.Popen([sys.executable, str(here / "_hop.py"), "backend", socket_path], cwd=here)
        deadline = time.monotonic() + 30
        while not Path(socket_path).exists():
            if time.monotonic() > deadline or self.backend.poll() is not None:
                raise TimeoutError("the hop's back end did not start")
            time.sleep(0.02)
        self.frontend = subprocess.Popen(
            [sys.executable, str(here / "_hop.py"), "frontend", str(self.port), socket_path, str(workers)],
            cwd=here,
            stdout=subprocess.DEVNULL,
        )

    def wait_ready(self) -> None:
        wait_answering(self.port, self.frontend, "the hop's front ends")

    @property
    def backend_pid(self) -> int:
        return self.backend.pid

    def close(self) -> None:
        for process in (self.frontend, self.backend):
            process.terminate()
            process.wait(10)
        self._dir.cleanup()


if __name__ == "__main__":
    if sys.argv[1] == "backend":
        serve_backend(sys.argv[2])
    else:
        serve_frontend(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
