"""An HTTP listener on a bound socket: uvicorn (httptools, uvloop) without its signal handling.

The :class:`~tensorgate.server.Server` owns signals and the shutdown order, so uvicorn must not
install handlers of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import urllib.parse
from collections.abc import Iterator
from typing import Any

import httptools
import orjson
import uvicorn
from uvicorn.protocols.http.httptools_impl import (
    HttpToolsProtocol,
    RequestResponseCycle,
)

from tensorgate.protocols.accept_queue import take_queued
from tensorgate.protocols.http.body import MAX_CHUNKS
from tensorgate.protocols.http.disconnect import CONNECTION_EXTENSION, ConnectionWatch
from tensorgate.protocols.http.security_headers import NOSNIFF_LINE

log = logging.getLogger(__name__)

# Request-line and header bounds: a URI past 16 KiB is 414; more than 100
# header fields or 64 KiB of them is 431. Until the headers are complete at most 1 MiB is buffered.
MAX_URL_BYTES = 16 * 1024
MAX_HEADERS = 100
MAX_HEADER_BYTES = 64 * 1024
_MAX_HEAD_BUFFER = 1 << 20

# uvicorn stops reading a connection once 64 KiB of body wait for the app, and reads on after the
# app takes them: ~45 round trips through the event loop for an image-sized JSON body, each one
# waiting its turn for the GIL while other requests decode. The app reads every body whole anyway
# (up to max_body_bytes, refused past it), so buffering more per connection costs no memory it
# would not spend, and the bound still holds against a client that sends faster than the app reads.
BODY_HIGH_WATER_BYTES = 8 << 20
# A chunked body (no Content-Length) is handed to the app at least this often, so its size limit
# holds within this much, whatever the high-water mark.
CHUNKED_WAKE_BYTES = 1 << 20

_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 414: b"URI Too Long", 431: b"Request Header Fields Too Large"}

# At shutdown, a connection that has not begun a request may be one accepted as the listener
# closed, whose client is writing its request: it gets this long to begin it (the client wrote it
# right after connecting, so its bytes are in flight or already in the socket's buffer) before it
# is closed quietly. uvicorn closes it at once, with the request unread: the client sees a reset.
SHUTDOWN_FIRST_REQUEST_S = 1.0


class _BodyParts:
    """The body bytes that arrived since the app last read, as the chunks they came in.

    uvicorn (0.55, the pinned minor) appends each chunk to a bytearray and copies that to bytes on
    every read; a chunk over an eighth of the buffer makes CPython reallocate it to the exact new
    size, so a 3 MB JSON body read 256 KiB at a time is reallocated a dozen times. uvicorn's read
    calls ``bytes()`` on what it holds: here that is the one chunk itself when there is one (no copy
    at all), or one join. ``benchmarks/bench_listener.py`` measures it against uvicorn's bytearray for
    binary tensors and JSON bodies, side by side.
    """

    __slots__ = ("_parts", "_size")

    def __init__(self, first: bytes | bytearray = b"") -> None:
        self._parts: list[bytes] = [bytes(first)] if first else []
        self._size = len(first)

    def append(self, chunk: bytes) -> None:
        self._parts.append(chunk)
        self._size += len(chunk)

    def __len__(self) -> int:
        return self._size

    def __bytes__(self) -> bytes:
        parts = self._parts
        return parts[0] if len(parts) == 1 else b"".join(parts)


class _Cycle(RequestResponseCycle):  # type: ignore[misc]
    """uvicorn's request cycle, except that an answer given before the request's body is all in (a
    refusal: 401, 403, 429, 413) closes the connection after it, rather than reading and
    discarding the rest: no caller makes the server take a body it refused. uvicorn's send then
    writes ``connection: close`` and closes once the answer is out."""

    async def send(self, message: Any) -> None:
        if message["type"] == "http.response.start" and not self.response_started and self.more_body:
            self.keep_alive = False
        await super().send(message)


class _Refused(Exception):
    """Raised from a parser callback; httptools turns it into HttpParserError, so uvicorn answers 400."""


class _Protocol(HttpToolsProtocol):  # type: ignore[misc]
    """uvicorn's httptools protocol with the limits only the parser can see, and errors in JSON.

    - HTTP chunks are counted per request: uvicorn joins chunks that arrive together into one ASGI
      message, so only the parser knows how many a body had. Past ``MAX_CHUNKS`` (Triton's
      CVE-2025-23310 regression sends one more) the request is refused with 400.
    - The URI and the header fields are bounded (414, 431) and so are the bytes buffered while
      the headers are incomplete.
    - Headers must be complete within ``header_timeout_s`` of a request's first byte (or of the
      connection), so slow clients cannot hold connections (slowloris); uvicorn has no such timeout.
      One timer per connection checks this and the keep-alive time, instead of a header timer
      made and cancelled per request and uvicorn's keep-alive timer made and cancelled per
      response.
    - A body must be all in within ``body_timeout_s`` of its request's turn (408, and closed): a
      client that declares a length and trickles the bytes cannot hold a connection either. The
      same timer checks it.
    - An answer given before the body is all in (a refusal) closes the connection after it
      (:class:`_Cycle`).

    Every refusal answers ``{"error": ...}`` and closes the connection.
    """

    header_timeout_s = 10.0
    body_timeout_s = 60.0
    max_connections: int | None = None  # past this, a new connection is closed as it is accepted
    headers: list[tuple[bytes, bytes]]
    cycle: Any
    _chunks = 0
    _header_bytes = 0
    _head_buffered = 0
    _in_head = True
    _in_request = False  # a request's first byte has arrived and its headers are not complete
    _head_started = 0.0  # loop time of the first byte of the request whose headers are awaited
    _requests = 0  # requests begun on this connection
    _idle_since = 0.0  # loop time the last response completed
    _body_cycle: Any = None  # the request whose app task runs (its body is timed)
    _body_started = 0.0  # loop time that request's turn came
    _refusal: tuple[int, str] | None = None
    _timer: asyncio.TimerHandle | None = None
    _timer_at = 0.0
    _turned_away = False
    _last_request = False  # shutdown() left the connection open for one request: close after it

    def connection_made(self, transport: asyncio.Transport) -> None:
        if self.max_connections is not None and len(self.connections) >= self.max_connections:
            self._turned_away = True  # never counted, never parsed: closed before a byte is read
            transport.abort()
            return
        super().connection_made(transport)
        self._watch = ConnectionWatch()
        self._extensions = {CONNECTION_EXTENSION: self._watch}  # one dict per connection, in every scope
        self._head_started = self._idle_since = self.loop.time()
        self._arm(self._head_started + self.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._turned_away:
            return
        self._cancel_timer()
        super().connection_lost(exc)
        self._watch.lost()  # the request running on this connection leaves the queue now

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head_buffered += len(data)
            if self._head_buffered > _MAX_HEAD_BUFFER:
                self._refuse_now(431, f"request headers exceed {MAX_HEADER_BYTES} bytes")
                return
        super().data_received(data)

    # The parser callbacks below do what uvicorn's do (their lines are uvicorn 0.55's, pinned by
    # tests/unit/protocols/test_uvicorn_upstream.py) with the checks above in the same call: one
    # Python call per callback instead of two, which is a few microseconds a request at thousands
    # of requests per second.

    def on_message_begin(self) -> None:
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        self.scope = {
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": "1.1",
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "root_path": self.root_path,
            "headers": self.headers,
            "state": self.app_state.copy(),
            "extensions": self._extensions,
        }
        self._chunks = 0
        self._header_bytes = 0
        self._in_head = True
        self._in_request = True
        self._requests += 1
        self._head_started = self.loop.time()
        if self._timer_at > self._head_started + self.header_timeout_s:  # armed for the idle time
            self._cancel_timer()
            self._arm(self._head_started + self.header_timeout_s)

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > MAX_URL_BYTES:
            self._refusal = (414, f"request URI exceeds {MAX_URL_BYTES} bytes")
            raise _Refused

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        headers = self.headers
        headers.append((name, value))
        self._header_bytes += len(name) + len(value)
        if len(headers) > MAX_HEADERS or self._header_bytes > MAX_HEADER_BYTES:
            self._refusal = (431, f"request headers exceed {MAX_HEADERS} fields or {MAX_HEADER_BYTES} bytes")
            raise _Refused

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._in_request = False
        self._head_buffered = 0
        parser = self.parser
        if self.limit_concurrency is not None or (parser.should_upgrade() and self._should_upgrade()):
            super().on_headers_complete()
            return
        scope = self.scope
        http_version = parser.get_http_version()
        scope["method"] = parser.get_method().decode("ascii")
        if http_version != "1.1":
            scope["http_version"] = http_version
        parsed_url = httptools.parse_url(self.url)
        raw_path = parsed_url.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        scope["path"] = self.root_path + path
        scope["raw_path"] = self.root_path.encode("ascii") + raw_path
        scope["query_string"] = parsed_url.query or b""
        existing_cycle = self.cycle
        self.cycle = cycle = _Cycle(
            scope=scope,
            transport=self.transport,
            flow=self.flow,
            logger=self.logger,
            access_logger=self.access_logger,
            access_log=self.access_log,
            default_headers=self.server_state.default_headers,
            message_event=asyncio.Event(),
            expect_100_continue=self.expect_100_continue,
            keep_alive=http_version != "1.0" and parser.should_keep_alive(),
            on_response=self.on_response_complete,
        )
        if existing_cycle is None or existing_cycle.response_complete:
            self._start_asgi_task(cycle, self.app)
        else:  # pipelined: its turn comes when the response before it completes
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, self.app))

    def on_chunk_header(self) -> None:
        self._chunks += 1
        if self._chunks > MAX_CHUNKS and not (self.cycle is not None and self.cycle.response_started):
            self._refusal = (400, f"request body arrived in more than {MAX_CHUNKS} chunks")
            raise _Refused

    def on_body(self, body: bytes) -> None:
        if (self.parser.should_upgrade() and self._should_upgrade()) or self.cycle.response_complete:
            return
        parts = self.cycle.body
        if not isinstance(parts, _BodyParts):  # uvicorn sets a fresh bytearray after every read
            parts = self.cycle.body = _BodyParts(parts)
        parts.append(body)
        # A body with a Content-Length (which the app has checked against its limit before reading)
        # wakes the app once, when complete (uvicorn's on_message_complete), not per chunk: a 600 KB
        # tensor arrives in about ten reads, and each wake-up was a task step, a receive message and
        # a join of what had come so far. A chunked body, whose size nobody knows ahead, wakes it every
        # CHUNKED_WAKE_BYTES so its limit is enforced as it arrives; past the high-water mark reading
        # also pauses until the app takes what is buffered.
        size = len(parts)
        if size > BODY_HIGH_WATER_BYTES:
            self.flow.pause_reading()
            self.cycle.message_event.set()
        elif self._chunks and size >= CHUNKED_WAKE_BYTES:
            self.cycle.message_event.set()

    def send_400_response(self, msg: str) -> None:
        status, message = self._refusal or (400, "invalid HTTP request")
        self._refuse_now(status, message)

    def _refuse_now(self, status: int, message: str) -> None:
        self._cancel_timer()
        if self.transport.is_closing():
            return
        body = orjson.dumps({"error": message})
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n%s\r\n"
            % (status, _REASONS[status], len(body), NOSNIFF_LINE)
            + body
        )
        self.transport.close()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        # The body is timed from here: a pipelined request's body is not read before its turn.
        self._body_cycle = cycle
        self._body_started = now = self.loop.time()
        if self._timer_at > now + self.body_timeout_s:  # armed for a later limit
            self._cancel_timer()
            self._arm(now + self.body_timeout_s)
        if self.config.reset_contextvars:
            super()._start_asgi_task(cycle, app)
            return
        task = self.loop.create_task(cycle.run_asgi(app))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def _arm(self, when: float) -> None:
        self._timer = self.loop.call_at(when, self._check_time)
        self._timer_at = when

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def on_response_complete(self) -> None:
        """uvicorn's, less the keep-alive timer it makes per response (and cancels when the next
        request's bytes arrive): the connection's one timer checks the idle time instead."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        if self._last_request:
            self.transport.close()
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self._idle_since = self.loop.time()

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown of one connection (an idle one is closed now; one whose request is
        being answered closes after the answer), except where a request has not reached the app yet:

        - its headers are arriving: that request is served (under the header timeout), and the
          connection closes after its answer;
        - not a byte of a first request yet: it has ``SHUTDOWN_FIRST_REQUEST_S`` to begin one,
          served the same way.

        Either way uvicorn would close it with the client's request on the wire."""
        idle = self.cycle is None or self.cycle.response_complete
        if idle and not self.transport.is_closing():
            if self._in_request:
                self._last_request = True
                return
            if self._requests == 0:
                self._last_request = True
                self._cancel_timer()
                # _check_time closes a connection that never began a request at this due time.
                self._head_started = self.loop.time() + SHUTDOWN_FIRST_REQUEST_S - self.header_timeout_s
                self._arm(self._head_started + self.header_timeout_s)
                return
        super().shutdown()

    def _check_time(self) -> None:
        """The connection's one timer: late headers or a late body get 408; a connection that never
        sent a request, or sat idle past the keep-alive time, is closed; otherwise it re-arms for the
        next limit."""
        self._timer = None
        if self.transport.is_closing():
            return
        now = self.loop.time()
        busy = self.cycle is not None and not self.cycle.response_complete
        if self._in_request:
            due = self._head_started + self.header_timeout_s
            if now >= due and busy:
                due = now + self.header_timeout_s  # pipelined behind a response: its turn has not come
            elif now >= due:
                self._refuse_now(408, f"request headers not received within {self.header_timeout_s:g} s")
                return
        elif self._requests == 0:
            due = self._head_started + self.header_timeout_s
            if now >= due:
                # Not a byte of a request yet: close quietly. An unsolicited 408 on an idle connection
                # could be read by the client as the answer to the request it is about to send.
                self.transport.close()
                return
        elif busy:
            cycle = self._body_cycle
            if cycle is not None and cycle.more_body and not cycle.response_started:  # its body is due
                due = self._body_started + self.body_timeout_s
                if now >= due:
                    self._refuse_now(408, f"request body not received within {self.body_timeout_s:g} s")
                    return
            else:
                due = now + self.header_timeout_s  # the request is being answered: nothing to time
        else:
            due = self._idle_since + self.timeout_keep_alive
            if now >= due:
                self.transport.close()
                return
        self._arm(due)


