"""A minimal HTTP/1.1 keep-alive client: ``asyncio.Protocol`` plus ``httptools`` response parsing.

Why not httpx or aiohttp: the load generator must not be the bottleneck, and on one core the
per-request cost of a general client (request objects, header dicts, cookie jars, URL parsing)
caps it below what a small model behind our server can answer. Here a request is pre-encoded
bytes written once with ``transport.write``; the response is parsed by the C parser in
``httptools`` and only the status, the body and a keep-alive flag are kept. Against aiohttp and
httpx on one core (``benchmarks/bench_client_vs_hey.py``, 32 connections against ``tensorgate
serve``), it took 41 µs of client CPU per request against aiohttp's 192 and httpx's 4,285.

It speaks only what the load generator needs: one request at a time per connection, chunked
or sized bodies, ``Connection: close`` honoured by reconnecting, TLS through the event loop's own SSL
transport.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import httptools

from tensorgate.bench.hang_up import hang_up, mark_lost

BodyCallback = Callable[[bytes], None]


class ConnectionLost(Exception):
    """The server closed the connection before the response was complete."""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes


def encode_request(
    method: str,
    host: str,
    path: str,
    body: bytes = b"",
    headers: tuple[tuple[str, str], ...] = (),
) -> bytes:
    """The full request bytes, built once per distinct request and reused for every send."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class _Protocol(asyncio.Protocol):
    """One connection's callbacks; ``HttpConnection`` owns it and drives one exchange at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._chunks: list[bytes] = []
        self._waiter: asyncio.Future[Response] | None = None
        self._on_body: BodyCallback | None = None
        self.keep_alive = True
        self.closed = False
        self.lost: asyncio.Future[None] | None = None

    # asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self.lost = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionLost(f"malformed HTTP response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        mark_lost(self.lost)
        self._fail(ConnectionLost("the server closed the connection"))

    # httptools callbacks
    def on_body(self, body: bytes) -> None:
        if self._on_body is not None:
            self._on_body(body)
        else:
            self._chunks.append(body)

    def on_message_complete(self) -> None:
        self.keep_alive = self._parser.should_keep_alive()
        waiter, self._waiter = self._waiter, None
        body = b"".join(self._chunks)
        self._chunks = []
        if waiter is not None and not waiter.done():
            waiter.set_result(Response(self._parser.get_status_code(), body))

    def _fail(self, exc: Exception) -> None:
        self.keep_alive = False
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def start(self, raw: bytes, on_body: BodyCallback | None) -> asyncio.Future[Response]:
        assert self.transport is not None
        self._waiter = asyncio.get_running_loop().create_future()
        self._on_body = on_body
        self._chunks = []
        self.transport.write(raw)
        return self._waiter


class HttpConnection:
    """One keep-alive connection to ``host:port``, reopened when the server closes it."""

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> None:
        self._host = host
        self._port = port
        self._tls = tls
        self._protocol: _Protocol | None = None

    async def request(self, raw: bytes, on_body: BodyCallback | None = None) -> Response:
        """Send pre-encoded request bytes and wait for the whole response.

        ``on_body`` receives body chunks as they arrive (for server-sent events) instead of
        collecting them. A failed exchange closes the connection so the next one starts clean.
        """
        protocol = self._protocol
        if protocol is None or protocol.closed or not protocol.keep_alive:
            protocol = await self._connect()
        try:
            return await protocol.start(raw, on_body)
        except BaseException:
            self.close()
            raise

    async def connect(self) -> None:
        """Open the connection now (before a run's clock starts) rather than on the first request."""
        await self._connect()

    async def _connect(self) -> _Protocol:
        self.close()
        loop = asyncio.get_running_loop()
        _, protocol = await loop.create_connection(
            _Protocol, self._host, self._port, ssl=self._tls, server_hostname=self._host if self._tls else None
        )
        self._protocol = protocol
        return protocol

    @property
    def protocol(self) -> _Protocol | None:
        return self._protocol

    def close(self) -> None:
        if self._protocol is not None and self._protocol.transport is not None:
            self._protocol.transport.close()
        self._protocol = None


class ConnectionPool:
    """Idle keep-alive connections, handed out one exchange at a time.

    A closed loop of ``c`` workers opens at most ``c`` connections; an open loop opens as many
    as it has requests outstanding, which is what a real population of clients would do.
    """

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> None:
        self.host = host
        self.port = port
        self._tls = tls
        self._idle: list[HttpConnection] = []
        self._all: list[HttpConnection] = []

    async def request(self, raw: bytes, on_body: BodyCallback | None = None) -> Response:
        if self._idle:
            connection = self._idle.pop()
        else:
            connection = HttpConnection(self.host, self.port, self._tls)
            self._all.append(connection)
        try:
            response = await connection.request(raw, on_body)
        except BaseException:
            self._all.remove(connection)
            raise
        self._idle.append(connection)
        return response

    async def aclose(self) -> None:
        protocols = [c.protocol for c in self._all if c.protocol is not None]
        self._all.clear()
        self._idle.clear()
        await hang_up(protocols)
