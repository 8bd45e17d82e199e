"""The HTTP listener's additions to uvicorn: a refusal closes its connection, and the connection timer."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import Any

import pytest
import virtual_time
from uvicorn.protocols.http.flow_control import FlowControl

from tensorgate.protocols.http.disconnect import CONNECTION_EXTENSION
from tensorgate.protocols.http.listener import HttpListener, _Cycle


class _Transport:
    """Records what a cycle writes, and whether it closed the connection."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def writelines(self, parts: Any) -> None:
        self.writes.append(b"".join(parts))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _cycle(method: str = "POST", keep_alive: bool = True) -> tuple[_Cycle, _Transport]:
    transport = _Transport()
    cycle = _Cycle(
        scope={"method": method, "type": "http", "path": "/"},
        transport=transport,
        flow=FlowControl(transport),
        logger=logging.getLogger("test"),
        access_logger=logging.getLogger("test"),
        access_log=False,
        default_headers=[],
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=keep_alive,
        on_response=lambda: None,
    )
    cycle.more_body = False  # the request's body is all in, as the protocol marks it when it is
    return cycle, transport


def _start(length: int | None) -> dict[str, Any]:
    headers = [(b"content-type", b"application/json")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return {"type": "http.response.start", "status": 200, "headers": headers}


async def test_an_answer_before_the_body_is_in_says_close_and_closes() -> None:
    cycle, transport = _cycle()
    cycle.more_body = True  # a refusal on the headers alone: the body is still coming
    await cycle.send({**_start(2), "status": 401})
    await cycle.send({"type": "http.response.body", "body": b"{}"})
    written = b"".join(transport.writes)
    assert written.startswith(b"HTTP/1.1 401 Unauthorized\r\n") and b"connection: close" in written
    assert transport.closed


async def test_an_answer_after_the_body_keeps_the_connection() -> None:
    cycle, transport = _cycle()
    await cycle.send(_start(2))
    await cycle.send({"type": "http.response.body", "body": b"{}"})
    written = b"".join(transport.writes)
    assert written.endswith(b"\r\n\r\n{}") and b"connection:" not in written
    assert cycle.response_complete and not transport.closed


async def _answer(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def _read_until(sock: socket.socket, marker: bytes) -> bytes:
    received = b""
    while marker not in received:
        chunk = sock.recv(65536)
        if not chunk:
            break
        received += chunk
    return received


async def _read_through(reader: asyncio.StreamReader, marker: bytes) -> bytes:
    received = b""
    while marker not in received:
        chunk = await reader.read(65536)
        if not chunk:
            break
        received += chunk
    return received


def test_late_headers_on_a_kept_alive_connection_get_408() -> None:
    """The timer is per connection: it must also catch the second request's headers. On virtual
    time (``virtual_time.py``): the waits are the listener's own timeouts, to the microsecond."""
    timeout = 0.3

    async def scenario() -> tuple[bytes, float, bytes]:
        loop = asyncio.get_running_loop()
        sock = socket.create_server(("127.0.0.1", 0))
        listener = HttpListener("http", _answer, sock, header_timeout_s=timeout)
        await listener.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            first = await _read_through(reader, b"ok")
            await asyncio.sleep(2 * timeout)  # idle between requests is not late headers
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")
            started = loop.time()
            second = await _read_through(reader, b"}")
            waited = loop.time() - started
            writer.close()
            await writer.wait_closed()
            return first, waited, second
        finally:
            await listener.stop()

    first, waited, second = virtual_time.run(scenario())
    assert first.startswith(b"HTTP/1.1 200 OK\r\n") and first.endswith(b"ok")
    assert second.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), second
    assert waited == pytest.approx(timeout)


def test_an_idle_kept_alive_connection_is_closed_but_not_one_whose_request_runs_long() -> None:
    keep_alive = 0.3

    async def scenario() -> tuple[bytes, float, bytes]:
        loop = asyncio.get_running_loop()
        release = asyncio.Event()

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["path"] == "/slow":
                await release.wait()  # runs past the keep-alive time, until the test releases it
            await _answer(scope, receive, send)

        sock = socket.create_server(("127.0.0.1", 0))
        listener = HttpListener("http", app, sock, keep_alive_s=keep_alive, header_timeout_s=keep_alive)
        await listener.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
            writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            await asyncio.sleep(3 * keep_alive)  # the request is running all this time
            release.set()
            slow = await _read_through(reader, b"ok")
            started = loop.time()
            closed = await reader.read(1024)  # nothing more is sent: the server closes when idle
            idle = loop.time() - started
            writer.close()
            await writer.wait_closed()
            return slow, idle, closed
        finally:
            await listener.stop()

    slow, idle, closed = virtual_time.run(scenario())
    assert slow.startswith(b"HTTP/1.1 200 OK\r\n") and slow.endswith(b"ok")
    assert closed == b""
    assert idle == pytest.approx(keep_alive)


async def test_a_lost_connection_cancels_the_request_running_on_it_at_once() -> None:
    """The listener tells the app through the scope's connection watch: no task, no polling delay."""
    armed = asyncio.Event()
    outcome: asyncio.Future[tuple[bool, bool]] = asyncio.get_running_loop().create_future()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        watch = scope["extensions"][CONNECTION_EXTENSION]
        task = asyncio.current_task()
        assert task is not None
        watch.arm(task)
        armed.set()
        try:
            await asyncio.sleep(60)  # a request waiting in a queue
        except asyncio.CancelledError:
            outcome.set_result((True, watch.disconnected))
            raise
        finally:
            watch.close()
        outcome.set_result((False, watch.disconnected))

    sock = socket.create_server(("127.0.0.1", 0))
    listener = HttpListener("http", app, sock)
    await listener.start()
    try:
        conn = socket.create_connection(("127.0.0.1", listener.port), timeout=10)
        conn.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        await asyncio.wait_for(armed.wait(), 10)
        conn.close()
        cancelled, disconnected = await asyncio.wait_for(outcome, 10)  # well before the 60 s sleep ends
        assert cancelled and disconnected
    finally:
        await listener.stop()


def _read_to_close(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    received = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk


async def _read_body_then_answer(scope: dict[str, Any], receive: Any, send: Any) -> None:
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        more = message.get("more_body", False)
    await _answer(scope, receive, send)


async def test_a_body_not_all_in_within_the_body_timeout_gets_408_and_a_close() -> None:
    """S-09: a client that declares a length and trickles the body is cut off, like one slow with
    its headers (the body timeout is shorter than the header timeout here, so its own limit holds)."""
    timeout = 0.3
    sock = socket.create_server(("127.0.0.1", 0))
    listener = HttpListener("http", _read_body_then_answer, sock, header_timeout_s=10.0, body_timeout_s=timeout)
    await listener.start()
    try:

        def client() -> tuple[bytes, float]:
            with socket.create_connection(("127.0.0.1", listener.port), timeout=10) as conn:
                conn.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
                started = time.monotonic()
                answer = _read_to_close(conn)
                return answer, time.monotonic() - started

        answer, waited = await asyncio.to_thread(client)
    finally:
        await listener.stop()
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer
    assert b"connection: close" in answer and b"request body not received within 0.3 s" in answer
    assert timeout * 0.9 <= waited < timeout * 3 + 1.0


async def test_a_pipelined_body_is_timed_from_its_turn() -> None:
    """A request pipelined behind a slow one has its body read only when its turn comes (reading
    pauses meanwhile): the wait before its turn does not count against its body timeout."""
    timeout = 0.3
    release = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/slow":
            await release.wait()
        await _read_body_then_answer(scope, receive, send)

    sock = socket.create_server(("127.0.0.1", 0))
    listener = HttpListener("http", app, sock, header_timeout_s=timeout, body_timeout_s=timeout)
    await listener.start()
    loop = asyncio.get_running_loop()
    try:

        def client() -> tuple[bytes, bytes]:
            with socket.create_connection(("127.0.0.1", listener.port), timeout=10) as conn:
                conn.sendall(
                    b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"
                    b"POST /next HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab"
                )
                time.sleep(3 * timeout)  # the first request runs all this time
                loop.call_soon_threadsafe(release.set)
                first = _read_until(conn, b"ok")
                conn.sendall(b"cd")  # the pipelined body's turn has come
                return first, _read_until(conn, b"ok")

        first, second = await asyncio.to_thread(client)
    finally:
        await listener.stop()
    assert first.startswith(b"HTTP/1.1 200 OK\r\n") and first.endswith(b"ok")
    assert second.startswith(b"HTTP/1.1 200 OK\r\n") and second.endswith(b"ok"), second


async def test_an_answer_before_the_body_is_in_closes_the_connection() -> None:
    """A refusal given on the headers alone (401, 413, ...) closes the connection after it, so the
    server never reads and discards the rest of a body it refused."""

    async def refuse(scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = [(b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": b"{}"})

    sock = socket.create_server(("127.0.0.1", 0))
    listener = HttpListener("http", refuse, sock)
    await listener.start()
    try:

        def client() -> bytes:
            with socket.create_connection(("127.0.0.1", listener.port), timeout=10) as conn:
                conn.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 67108864\r\n\r\n" + b"x" * 1024)
                return _read_to_close(conn)

        answer = await asyncio.to_thread(client)
    finally:
        await listener.stop()
    assert answer.startswith(b"HTTP/1.1 401 Unauthorized\r\n") and answer.endswith(b"\r\n\r\n{}")
    assert b"connection: close" in answer
