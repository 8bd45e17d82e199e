"""gRPC's HTTP/2 through the ``h2`` library, for ``bench_grpc_transport.py`` to measure against ours.

The same calls (:mod:`tensorgate.protocols.grpc.call`) and limits (:class:`Http2Limits`) as
tensorgate's transport (:mod:`tensorgate.protocols.grpc.http2`); h2 keeps the protocol's state (frames,
HPACK, flow control, stream states) and this module turns its events into the calls' stream
operations. Two differences follow from h2: our GOAWAY is written as a frame of our own, because
h2 refuses to send anything on a connection once it has sent one (the calls in flight must still
answer); and a client's GOAWAY ends the calls still open on that connection, for the same reason.
:class:`H2GrpcServer` is tensorgate's gRPC server with its connections made here.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from hyperframe.frame import GoAwayFrame

from tensorgate.protocols.grpc.http2.connection import Http2Limits, peer_name
from tensorgate.protocols.grpc.http2.frames import MAX_STREAM_ID, ErrorCode
from tensorgate.protocols.grpc.http2.header_blocks import Headers
from tensorgate.protocols.grpc.http2.stream import StreamOwner
from tensorgate.protocols.grpc.server import Connection, GrpcServer, Opener

log = logging.getLogger(__name__)

H2Opener = Callable[["H2Stream", Headers], StreamOwner | None]


class H2Stream:
    """One request stream: what a call sends is queued here and written as flow control allows."""

    __slots__ = ("_conn", "_drained", "_pending", "id", "local_ended", "owner", "remote_ended")

    def __init__(self, conn: H2ServerConnection, stream_id: int) -> None:
        self.id = stream_id
        self._conn = conn
        self.owner: StreamOwner | None = None
        self._pending: deque[memoryview | tuple[Headers, bool]] = deque()
        self._drained: asyncio.Future[None] | None = None
        self.local_ended = False
        self.remote_ended = False

    def send_headers(self, headers: Headers, end_stream: bool = False, flush: bool = True) -> None:
        self._queue((headers, end_stream), flush, end_stream)

    def send_data(self, data: bytes | memoryview, flush: bool = True) -> None:
        if data:
            self._queue(memoryview(data), flush, False)

    def _queue(self, item: memoryview | tuple[Headers, bool], flush: bool, end: bool) -> None:
        if self.local_ended:
            return
        self._pending.append(item)
        self.local_ended = end
        if flush:
            self._conn.flush(self)

    async def drain(self) -> None:
        """Until everything queued is written (or the stream ends unwritten)."""
        while self._pending and not self._conn.closed:
            if self._drained is None or self._drained.done():
                self._drained = asyncio.get_running_loop().create_future()
            await self._drained
        await self._conn.writable()

    def write_pending(self, conn: h2.connection.H2Connection) -> None:
        """Hand h2 what its flow-control windows allow, in order."""
        pending = self._pending
        while pending:
            item = pending[0]
            if not isinstance(item, memoryview):
                headers, end = item
                conn.send_headers(self.id, headers, end_stream=end)
                pending.popleft()
                continue
            size = min(len(item), conn.local_flow_control_window(self.id), conn.max_outbound_frame_size)
            if size <= 0:
                return
            conn.send_data(self.id, item[:size].tobytes())
            if size == len(item):
                pending.popleft()
            else:
                pending[0] = item[size:]
        self.wake()

    def wake(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    @property
    def blocked(self) -> bool:
        return bool(self._pending)

    def consumed(self, size: int) -> None:
        """The call took ``size`` received bytes: h2 reopens the windows as it sees fit."""
        self._conn.acknowledge(self, size)

    def abandon(self) -> None:
        self.local_ended = True
        self._pending.clear()
        self.wake()

    def reset(self, code: ErrorCode = ErrorCode.CANCEL) -> None:
        """End the stream now (RST_STREAM), whatever is unsent; its owner stops."""
        self.abandon()
        self._conn.close_stream(self, code)
        if self.owner is not None:
            self.owner.reset()


class H2ServerConnection(asyncio.Protocol):
    def __init__(self, opener: H2Opener, limits: Http2Limits, on_closed: Callable[[H2ServerConnection], None]) -> None:
        self.limits = limits
        self._opener = opener
        self._on_closed = on_closed
        config = h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        self._h2 = h2.connection.H2Connection(config)
        self._h2.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: limits.max_concurrent_streams,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: limits.stream_window,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: limits.max_header_list_bytes,
            },
        )
        self._transport: asyncio.Transport | None = None
        self.streams: dict[int, H2Stream] = {}
        self._blocked: dict[int, H2Stream] = {}
        self.running = 0  # calls whose task has not ended: the concurrency limit
        self._refused = 0
        self._last_stream_id = 0
        self._paused = False
        self._resumed: asyncio.Future[None] | None = None
        self.goaway_sent = False
        self.goaway_received = False
        self.closed = False
        self.peer = "unknown"
        self._preface_seen = False
        self._preface_timer: asyncio.TimerHandle | None = None
        self._idle_timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self.peer = peer_name(transport.get_extra_info("peername"))
        self._h2.initiate_connection()
        self._h2.increment_flow_control_window(self.limits.connection_window - 65535)
        self._send()
        loop = asyncio.get_running_loop()
        self._preface_timer = loop.call_later(self.limits.preface_timeout_s, self._no_preface)
        self._became_idle()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            events = self._h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:  # h2 has queued its GOAWAY, except for a bad preface
            log.debug("closing HTTP/2 connection from %s: %s", self.peer, exc)
            data = self._h2.data_to_send()
            if self._h2.state_machine.state is not h2.connection.ConnectionState.CLOSED:
                data += GoAwayFrame(0, last_stream_id=self._last_stream_id, error_code=exc.error_code).serialize()
            if self._transport is not None:
                self._transport.write(data)
            self.close()
            return
        try:
            for event in events:
                self._event(event)
        except Exception:  # the boundary: a bug here must close this connection, not the server
            log.exception("HTTP/2 connection failed")
            self.fail(ErrorCode.INTERNAL_ERROR)
            return
        self._send()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        for timer in (self._preface_timer, self._idle_timer):
            if timer is not None:
                timer.cancel()
        for stream in list(self.streams.values()):
            self._drop(stream)
        self._wake_writers()
        self._on_closed(self)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake_writers()

    def _wake_writers(self) -> None:
        if self._resumed is not None and not self._resumed.done():
            self._resumed.set_result(None)

    async def writable(self) -> None:
        """Until the transport takes writes again (the client reads what was sent)."""
        while self._paused and not self.closed:
            if self._resumed is None or self._resumed.done():
                self._resumed = asyncio.get_running_loop().create_future()
            await self._resumed

    # -- h2's events --------------------------------------------------------------------------

    def _event(self, event: h2.events.Event) -> None:
        if not self._preface_seen:
            self._preface_seen = True
        if isinstance(event, h2.events.RequestReceived):
            self._request(event.stream_id, event.headers)  # type: ignore[arg-type]
        elif isinstance(event, h2.events.DataReceived):
            self._data(event)
        elif isinstance(event, h2.events.StreamEnded | h2.events.TrailersReceived):
            self._remote_end(event.stream_id)
        elif isinstance(event, h2.events.StreamReset):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                self._drop(stream)
        elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            self._flush_blocked()
        elif isinstance(event, h2.events.ConnectionTerminated):
            # h2 sends nothing more on the connection: the calls still open cannot answer.
            self.goaway_received = True
            self.close()

    def _request(self, stream_id: int, headers: Headers) -> None:
        self._last_stream_id = stream_id
        if self.goaway_sent:  # past our GOAWAY's last stream id: refused, the client may retry
            self._reset(stream_id, ErrorCode.REFUSED_STREAM)
            return
        if self.running >= self.limits.max_concurrent_streams:
            self._refused += 1
            if self._refused > self.limits.max_refused_streams:
                self.fail(ErrorCode.ENHANCE_YOUR_CALM)
                return
            self._reset(stream_id, ErrorCode.REFUSED_STREAM)
            return
        self._cancel_idle()
        stream = H2Stream(self, stream_id)
        self.streams[stream_id] = stream
        stream.owner = self._opener(stream, headers)
        if stream.owner is None or stream.local_ended:
            self._after_end(stream)

    def _data(self, event: h2.events.DataReceived) -> None:
        stream_id: int = event.stream_id
        data: bytes = event.data
        padding = event.flow_controlled_length - len(data)
        stream = self.streams.get(stream_id)
        if stream is None or stream.owner is None:  # answered already: its bytes are dropped
            self._h2.acknowledge_received_data(event.flow_controlled_length, stream_id)
            return
        if padding:
            self._h2.acknowledge_received_data(padding, stream_id)
        if data:
            stream.owner.received(memoryview(data), False)

    def _remote_end(self, stream_id: int) -> None:
        stream = self.streams.get(stream_id)
        if stream is None or stream.remote_ended:
            return
        stream.remote_ended = True
        if stream.owner is not None:
            stream.owner.received(memoryview(b""), True)
        self._after_end(stream)

    # -- the calls' side ----------------------------------------------------------------------

    def acknowledge(self, stream: H2Stream, size: int) -> None:
        if self.closed or stream.id not in self.streams:
            return
        try:
            self._h2.acknowledge_received_data(size, stream.id)
        except h2.exceptions.StreamClosedError:
            return
        self._send()

    def flush(self, stream: H2Stream) -> None:
        if self.closed:
            stream.wake()
            return
        try:
            stream.write_pending(self._h2)
        except h2.exceptions.StreamClosedError:  # the client reset it while we wrote
            stream.abandon()
        self._send()
        if stream.blocked:
            self._blocked[stream.id] = stream
        else:
            self._blocked.pop(stream.id, None)
            if stream.local_ended:
                self._finish(stream)

    def _flush_blocked(self) -> None:
        for stream in list(self._blocked.values()):
            if self._h2.outbound_flow_control_window <= 0:
                return
            self.flush(stream)

    def _finish(self, stream: H2Stream) -> None:
        """Our side is written to the end; a client still sending is told to stop (RST NO_ERROR)."""
        if self.streams.pop(stream.id, None) is None:
            return
        if not stream.remote_ended:
            self._reset(stream.id, ErrorCode.NO_ERROR)
        self._maybe_close()

    def _after_end(self, stream: H2Stream) -> None:
        if stream.local_ended and not stream.blocked:
            self.streams.pop(stream.id, None)
            self._maybe_close()

    def close_stream(self, stream: H2Stream, code: ErrorCode) -> None:
        self._blocked.pop(stream.id, None)
        if self.streams.pop(stream.id, None) is not None:
            self._reset(stream.id, code)
            self._send()
        self._maybe_close()

    def _reset(self, stream_id: int, code: ErrorCode) -> None:
        """RST_STREAM, unless h2 has closed the stream already (events come after a whole read, so a
        stream the client reset later in the same read is closed by the time its request is seen)."""
        try:
            self._h2.reset_stream(stream_id, code)
        except h2.exceptions.StreamClosedError:
            pass

    def _drop(self, stream: H2Stream) -> None:
        """The client reset the stream (or left): its owner stops; nothing more is sent on it."""
        self.streams.pop(stream.id, None)
        self._blocked.pop(stream.id, None)
        stream.abandon()
        if stream.owner is not None:
            stream.owner.reset()
        self._maybe_close()

    def call_started(self) -> None:
        self.running += 1
        self._cancel_idle()

    def call_ended(self) -> None:
        self.running -= 1
        self._maybe_close()

    def _maybe_close(self) -> None:
        if self.streams or self.running:
            return
        if self.goaway_sent or self.goaway_received:
            self.close()
        else:
            self._became_idle()

    # -- timers -------------------------------------------------------------------------------

    def _no_preface(self) -> None:
        if not self._preface_seen:
            self.fail(ErrorCode.PROTOCOL_ERROR)

    def _became_idle(self) -> None:
        if self.limits.idle_timeout_s is None or self._idle_timer is not None or self.closed:
            return
        self._idle_timer = asyncio.get_running_loop().call_later(self.limits.idle_timeout_s, self._idle)

    def _cancel_idle(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _idle(self) -> None:
        self._idle_timer = None
        if not self.streams and not self.running:
            self.goaway()

    # -- writing and ending -------------------------------------------------------------------

    def _send(self) -> None:
        data = self._h2.data_to_send()
        if data and self._transport is not None and not self.closed:
            self._transport.write(data)

    def warn_goaway(self) -> None:
        """The first GOAWAY of a graceful shutdown, as the native transport's: no new streams, but
        those on their way are still taken (written beside h2's state machine, like ``goaway``)."""
        if not self.goaway_sent and not self.closed and self._transport is not None:
            self._send()
            self._transport.write(
                GoAwayFrame(0, last_stream_id=MAX_STREAM_ID, error_code=ErrorCode.NO_ERROR).serialize()
            )

    def goaway(self) -> None:
        """No new streams (graceful shutdown); the connection closes when the open ones end."""
        if not self.goaway_sent and not self.closed:
            self.goaway_sent = True
            self._send()
            frame = GoAwayFrame(0, last_stream_id=self._last_stream_id, error_code=ErrorCode.NO_ERROR)
            if self._transport is not None:
                self._transport.write(frame.serialize())
        self._maybe_close()

    def fail(self, code: ErrorCode) -> None:
        if self.closed:
            return
        self._h2.close_connection(error_code=code, last_stream_id=self._last_stream_id)
        self._send()
        self.close()

    def close(self) -> None:
        if self._transport is not None and not self.closed:
            self.closed = True
            self._transport.close()


class H2GrpcServer(GrpcServer):
    """tensorgate's gRPC server (accept, calls, shutdown) with each connection on the h2 library."""

    def make_connection(self, opener: Opener, on_closed: Callable[[Connection], None]) -> Connection:
        return H2ServerConnection(opener, self.limits, on_closed)  # type: ignore[arg-type,return-value]
