"""A gRPC server on the event loop: accepts connections, opens a call per stream, shuts down in order.

What it serves is a :class:`~tensorgate.protocols.grpc.methods.MethodTable`; the listener fills it
with tensorgate's services, tests with their own.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Literal, Protocol

from tensorgate.protocols.grpc.call import Call, CallSettings, CallStream, open_call
from tensorgate.protocols.grpc.h2_connection import H2ServerConnection
from tensorgate.protocols.grpc.http2.connection import Http2Limits, Http2ServerConnection
from tensorgate.protocols.grpc.http2.header_blocks import Headers
from tensorgate.protocols.grpc.methods import MethodTable

# The HTTP/2 connections the server can run its calls on: tensorgate's own, or the h2 library's.
Transport = Literal["native", "h2"]


class _Connection(Protocol):
    def goaway(self) -> None: ...

    def close(self) -> None: ...


class _TurnedAway(asyncio.Protocol):
    """A connection past ``max_connections``: closed as it is accepted, before a byte is read."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.abort()  # type: ignore[attr-defined]


class _Native(Http2ServerConnection):
    """Counted among its server's connections from ``connection_made``, not from accept: asyncio calls
    neither ``connection_made`` nor ``connection_lost`` on a connection whose TLS handshake fails, so
    one counted at accept would hold its ``max_connections`` place for ever."""

    counted: set[_Connection]
    cap: int | None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if _counted(self, transport):
            super().connection_made(transport)


class _H2(H2ServerConnection):
    """The h2 library's connection, counted from ``connection_made`` like :class:`_Native`."""

    counted: set[_Connection]
    cap: int | None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if _counted(self, transport):
            super().connection_made(transport)


def _counted(conn: _Native | _H2, transport: asyncio.BaseTransport) -> bool:
    """Count ``conn``, or close it unread when its server's connections are at the cap (checked here
    too: several connections accepted at once are all made before any is counted)."""
    if conn.cap is not None and len(conn.counted) >= conn.cap:
        transport.abort()  # type: ignore[attr-defined]
        return False
    conn.counted.add(conn)
    return True


class GrpcServer:
    def __init__(
        self,
        methods: MethodTable,
        settings: CallSettings,
        limits: Http2Limits = Http2Limits(),
        *,
        tls: ssl.SSLContext | None = None,
        max_connections: int | None = None,
        transport: Transport = "native",
    ) -> None:
        self._methods = methods
        self._transport = transport
        self._settings = settings
        self._limits = limits
        self._tls = tls
        self._max_connections = max_connections
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self._calls: set[Call] = set()

    async def start(self, host: str | None, port: int) -> int:
        """Listen; returns the bound port. Raises OSError when the address is taken or unavailable."""
        self._server = await asyncio.get_running_loop().create_server(
            self._connection, host or None, port, reuse_address=True, ssl=self._tls
        )
        return int(self._server.sockets[0].getsockname()[1])

    def _connection(self) -> asyncio.Protocol:
        if self._max_connections is not None and len(self._connections) >= self._max_connections:
            return _TurnedAway()
        conn: _Native | _H2

        def opener(stream: CallStream, headers: Headers) -> Call | None:
            return open_call(stream, headers, conn, self._methods, self._settings, self._calls)

        if self._transport == "h2":
            conn = _H2(opener, self._limits, self._connections.discard)
        else:
            conn = _Native(opener, self._limits, self._connections.discard)
        conn.counted, conn.cap = self._connections, self._max_connections  # counted once its handshake is done
        return conn

    async def stop(self, grace_s: float, end_at_once: Callable[[Call], bool] = lambda call: False) -> None:
        """No new connections or calls (GOAWAY); calls in flight get ``grace_s`` to finish, then end
        UNAVAILABLE. Calls that ``end_at_once`` picks (streams that never end alone) end right away."""
        if self._server is not None:
            self._server.close()
        for conn in list(self._connections):
            conn.goaway()
        for call in list(self._calls):
            if end_at_once(call):
                call.shut_down()
        await self._wait_calls(grace_s)
        for call in list(self._calls):
            call.shut_down()
        await self._wait_calls(1.0)
        for conn in list(self._connections):
            conn.close()

    async def _wait_calls(self, timeout_s: float) -> None:
        tasks = [call.task for call in self._calls if call.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
