"""A gRPC server on the event loop: accepts connections, opens a call per stream, shuts down in order.

What it serves is a :class:`~tensorgate.protocols.grpc.methods.MethodTable`; the listener fills it
with tensorgate's services, tests with their own.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import Protocol, cast

from tensorgate.protocols.accept_queue import take_queued
from tensorgate.protocols.grpc.call import Call, CallConnection, CallSettings, CallStream, open_call
from tensorgate.protocols.grpc.http2.connection import Http2Limits, Http2ServerConnection
from tensorgate.protocols.grpc.http2.header_blocks import Headers
from tensorgate.protocols.grpc.methods import MethodTable

# Opens the call a new stream carries (None: the stream was refused).
Opener = Callable[[CallStream, Headers], Call | None]


log = logging.getLogger(__name__)

# How long the first GOAWAY of a shutdown leaves for calls already on their way to arrive: a round
# trip on any network a replica sits on, with room for a busy event loop.
GOAWAY_WARNING_S = 0.1
# A TLS handshake not done by then is given up (asyncio's own default is 60 s).
HANDSHAKE_TIMEOUT_S = 10.0


class Connection(CallConnection, Protocol):
    """What the server and its calls need of the HTTP/2 connection an accepted socket runs on."""

    def warn_goaway(self) -> None: ...

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

    counted: set[Connection]
    cap: int | None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if _counted(self, transport):
            super().connection_made(transport)


def _counted(conn: _Native, transport: asyncio.BaseTransport) -> bool:
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
    ) -> None:
        self._methods = methods
        self._settings = settings
        self.limits = limits
        self._tls = tls
        self._max_connections = max_connections
        self._server: asyncio.Server | None = None
        self._host: str | None = None
        self._port = 0
        self._queued: set[asyncio.Task[object]] = set()  # connections taken from the kernel's queue at a pause
        self._connections: set[Connection] = set()
        self._calls: set[Call] = set()

    async def start(self, host: str | None, port: int) -> int:
        """Listen; returns the bound port. Raises OSError when the address is taken or unavailable."""
        self._host = host or None
        self._server = await self._listen(port)
        self._port = int(self._server.sockets[0].getsockname()[1])
        return self._port

    async def _listen(self, port: int) -> asyncio.Server:
        loop = asyncio.get_running_loop()
        if self._tls is None:
            return await loop.create_server(self._connection, self._host, port, reuse_address=True)
        return await loop.create_server(
            self._connection,
            self._host,
            port,
            reuse_address=True,
            ssl=self._tls,
            ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S,
        )

    @property
    def accepting(self) -> bool:
        return self._server is not None

    def pause(self) -> None:
        """Take no more connections: a client's connect is refused, so a balancer that cannot send a
        gRPC call twice (nginx) tries another replica. Connections open now, and those the kernel has
        queued but the loop not yet taken (their client may have sent a call), are served on."""
        if self._server is None:
            return
        self._take_queued(self._server)
        self._server.close()
        self._server = None

    async def resume(self) -> None:
        """Listen again, on the same port."""
        if self._server is None:
            self._server = await self._listen(self._port)

    def _take_queued(self, server: asyncio.Server) -> None:
        for task in take_queued((server,), self._connection, self._tls, HANDSHAKE_TIMEOUT_S):
            self._queued.add(task)
            task.add_done_callback(self._queued.discard)

    def _connection(self) -> asyncio.Protocol:
        if self._max_connections is not None and len(self._connections) >= self._max_connections:
            return _TurnedAway()
        conn: Connection

        def opener(stream: CallStream, headers: Headers) -> Call | None:
            return open_call(stream, headers, conn, self._methods, self._settings, self._calls)

        conn = self.make_connection(opener, self._connections.discard)
        return cast(asyncio.Protocol, conn)

    def make_connection(self, opener: Opener, on_closed: Callable[[Connection], None]) -> Connection:
        """The HTTP/2 connection an accepted socket runs on: tensorgate's own, counted among the
        server's connections once its handshake is done. ``opener`` opens a call per stream and
        ``on_closed`` is told when the connection ends. (A subclass may run the same calls over
        another HTTP/2 implementation: ``benchmarks/bench_grpc_transport.py`` does.)"""
        conn = _Native(opener, self.limits, on_closed)
        conn.counted, conn.cap = self._connections, self._max_connections
        return conn

    async def stop(self, grace_s: float, end_at_once: Callable[[Call], bool] = lambda call: False) -> None:
        """No new connections or calls (GOAWAY); calls in flight get ``grace_s`` to finish, then end
        UNAVAILABLE. Calls that ``end_at_once`` picks (streams that never end alone) end right away.

        GOAWAY goes twice (RFC 9113 §6.8): first with the largest stream id, then, a round trip
        later, with the last stream taken, so a call that crossed the first is still served."""
        self.pause()
        if self._queued:
            await asyncio.wait(self._queued, timeout=GOAWAY_WARNING_S)
        if self._connections:
            for conn in list(self._connections):
                conn.warn_goaway()
            await asyncio.sleep(GOAWAY_WARNING_S)
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
