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

import uvicorn
from prometheus_client import CollectorRegistry, make_asgi_app


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
            http="httptools",
            loop="none",
            lifespan="off",
            access_log=False,
            log_config=None,
            server_header=False,
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
