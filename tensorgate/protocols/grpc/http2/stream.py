"""One request stream of an HTTP/2 connection, as its owner (the gRPC call) sees it.

The owner, :mod:`tensorgate.protocols.grpc.call`, receives the stream's payload bytes in order, then
the end or a reset (:class:`StreamOwner`); it sends headers, data and trailers through
:class:`Stream`, which queues them for the connection to write as the client's flow-control
windows allow.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol

from tensorgate.protocols.grpc.http2 import frames as f
from tensorgate.protocols.grpc.http2.frames import ErrorCode
from tensorgate.protocols.grpc.http2.header_blocks import Headers


class StreamOwner(Protocol):
    """What receives a stream's payload: the gRPC call."""

    def received(self, chunk: memoryview, end: bool) -> None: ...

    def reset(self) -> None: ...


class StreamConnection(Protocol):
    """What a stream needs of its connection (``connection.Http2ServerConnection``), named here so
    that this module does not import that one."""

    @property
    def closed(self) -> bool: ...

    def write(self, data: bytes) -> None: ...

    def flush(self, stream: Stream) -> None: ...

    async def writable(self) -> None: ...

    def header_frames(self, stream_id: int, headers: Headers, end_stream: bool) -> bytes: ...

    def close_stream(self, stream: Stream, code: ErrorCode) -> None: ...


class Stream:
    """One request stream: what the call sends goes through here, paced by flow control."""

    __slots__ = (
        "_conn",
        "_drained",
        "_pending",
        "_unacked",
        "_window",
        "id",
        "local_ended",
        "owner",
        "recv_window",
        "remote_ended",
        "send_window",
    )

    def __init__(self, conn: StreamConnection, stream_id: int, send_window: int, recv_window: int) -> None:
        self.id = stream_id
        self._conn = conn
        self.owner: StreamOwner | None = None
        self.send_window = send_window
        self.recv_window = recv_window
        self._pending: deque[memoryview | tuple[Headers, bool]] = deque()  # data, or (headers, end), unwritten
        self._drained: asyncio.Future[None] | None = None
        self.remote_ended = False
        self.local_ended = False
        self._unacked = 0
        self._window = recv_window  # what the receive window is reopened to

    # -- sending ------------------------------------------------------------------------------

    # With ``flush=False`` a frame waits for the next one queued, so an answer's headers, message
    # and trailers leave in one write.

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

    def write_pending(self, out: list[bytes], conn_window: int, max_frame: int) -> int:
        """Append what flow control allows to ``out``; returns the connection window spent."""
        spent = 0
        pending = self._pending
        while pending:
            data = pending[0]
            if not isinstance(data, memoryview):
                headers, end = data
                out.append(self._conn.header_frames(self.id, headers, end))
                pending.popleft()
                continue
            size = min(len(data), self.send_window, conn_window - spent, max_frame)
            if size <= 0:
                return spent
            out.append(f.header(f.DATA, 0, self.id, size))
            out.append(data[:size])  # type: ignore[arg-type]
            self.send_window -= size
            spent += size
            if size == len(data):
                pending.popleft()
            else:
                pending[0] = data[size:]
        self.wake()
        return spent

    def wake(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    @property
    def blocked(self) -> bool:
        return bool(self._pending)

    # -- receiving ----------------------------------------------------------------------------

    def consumed(self, size: int) -> None:
        """The call took ``size`` received bytes: reopen the window once half of it is used."""
        self._unacked += size
        if self._unacked >= self._window // 2 and not self.remote_ended:
            self._conn.write(f.window_update(self.id, self._unacked))
            self.recv_window += self._unacked
            self._unacked = 0

    def abandon(self) -> None:
        """The client reset the stream or left: nothing more will be written on it."""
        self.local_ended = True
        self._pending.clear()
        self.wake()

    def reset(self, code: ErrorCode = ErrorCode.CANCEL) -> None:
        """End the stream now (RST_STREAM), whatever is unsent; its owner stops, as when the client
        resets it. (Told nothing, a call waiting for more of the request waited forever: the stream
        is no longer the connection's, so not even the connection's end reached it.)"""
        self._pending.clear()
        self.wake()
        self._conn.close_stream(self, code)
        if self.owner is not None:
            self.owner.reset()
