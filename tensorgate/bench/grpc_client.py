"""A minimal gRPC client for unary calls over HTTP/2: one call at a time per connection.

Why not grpc.aio: the load generator shares the machine with the server it measures, and
grpc.aio's client pays grpcio's thread hand-offs (its completion queue's poller thread wakes the
event loop through a socketpair) on every call. ``benchmarks/bench_protocols.py`` measures this
client's CPU per call beside the HTTP binary client's. Like :mod:`tensorgate.bench.http_client`, this one
writes pre-encoded bytes from the event loop and reads only what the load generator needs: the
call's ``grpc-status`` and ``grpc-message``. The answer's messages are counted, not parsed.

It keeps to the server's flow-control windows and frame size, answers SETTINGS and PING, and
ends a call the server resets or refuses (GOAWAY). TLS and compression are out of scope.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import cast

from tensorgate.bench.hang_up import mark_lost
from tensorgate.bench.http_client import ConnectionLost
from tensorgate.bench.targets.base import Endpoint
from tensorgate.protocols.grpc.http2 import frames as f
from tensorgate.protocols.grpc.http2.header_blocks import HeaderBlocks

# What this client lets the server send before it reads: answers are small, but allow large ones.
RECEIVE_WINDOW = 16 * 1024 * 1024
# An unanswered call's status: the server ended the stream without a grpc-status.
NO_STATUS = -1


@dataclass(frozen=True, slots=True)
class Status:
    code: int  # grpc-status: 0 is OK
    message: str = ""


def framed(message: bytes) -> bytes:
    """A message as gRPC sends it: uncompressed, length-prefixed. Build once per request, reuse."""
    return b"\0" + len(message).to_bytes(4, "big") + message


class _Call:
    __slots__ = ("done", "fields", "id", "send_window")

    def __init__(self, stream_id: int, send_window: int, done: asyncio.Future[Status]) -> None:
        self.id = stream_id
        self.send_window = send_window
        self.done = done
        self.fields: dict[str, str] = {}


class GrpcConnection(asyncio.Protocol):
    """One HTTP/2 connection; :meth:`call` runs one unary call at a time on it."""

    def __init__(self, authority: str, scheme: str = "http", metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self._authority = authority
        self._scheme = scheme
        self._metadata = metadata
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._hpack = HeaderBlocks()
        self._next_id = 1
        self._call: _Call | None = None
        self._header_block: list[bytes] = []
        self._block_ends_stream = False
        self._send_window = f.DEFAULT_WINDOW
        self._peer_initial_window = f.DEFAULT_WINDOW
        self._peer_max_frame = f.DEFAULT_FRAME_SIZE
        self._unacked = 0
        self._window_opened: asyncio.Future[None] | None = None
        self.usable = True
        self.lost: asyncio.Future[None] | None = None

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.lost = asyncio.get_running_loop().create_future()
        settings = {f.ENABLE_PUSH: 0, f.INITIAL_WINDOW_SIZE: RECEIVE_WINDOW, f.MAX_FRAME_SIZE: f.MAX_FRAME_SIZE_LIMIT}
        self.transport.write(f.PREFACE + f.settings(settings) + f.window_update(0, RECEIVE_WINDOW - f.DEFAULT_WINDOW))

    def connection_lost(self, exc: Exception | None) -> None:
        mark_lost(self.lost)
        self._fail(ConnectionLost("the server closed the connection"))

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        buffer = self._buffer
        pos, end = 0, len(buffer)
        try:
            while end - pos >= f.HEADER_BYTES:
                length, kind, flags, stream_id = f.parse_header(buffer, pos)
                if end - pos - f.HEADER_BYTES < length:
                    break
                start = pos + f.HEADER_BYTES
                pos = start + length
                self._frame(kind, flags, stream_id, bytes(buffer[start:pos]))
        except ConnectionLost as exc:
            self._fail(exc)
        del buffer[:pos]

    # -- frames -------------------------------------------------------------------------------

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        call = self._call if self._call is not None and self._call.id == stream_id else None
        if kind == f.DATA:
            self._received(len(payload), call is not None and not flags & f.END_STREAM)
            if call is not None and flags & f.END_STREAM:
                self._end(call)
        elif kind in (f.HEADERS, f.CONTINUATION):
            if kind == f.HEADERS:
                if flags & f.PADDED:
                    payload = payload[1 : len(payload) - payload[0]]
                if flags & f.PRIORITY_FLAG:
                    payload = payload[5:]
                self._header_block = [payload]
                self._block_ends_stream = bool(flags & f.END_STREAM)
            else:
                self._header_block.append(payload)
            if flags & f.END_HEADERS:
                # Decoded whatever its stream: HPACK's table is the connection's.
                fields = self._hpack.decode(b"".join(self._header_block))
                if call is not None:
                    call.fields.update(fields)
                    if self._block_ends_stream:
                        self._end(call)
        elif kind == f.SETTINGS and not flags & f.ACK:
            for key, value in f.parse_settings(payload):
                if key == f.INITIAL_WINDOW_SIZE:
                    if self._call is not None:
                        self._call.send_window += value - self._peer_initial_window
                    self._peer_initial_window = value
                elif key == f.MAX_FRAME_SIZE:
                    self._peer_max_frame = value
                elif key == f.HEADER_TABLE_SIZE:
                    self._hpack.set_encoder_table_size(min(value, 4096))
            self._write(f.frame(f.SETTINGS, f.ACK, 0))
            self._open_window()
        elif kind == f.WINDOW_UPDATE:
            increment = f.u32(payload) & 0x7FFF_FFFF
            if stream_id == 0:
                self._send_window += increment
            elif call is not None:
                call.send_window += increment
            self._open_window()
        elif kind == f.PING and not flags & f.ACK:
            self._write(f.frame(f.PING, f.ACK, 0, payload))
        elif kind == f.RST_STREAM and call is not None:
            self._finish(call, Status(NO_STATUS, f"stream reset by the server ({f.u32(payload)})"))
        elif kind == f.GOAWAY:
            self.usable = False
            last = f.u32(payload) & 0x7FFF_FFFF
            if self._call is not None and self._call.id > last:
                self._finish(self._call, Status(14, "the server refused the call (GOAWAY)"))  # UNAVAILABLE
            if f.u32(payload[4:]) != f.ErrorCode.NO_ERROR:
                raise ConnectionLost(f"connection error from the server: {payload[8:].decode(errors='replace')}")

    def _received(self, size: int, stream_open: bool) -> None:
        """Reopen both windows once half is used (the stream's only while it is still open)."""
        self._unacked += size
        if self._unacked >= RECEIVE_WINDOW // 2:
            updates = f.window_update(0, self._unacked)
            if stream_open and self._call is not None:
                updates += f.window_update(self._call.id, self._unacked)
            self._write(updates)
            self._unacked = 0

    def _end(self, call: _Call) -> None:
        status = call.fields.get("grpc-status")
        if status is None or not status.isdigit():
            self._finish(call, Status(NO_STATUS, "the server ended the call without a grpc-status"))
        else:
            self._finish(call, Status(int(status), call.fields.get("grpc-message", "")))

    def _finish(self, call: _Call, status: Status) -> None:
        if self._call is call:
            self._call = None
        if not call.done.done():
            call.done.set_result(status)

    def _fail(self, exc: Exception) -> None:
        self.usable = False
        if self._call is not None and not self._call.done.done():
            self._call.done.set_exception(exc)
        self._call = None
        self._open_window()
        if self.transport is not None:
            self.transport.close()

    def _open_window(self) -> None:
        if self._window_opened is not None and not self._window_opened.done():
            self._window_opened.set_result(None)

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    # -- a call -------------------------------------------------------------------------------

    async def call(self, path: str, message: bytes) -> Status:
        """Send ``message`` (already :func:`framed`) to ``path``; the call's status.

        Cancelled (the runner's timeout), the call's stream is reset and the connection goes on.
        """
        if not self.usable or self._call is not None:
            raise ConnectionLost("the connection is closed or busy")
        loop = asyncio.get_running_loop()
        call = self._call = _Call(self._next_id, self._peer_initial_window, loop.create_future())
        self._next_id += 2
        headers = f.frame(f.HEADERS, f.END_HEADERS, call.id, self._header_block_for(path))
        try:
            await self._send(call, headers, memoryview(message))
            return await call.done
        except asyncio.CancelledError:
            if self._call is call:
                self._call = None
                self._write(f.rst_stream(call.id, f.ErrorCode.CANCEL))
            raise

    def _header_block_for(self, path: str) -> bytes:
        return self._hpack.encode(
            [
                (":method", "POST"),
                (":scheme", self._scheme),
                (":path", path),
                (":authority", self._authority),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                *self._metadata,
            ]
        )

    async def _send(self, call: _Call, headers: bytes, data: memoryview) -> None:
        """HEADERS, then DATA as the server's windows and frame size allow; the first frames in one
        write."""
        loop = asyncio.get_running_loop()
        pending: list[bytes | memoryview] = [headers]
        while data and not call.done.done():
            size = min(len(data), call.send_window, self._send_window, self._peer_max_frame)
            if size <= 0:
                self._flush(pending)
                self._window_opened = loop.create_future()
                await self._window_opened
                continue
            last = size == len(data)
            pending += (f.header(f.DATA, f.END_STREAM if last else 0, call.id, size), data[:size])
            call.send_window -= size
            self._send_window -= size
            data = data[size:]
        self._flush(pending)

    def _flush(self, pending: list[bytes | memoryview]) -> None:
        if pending and self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(pending)
        pending.clear()


async def connect(endpoint: Endpoint) -> GrpcConnection:
    """A connection to ``endpoint``: over TLS (ALPN h2) where it says so, its credential in every call."""
    tls = endpoint.ssl_context("h2")
    metadata = tuple((name.lower(), value) for name, value in endpoint.request_headers)
    scheme = "https" if tls else "http"
    _, protocol = await asyncio.get_running_loop().create_connection(
        lambda: GrpcConnection(endpoint.authority, scheme, metadata),
        endpoint.host,
        endpoint.port,
        ssl=tls,
        server_hostname=endpoint.host if tls else None,
    )
    return protocol
