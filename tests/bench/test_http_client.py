"""The raw HTTP/1.1 client and the streaming target against tiny in-process servers.

The servers are scripted byte streams over loopback (port 0), so each test controls exactly
what the client sees: sized and chunked bodies, ``Connection: close``, a dropped connection,
and server-sent events in chunks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from tensorgate.bench.http_client import ConnectionLost, ConnectionPool, encode_request
from tensorgate.bench.runner import LoadSpec, run_load
from tensorgate.bench.targets.base import Endpoint
from tensorgate.bench.targets.openai import OpenAiTarget, completion_body
from tensorgate.clock import MonotonicClock

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


async def _with_server(handler: Handler, body: Callable[[int], Awaitable[None]]) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handler(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client hung up: every test ends that way
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        await body(port)
    finally:
        server.close()
        await server.wait_closed()


def test_keep_alive_sized_and_chunked_bodies() -> None:
    connections = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        request = await _read_request(reader)
        assert request.startswith(b"POST /x HTTP/1.1\r\n") and request.endswith(b"hello")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await _read_request(reader)
        writer.write(b"HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
        await writer.drain()
        await reader.read()  # until the client closes

    async def body(port: int) -> None:
        pool = ConnectionPool("127.0.0.1", port)
        raw = encode_request("POST", f"127.0.0.1:{port}", "/x", b"hello")
        first = await pool.request(raw)
        second = await pool.request(raw)
        await pool.aclose()
        assert (first.status, first.body) == (200, b"ok")
        assert (second.status, second.body) == (503, b"abcde")

    asyncio.run(_with_server(handler, body))
    assert len(connections) == 1  # both exchanges used one keep-alive connection


def test_connection_close_reconnects_and_a_dropped_connection_raises() -> None:
    served = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        served.append(1)
        if len(served) == 1:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        elif len(served) == 2:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\npart")  # then hang up mid-body
        await writer.drain()

    async def body(port: int) -> None:
        pool = ConnectionPool("127.0.0.1", port)
        raw = encode_request("GET", f"127.0.0.1:{port}", "/")
        assert (await pool.request(raw)).status == 200
        with pytest.raises(ConnectionLost):
            await pool.request(raw)
        await pool.aclose()

    asyncio.run(_with_server(handler, body))
    assert len(served) == 2


def test_openai_stream_timestamps_each_token() -> None:
    events = [b'data: {"choices":[{"text":"a"}]}\n\n', b'data: {"choices":[{"text":"b"}]}\n\n', b"data: [DONE]\n\n"]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            request = await _read_request(reader)
            assert b'"stream":true' in request
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            for event in events:
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    async def body(port: int) -> None:
        clock = MonotonicClock()
        endpoint = Endpoint("127.0.0.1", port, "")
        target = OpenAiTarget(endpoint, [completion_body("m", "p", 2)], False, clock)
        result = await run_load(target, LoadSpec(concurrency=2, requests=6), clock)
        await target.aclose()
        assert result.successes == 6 and result.tokens == 12
        assert len(result.ttft) == 6 and len(result.itl) == 6
        assert all(0 <= t <= latency for t, latency in zip(result.ttft, result.latencies, strict=True))

    asyncio.run(_with_server(handler, body))