class _Uvicorn(uvicorn.Server):  # type: ignore[misc]
    handshake_timeout_s = 10.0

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's shutdown, after taking the connections the kernel has completed and queued for
        accept: closing the listening socket would reset them, and their clients have sent, or are
        sending, a request (the gRPC server does the same). They are served like any connection
        uvicorn's shutdown finds (see :meth:`_Protocol.shutdown`)."""
        taken = self._take_queued()
        for server in self.servers:
            server.close()  # accepts no more; uvicorn's own close below finds it closed
        if taken:
            await asyncio.wait(taken, timeout=self.handshake_timeout_s)  # each connection is made (and counted)
        await super().shutdown(sockets)

    def _take_queued(self) -> list[asyncio.Task[object]]:
        config = self.config
        loop = asyncio.get_running_loop()

        def create_protocol() -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[no-any-return]
                config=config, server_state=self.server_state, app_state=self.lifespan.state, _loop=loop
            )

        return take_queued(self.servers, create_protocol, config.ssl, self.handshake_timeout_s)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's start on given sockets (lifespan off), but a TLS handshake gets the header timeout
        instead of asyncio's 60 s: the protocol, and with it every timer of ours, starts only once the
        handshake is done, so a client that connects and never finishes one is cut off here."""
        config = self.config
        if sockets is None or config.ssl is None:
            await super().startup(sockets)
            return

        def create_protocol(_loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[no-any-return]
                config=config, server_state=self.server_state, app_state=self.lifespan.state, _loop=_loop
            )

        loop = asyncio.get_running_loop()
        self.servers = [
            await loop.create_server(
                create_protocol,
                sock=sock,
                ssl=config.ssl,
                backlog=config.backlog,
                ssl_handshake_timeout=self.handshake_timeout_s,
            )
            for sock in sockets
        ]
        self.started = True


class HttpListener:
    def __init__(
        self,
        name: str,
        app: Any,
        sock: socket.socket,
        *,
        keep_alive_s: float = 75.0,
        exit_timeout_s: float = 30.0,
        header_timeout_s: float = 10.0,
        body_timeout_s: float = 60.0,
        max_connections: int | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.name = name
        self._socket = sock
        limits = {
            "header_timeout_s": header_timeout_s,
            "body_timeout_s": body_timeout_s,
            "max_connections": max_connections,
        }
        protocol = type("HttpProtocol", (_Protocol,), limits)
        config = uvicorn.Config(
            app,
            http=protocol,
            loop="none",
            lifespan="off",
            access_log=False,
            log_config=None,
            server_header=False,
            proxy_headers=False,  # X-Forwarded-* is not trusted unless a proxy setup says so
            date_header=False,
            # Keep idle connections longer than proxies do (nginx 60 s) so the proxy never reuses a
            # connection we are closing.
            timeout_keep_alive=keep_alive_s,
            # uvicorn waits with asyncio.wait_for, so fractions hold (int() made 0.5 s "no limit").
            timeout_graceful_shutdown=exit_timeout_s,
            backlog=2048,
            # The context the server's CertificateFiles reloads in place when certificates rotate.
            ssl_context_factory=None if tls is None else (lambda config, default: tls),
        )
        self._server = _Uvicorn(config)
        self._server.handshake_timeout_s = header_timeout_s
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
