"""An HTTP listener on a bound socket: uvicorn (httptools, uvloop) without its signal handling.

The :class:`~tensorgate.server.Server` owns signals and the shutdown order, so uvicorn must not
install handlers of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import orjson
import uvicorn
from prometheus_client import CollectorRegistry, make_asgi_app
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tensorgate.protocols.http.body import MAX_CHUNKS


class _ChunkLimitExceeded(Exception):
    pass


class _Protocol(HttpToolsProtocol):  # type: ignore[misc]
    """uvicorn's httptools protocol, counting HTTP chunks per request and answering parse errors in JSON.

    uvicorn joins the chunks that arrive together into one ASGI message, so only the parser sees how
    many chunks a body had. Past ``MAX_CHUNKS`` (Triton's CVE-2025-23310 regression sends one more)
    the request is refused with 400 and the connection closed.
    """

    _chunks = 0
    _reason = ""

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._chunks = 0

    def on_chunk_header(self) -> None:
        self._chunks += 1
        if self._chunks > MAX_CHUNKS and not (self.cycle is not None and self.cycle.response_started):
            self._reason = f"request body arrived in more than {MAX_CHUNKS} chunks"
            raise _ChunkLimitExceeded  # the parser turns it into HttpParserError: send_400_response

    def send_400_response(self, msg: str) -> None:
        body = orjson.dumps({"error": self._reason or "invalid HTTP request"})
        self.transport.write(
            b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
            + b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
            + body
        )
        self.transport.close()


class _Uvicorn(uvicorn.Server):  # type: ignore[misc]
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpListener:
    def __init__(
        self,
        name: str,
        app: Any,
        sock: socket.socket,
        *,
        keep_alive_s: float = 75.0,
        exit_timeout_s: float = 30.0,
    ) -> None:
        self.name = name
        self._socket = sock
        config = uvicorn.Config(
            app,
            http=_Protocol,
            loop="none",
            lifespan="off",
            access_log=False,
            log_config=None,
            server_header=False,
            proxy_headers=False,  # X-Forwarded-* is not trusted unless a proxy setup says so
            date_header=False,
            # Keep idle connections longer than proxies do (nginx 60 s) so the proxy never reuses a
            # connection we are closing.
            timeout_keep_alive=int(keep_alive_s),
            timeout_graceful_shutdown=int(exit_timeout_s) or None,
            backlog=2048,
        )
        self._server = _Uvicorn(config)
        self._task: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        return int(self._socket.getsockname()[1])

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=[self._socket]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        """Stop accepting, finish in-flight requests (within the exit timeout), close connections."""
        self._server.should_exit = True
        if self._task is not None:
            await self._task
        self._socket.close()


def metrics_app(registry: CollectorRegistry) -> Any:
    return make_asgi_app(registry=registry)
