"""One HTTP/2 connection, server side, read and written on the event loop.

Why not grpcio's server or the h2 library, which this replaces: grpcio reads sockets on threads
of its own and hands each completion to the event loop through a socketpair, about ten thread
wakeups per request, and h2 keeps the protocol's state in Python objects per frame and event.
Read here, a request costs the loop what an HTTP request does: behind the same servicers
(``benchmarks/bench_grpc_transport.py``, ``server.grpc_transport: h2 | grpcio``) the MLP at 64
clients ran 2.9x h2's and 3.9x grpcio's requests/s (2.8-3.6x and 3.7-4.7x over the rounds), and
the ResNet-shaped model at 10 clients took 1.11x h2's and 1.08x grpcio's share of the ceiling
(1.07-1.17x, 1.01-1.11x).

The frames are few and large (the server allows the largest frame size, so a client sends a tensor
in one DATA frame), and a DATA payload goes to its stream as it arrives, never reassembled here.

Each request stream is a :class:`~tensorgate.protocols.grpc.http2.stream.Stream`, which this
connection paces by the client's flow-control windows.

Limits a client cannot talk its way past: concurrent streams (``MAX_CONCURRENT_STREAMS``, counted
until each call's task has ended, not only until the client resets it, so opening and resetting
streams in a loop cannot pile up work), the header block's size, the receive windows (a stream's
window reopens only as its call takes what arrived), and replies owed while the client reads none.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from hpack import HPACKError

from tensorgate.protocols.grpc.http2 import frames as f
from tensorgate.protocols.grpc.http2.frames import ConnectionError_, ErrorCode
from tensorgate.protocols.grpc.http2.header_blocks import HeaderBlocks, Headers
from tensorgate.protocols.grpc.http2.stream import Stream, StreamOwner

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Http2Limits:
    max_concurrent_streams: int = 128
    # What a stream may have in flight unread by its call; the connection's window is larger, so
    # one slow stream does not stall the others.
    stream_window: int = 8 * 1024 * 1024
    connection_window: int = 64 * 1024 * 1024
    max_header_list_bytes: int = 16 * 1024
    # Control frames (SETTINGS and PING acknowledgements) queued while the client reads nothing.
    max_unread_replies: int = 1024
    # Streams refused for being over the limit before the connection is closed as abusive.
    max_refused_streams: int = 1024
    # A connection that has not sent HTTP/2's preface by then is closed (grpc's handshake timeout
    # is 120 s; a gRPC client sends its preface at once).
    preface_timeout_s: float = 20.0
    # A connection with no call open for this long is sent GOAWAY and closed (grpc's
    # max_connection_idle); a client's channel reconnects on its next call. None: never.
    idle_timeout_s: float | None = 600.0


# Called with each new stream and its request headers; returns who owns the stream, or None if the
# stream was answered at once (a refusal, say) and needs nothing more.
Opener = Callable[[Stream, Headers], StreamOwner | None]


class Http2ServerConnection(asyncio.Protocol):
    def __init__(self, opener: Opener, limits: Http2Limits, on_closed: Callable[[Http2ServerConnection], None]) -> None:
        self.limits = limits
        self._opener = opener
        self._on_closed = on_closed
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._preface_seen = False
        self._hpack = HeaderBlocks(limits.max_header_list_bytes)
        self.streams: dict[int, Stream] = {}
        self.running = 0  # calls whose task has not ended, reset or not: the concurrency limit
        self._last_stream_id = 0
        self._send_window = f.DEFAULT_WINDOW
        self._peer_initial_window = f.DEFAULT_WINDOW
        self._peer_max_frame = f.DEFAULT_FRAME_SIZE
        self._recv_window = limits.connection_window
        self._conn_unacked = 0
        # A DATA frame whose payload is still arriving: (stream or None when discarded, bytes left, END_STREAM).
        self._data_left = 0
        self._data_stream: Stream | None = None
        self._data_end = False
        # A header block split over CONTINUATION frames: (stream id, flags, parts).
        self._header_block: tuple[int, int, list[bytes]] | None = None
        self._blocked: dict[int, Stream] = {}
        self._paused = False
        self._unread_replies = 0
        self._refused = 0
        self._resumed: asyncio.Future[None] | None = None
        self.goaway_sent = False  # ours: streams the client opens after it are ignored
        self.goaway_received = False  # the client's: it opens no more streams
        self.closed = False
        self.peer = "unknown"
        self._preface_timer: asyncio.TimerHandle | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._idle_since: float | None = None  # when the last call ended; None while one is open

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self.peer = peer_name(transport.get_extra_info("peername"))
        settings = {
            f.ENABLE_PUSH: 0,
            f.MAX_CONCURRENT_STREAMS: self.limits.max_concurrent_streams,
            f.INITIAL_WINDOW_SIZE: self.limits.stream_window,
            f.MAX_FRAME_SIZE: f.MAX_FRAME_SIZE_LIMIT,
            f.MAX_HEADER_LIST_SIZE: self.limits.max_header_list_bytes,
        }
        self.write(f.settings(settings) + f.window_update(0, self.limits.connection_window - f.DEFAULT_WINDOW))
        self._preface_timer = asyncio.get_running_loop().call_later(self.limits.preface_timeout_s, self._no_preface)
        self._became_idle()

    def _became_idle(self) -> None:
        if self.limits.idle_timeout_s is None or self.closed:
            return
        loop = asyncio.get_running_loop()
        self._idle_since = loop.time()
        if self._idle_timer is None:
            self._idle_timer = loop.call_later(self.limits.idle_timeout_s, self._check_idle)

    def _check_idle(self) -> None:
        """The idle timer: GOAWAY once no call has been open for ``idle_timeout_s``, else look again
        when that could next be true (one timer per connection, not one per call)."""
        self._idle_timer = None
        timeout = self.limits.idle_timeout_s
        if self.closed or timeout is None or self._idle_since is None:
            return
        loop = asyncio.get_running_loop()
        due = self._idle_since + timeout
        if loop.time() >= due:
            log.debug("closing HTTP/2 connection from %s: idle for %.0f s", self.peer, timeout)
            self.goaway()
        else:
            self._idle_timer = loop.call_at(due, self._check_idle)

    def _no_preface(self) -> None:
        if not self._preface_seen:
            self.fail(ErrorCode.PROTOCOL_ERROR, "no HTTP/2 connection preface")

    def data_received(self, data: bytes) -> None:
        try:
            self._receive(data)
        except ConnectionError_ as exc:
            self.fail(exc.code, str(exc))
        except Exception:  # the boundary: a bug here must close this connection, not the server
            log.exception("HTTP/2 connection failed")
            self.fail(ErrorCode.INTERNAL_ERROR, "internal error")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        for timer in (self._preface_timer, self._idle_timer):
            if timer is not None:
                timer.cancel()
        for stream in list(self.streams.values()):
            self._drop(stream)
        if self._resumed is not None and not self._resumed.done():
            self._resumed.set_result(None)
        self._on_closed(self)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._unread_replies = 0
        if self._resumed is not None and not self._resumed.done():
            self._resumed.set_result(None)

    async def writable(self) -> None:
        """Until the transport takes writes again (the client reads what was sent)."""
        while self._paused and not self.closed:
            if self._resumed is None or self._resumed.done():
                self._resumed = asyncio.get_running_loop().create_future()
            await self._resumed

    # -- reading ------------------------------------------------------------------------------

    def _receive(self, data: bytes) -> None:
        if self.closed:
            return
        if self._buffer:
            self._buffer += data
            source: bytes | bytearray = self._buffer
        else:
            source = data
        view = memoryview(source)
        end = len(view)
        pos = 0
        if not self._preface_seen:
            if end < len(f.PREFACE):
                if not f.PREFACE.startswith(bytes(view)):
                    raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                self._keep(view, 0)
                return
            if view[: len(f.PREFACE)] != f.PREFACE:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            pos = len(f.PREFACE)
            self._preface_seen = True
        while not self.closed:
            if self._data_left:
                take = min(self._data_left, end - pos)
                if take == 0:
                    break
                self._data_left -= take
                self._deliver(view[pos : pos + take], self._data_left == 0)
                pos += take
                continue
            if end - pos < f.HEADER_BYTES:
                break
            length, kind, flags, stream_id = f.parse_header(view, pos)
            # No frame can exceed our SETTINGS_MAX_FRAME_SIZE: it is the largest a 24-bit length holds.
            if self._header_block is not None and kind != f.CONTINUATION:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "header block interrupted by another frame")
            if kind == f.DATA and not flags & f.PADDED:
                pos += f.HEADER_BYTES
                self._start_data(stream_id, length, flags & f.END_STREAM != 0)
                if length == 0:
                    self._deliver(view[pos:pos], True)
                continue
            if kind != f.DATA and length > self.limits.max_header_list_bytes + 1024:
                # Only DATA carries bulk; no other frame of a gRPC client's comes near this.
                raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, f"frame of type {kind} too large")
            if end - pos - f.HEADER_BYTES < length:
                break
            start = pos + f.HEADER_BYTES
            pos = start + length
            self._frame(kind, flags, stream_id, view[start:pos])
        self._keep(view, pos)

    def _keep(self, view: memoryview, pos: int) -> None:
        # A fresh buffer: the old one may still be viewed by a chunk an owner has not copied yet.
        self._buffer = bytearray(view[pos:]) if pos < len(view) else bytearray()

    def _frame(self, kind: int, flags: int, stream_id: int, payload: memoryview) -> None:
        if kind == f.DATA:  # padded
            pad = _padding(payload)
            self._start_data(stream_id, len(payload), flags & f.END_STREAM != 0)
            self._consumed_padding(pad + 1)
            self._data_left = 0
            self._deliver(payload[1 : len(payload) - pad], True)
        elif kind == f.HEADERS:
            self._headers(stream_id, flags, payload)
        elif kind == f.CONTINUATION:
            self._continuation(stream_id, flags, payload)
        elif kind == f.SETTINGS:
            self._settings(stream_id, flags, payload)
        elif kind == f.WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == f.PING:
            if len(payload) != 8:
                raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "PING payload is not 8 bytes")
            if stream_id:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "PING on a stream")
            if not flags & f.ACK:
                self._reply(f.frame(f.PING, f.ACK, 0, bytes(payload)))
        elif kind == f.RST_STREAM:
            self._rst_stream(stream_id, payload)
        elif kind == f.GOAWAY:
            if stream_id:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "GOAWAY on a stream")
            self.goaway_received = True  # the client will open no more streams; finish the ones open
            self._maybe_close()
        elif kind == f.PRIORITY:
            if len(payload) != 5:
                raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "PRIORITY payload is not 5 bytes")
            if stream_id == 0:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "PRIORITY on stream 0")
        elif kind == f.PUSH_PROMISE:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "clients must not send PUSH_PROMISE")
        # Frames of unknown types are ignored (RFC 9113 §4.1).

    def _start_data(self, stream_id: int, length: int, end: bool) -> None:
        if stream_id == 0:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "DATA on stream 0")
        if stream_id > self._last_stream_id:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "DATA on a stream never opened")
        self._recv_window -= length
        if self._recv_window < 0:
            raise ConnectionError_(ErrorCode.FLOW_CONTROL_ERROR, "connection receive window exceeded")
        self._conn_unacked += length
        if self._conn_unacked >= self.limits.connection_window // 2:
            self.write(f.window_update(0, self._conn_unacked))
            self._recv_window += self._conn_unacked
            self._conn_unacked = 0
        stream = self.streams.get(stream_id)
        self._data_left, self._data_end, self._data_stream = length, end, None
        if stream is None or stream.remote_ended:
            if stream is not None:  # data after the client's END_STREAM
                stream.reset(ErrorCode.STREAM_CLOSED)
            return  # a stream already closed (reset, or answered early): discarded
        stream.recv_window -= length
        if stream.recv_window < 0:
            stream.reset(ErrorCode.FLOW_CONTROL_ERROR)
            return
        self._data_stream = stream
        if end:
            stream.remote_ended = True

    def _deliver(self, chunk: memoryview, last: bool) -> None:
        stream = self._data_stream
        if stream is None or stream.owner is None:
            return
        end = last and self._data_end
        if chunk or end:
            stream.owner.received(chunk, end)
        if end:
            self._after_remote_end(stream)

    def _consumed_padding(self, size: int) -> None:
        stream = self._data_stream
        if stream is not None:
            stream.consumed(size)

    def _headers(self, stream_id: int, flags: int, payload: memoryview) -> None:
        if stream_id == 0:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "HEADERS on stream 0")
        if flags & f.PADDED:
            pad = _padding(payload)
            payload = payload[1 : len(payload) - pad]
        if flags & f.PRIORITY_FLAG:
            if len(payload) < 5:
                raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            payload = payload[5:]
        self._header_block = (stream_id, flags, [bytes(payload)])
        if flags & f.END_HEADERS:
            self._end_header_block()

    def _continuation(self, stream_id: int, flags: int, payload: memoryview) -> None:
        if self._header_block is None or self._header_block[0] != stream_id:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        parts = self._header_block[2]
        parts.append(bytes(payload))
        if sum(map(len, parts)) > self.limits.max_header_list_bytes + 1024:
            raise ConnectionError_(ErrorCode.ENHANCE_YOUR_CALM, "header block too large")
        if flags & f.END_HEADERS:
            self._end_header_block()

    def _end_header_block(self) -> None:
        assert self._header_block is not None
        stream_id, flags, parts = self._header_block
        self._header_block = None
        try:
            headers = self._hpack.decode(b"".join(parts))
        except UnicodeDecodeError:  # the table is updated before values are decoded: only this stream is lost
            headers = None
        except HPACKError as exc:
            raise ConnectionError_(ErrorCode.COMPRESSION_ERROR, f"header block not decodable: {exc}") from None
        end = flags & f.END_STREAM != 0
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers from the client: they end its side
            if not end:
                stream.reset(ErrorCode.PROTOCOL_ERROR)
            elif not stream.remote_ended:
                stream.remote_ended = True
                if stream.owner is not None:
                    stream.owner.received(memoryview(b""), True)
                self._after_remote_end(stream)
            return
        if stream_id % 2 == 0:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "client stream ids are odd")
        if stream_id <= self._last_stream_id:
            self.write(f.rst_stream(stream_id, ErrorCode.STREAM_CLOSED))
            return
        self._last_stream_id = stream_id
        if self.goaway_sent or self.goaway_received:
            return  # past our GOAWAY's last stream id (or after the client's): ignored
        if headers is None or not _well_formed(headers):
            self.write(f.rst_stream(stream_id, ErrorCode.PROTOCOL_ERROR))
            return
        if self.running >= self.limits.max_concurrent_streams:
            self._refused += 1
            if self._refused > self.limits.max_refused_streams:
                raise ConnectionError_(ErrorCode.ENHANCE_YOUR_CALM, "too many streams over the limit")
            self.write(f.rst_stream(stream_id, ErrorCode.REFUSED_STREAM))
            return
        stream = Stream(self, stream_id, self._peer_initial_window, self.limits.stream_window)
        self._idle_since = None
        stream.remote_ended = end
        self.streams[stream_id] = stream
        stream.owner = self._opener(stream, headers)
        if stream.owner is not None and end:
            stream.owner.received(memoryview(b""), True)
        if stream.owner is None or stream.local_ended:
            self._after_remote_end(stream)

    def _after_remote_end(self, stream: Stream) -> None:
        if stream.local_ended and not stream.blocked:
            self.streams.pop(stream.id, None)
            self._maybe_close()

    def _settings(self, stream_id: int, flags: int, payload: memoryview) -> None:
        if stream_id:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & f.ACK:
            if payload:
                raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS acknowledgement with a payload")
            return
        for key, value in f.parse_settings(payload):
            if key == f.INITIAL_WINDOW_SIZE:
                if value > f.MAX_WINDOW:
                    raise ConnectionError_(ErrorCode.FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE too large")
                delta = value - self._peer_initial_window
                self._peer_initial_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
            elif key == f.MAX_FRAME_SIZE:
                if not f.DEFAULT_FRAME_SIZE <= value <= f.MAX_FRAME_SIZE_LIMIT:
                    raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
                self._peer_max_frame = value
            elif key == f.HEADER_TABLE_SIZE:
                self._hpack.set_encoder_table_size(min(value, 4096))
            elif key == f.ENABLE_PUSH and value > 1:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH is neither 0 nor 1")
        self._reply(f.frame(f.SETTINGS, f.ACK, 0))
        self._flush_blocked()

    def _window_update(self, stream_id: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "WINDOW_UPDATE payload is not 4 bytes")
        increment = f.u32(payload) & 0x7FFF_FFFF
        if stream_id == 0:
            if increment == 0:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > f.MAX_WINDOW:
                raise ConnectionError_(ErrorCode.FLOW_CONTROL_ERROR, "connection send window over 2^31-1")
            self._flush_blocked()
            return
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id > self._last_stream_id:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE on a stream never opened")
            return
        if increment == 0:
            stream.reset(ErrorCode.PROTOCOL_ERROR)
            return
        stream.send_window += increment
        if stream.send_window > f.MAX_WINDOW:
            stream.reset(ErrorCode.FLOW_CONTROL_ERROR)
            return
        self.flush(stream)

    def _rst_stream(self, stream_id: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "RST_STREAM payload is not 4 bytes")
        if stream_id == 0 or stream_id > self._last_stream_id:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "RST_STREAM on a stream never opened")
        stream = self.streams.get(stream_id)
        if stream is not None:
            self._drop(stream)

    # -- writing ------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self._transport is not None and not self.closed:
            self._transport.write(data)

    def _reply(self, data: bytes) -> None:
        """A frame owed to the client (an acknowledgement); too many unread ones end the connection."""
        if self._paused:
            self._unread_replies += 1
            if self._unread_replies > self.limits.max_unread_replies:
                raise ConnectionError_(ErrorCode.ENHANCE_YOUR_CALM, "the client reads none of our replies")
        self.write(data)

    def header_frames(self, stream_id: int, headers: Headers, end_stream: bool) -> bytes:
        block = self._hpack.encode(headers)
        flags = f.END_STREAM if end_stream else 0
        limit = self._peer_max_frame
        if len(block) <= limit:
            return f.frame(f.HEADERS, flags | f.END_HEADERS, stream_id, block)
        parts = [block[i : i + limit] for i in range(0, len(block), limit)]
        out = [f.frame(f.HEADERS, flags, stream_id, parts[0])]
        for index, part in enumerate(parts[1:], 1):
            out.append(f.frame(f.CONTINUATION, f.END_HEADERS if index == len(parts) - 1 else 0, stream_id, part))
        return b"".join(out)

    def flush(self, stream: Stream) -> None:
        if self.closed:
            stream.wake()
            return
        out: list[bytes] = []
        self._send_window -= stream.write_pending(out, self._send_window, self._peer_max_frame)
        if out:
            self.write(b"".join(out))
        if stream.blocked:
            self._blocked[stream.id] = stream
        else:
            self._blocked.pop(stream.id, None)
            if stream.local_ended:
                self._finish(stream)

    def _flush_blocked(self) -> None:
        for stream in list(self._blocked.values()):
            if self._send_window <= 0:
                return
            self.flush(stream)

    def _finish(self, stream: Stream) -> None:
        """Our side is written to the end; a client still sending is told to stop (RST NO_ERROR)."""
        if self.streams.pop(stream.id, None) is None:
            return
        if not stream.remote_ended:
            self.write(f.rst_stream(stream.id, ErrorCode.NO_ERROR))
        self._maybe_close()

    def close_stream(self, stream: Stream, code: ErrorCode) -> None:
        stream.local_ended = True
        self._blocked.pop(stream.id, None)
        if self.streams.pop(stream.id, None) is not None:
            self.write(f.rst_stream(stream.id, code))
        self._maybe_close()

    def _drop(self, stream: Stream) -> None:
        """The client reset the stream (or left): its owner stops; nothing more is sent on it."""
        self.streams.pop(stream.id, None)
        self._blocked.pop(stream.id, None)
        stream.abandon()
        if stream.owner is not None:
            stream.owner.reset()
        self._maybe_close()

    def call_started(self) -> None:
        """A stream's call task started: it counts against the concurrency limit until it ends."""
        self.running += 1
        self._idle_since = None

    def call_ended(self) -> None:
        """A stream's call task ended: one fewer against the concurrency limit."""
        self.running -= 1
        self._maybe_close()

    def _maybe_close(self) -> None:
        """With no stream or call left: close after a GOAWAY either way, else start the idle clock."""
        if self.streams or self.running:
            return
        if self.goaway_sent or self.goaway_received:
            self.close()
        elif self._idle_since is None:
            self._became_idle()

    # -- ending -------------------------------------------------------------------------------

    def warn_goaway(self) -> None:
        """The first GOAWAY of a graceful shutdown (RFC 9113 §6.8): the client opens no more streams,
        but any already on their way are still taken (its last stream id is the largest there is).
        A proxy that cannot send a call twice (nginx's gRPC) loses none that crossed the shutdown."""
        if not self.goaway_sent and not self.closed:
            self.write(f.goaway(f.MAX_STREAM_ID, ErrorCode.NO_ERROR))

    def goaway(self) -> None:
        """No new streams (graceful shutdown); the connection closes when the open ones end."""
        if not self.goaway_sent and not self.closed:
            self.goaway_sent = True
            self.write(f.goaway(self._last_stream_id, ErrorCode.NO_ERROR))
        self._maybe_close()

    def fail(self, code: ErrorCode, message: str) -> None:
        if self.closed:
            return
        log.debug("closing HTTP/2 connection from %s: %s", self.peer, message)
        self.write(f.goaway(self._last_stream_id, code, message.encode()[:256]))
        self.close()

    def close(self) -> None:
        if self._transport is not None and not self.closed:
            self.closed = True
            self._transport.close()


def peer_name(address: object) -> str:
    """A socket's peer as gRPC's ``context.peer()`` names it: ``ipv4:host:port``, ``ipv6:[host]:port``."""
    if isinstance(address, tuple) and len(address) >= 2:
        if ":" in str(address[0]):
            return f"ipv6:[{address[0]}]:{address[1]}"
        return f"ipv4:{address[0]}:{address[1]}"
    return "unknown"


def _padding(payload: memoryview) -> int:
    if not payload:
        raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "padded frame without its pad length")
    pad = int(payload[0])
    if pad >= len(payload):
        raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "padding longer than the frame")
    return pad


_CONNECTION_HEADERS = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"})


def _well_formed(headers: Headers) -> bool:
    """RFC 9113 §8.2-8.3: lowercase names, pseudo-headers first, no connection-specific fields."""
    regular = False
    for name, value in headers:
        if not name or name != name.lower():
            return False
        if name[0] == ":":
            if regular or name not in (":method", ":scheme", ":path", ":authority"):
                return False
        else:
            regular = True
            if name in _CONNECTION_HEADERS or (name == "te" and value != "trailers"):
                return False
    return True
