"""One gRPC call on an HTTP/2 stream: its messages in, the servicer run, its answer and status out.

:class:`Call` owns a stream (it receives the stream's bytes and splits them into gRPC's
length-prefixed messages) and is the ``context`` servicers are given, with the part of
``grpc.aio.ServicerContext`` they use: metadata in and out, the deadline, ``abort``, ``write``
and ``read``. The protocol is gRPC over HTTP/2 as specified in grpc's ``PROTOCOL-HTTP2.md``:
``grpc-timeout`` becomes the call's deadline (the handler is cancelled when it passes), a reset
stream cancels the handler, and a message over the receive limit ends the call with
RESOURCE_EXHAUSTED before it is buffered.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import logging
import re
import zlib
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from tensorgate.errors import DEADLINE_CANCEL, TensorgateError
from tensorgate.protocols.access import grpc_access
from tensorgate.protocols.grpc.http2.header_blocks import Headers
from tensorgate.protocols.grpc.methods import MethodTable
from tensorgate.security.gate import Gate
from tensorgate.security.identity import Identity

log = logging.getLogger(__name__)

# How long before its deadline a client's reset still counts as that deadline (see Call.reset). A
# client times the deadline from when it sent the call and we from when we read its headers, so its
# timer fires first, by the call's trip to us and by how late our event loop read it; its RST_STREAM
# then reaches us shortly before our own deadline. What the window decides is only how the call is
# counted (the client has given up either way, and reports DEADLINE_EXCEEDED itself): 20 ms covers
# a loopback or LAN trip and a loop that reads a few milliseconds late under load, and is short
# enough that a cancel well before the deadline is still counted as a cancel.
CLIENT_DEADLINE_SLACK_S = 0.02

Metadata = tuple[tuple[str, str | bytes], ...]

ACCEPT_ENCODING = "identity,deflate,gzip"
# Complete messages a call holds before its stream's window stops reopening (a streaming handler
# reading slower than its client sends).
INBOX_MESSAGES = 4
# Headers of the protocol itself, not the caller's metadata.
_RESERVED = frozenset({"content-type", "te", "grpc-timeout", "grpc-encoding", "grpc-accept-encoding"})
_TIMEOUT = re.compile(r"^(\d{1,8})([HMSmun])$")
_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


@dataclass(frozen=True, slots=True)
class CallSettings:
    max_receive_bytes: int
    max_send_bytes: int
    gate: Gate | None = None  # authentication and rate limits, run on the headers of each call


class Aborted(Exception):
    """Raised by :meth:`Call.abort`; the call's status is already set."""


class _StatusError(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class CallStream(Protocol):
    """The stream operations a call uses (``http2.stream.Stream``; a benchmark runs the same calls over
    the h2 library's streams)."""

    def send_headers(self, headers: Headers, end_stream: bool = False, flush: bool = True) -> None: ...

    def send_data(self, data: bytes | memoryview, flush: bool = True) -> None: ...

    async def drain(self) -> None: ...

    def consumed(self, size: int) -> None: ...


class CallConnection(Protocol):
    """What a call tells its connection (the concurrency limit and idle clock count calls)."""

    @property
    def peer(self) -> str: ...

    def call_started(self) -> None: ...

    def call_ended(self) -> None: ...


def open_call(
    stream: CallStream,
    headers: Headers,
    conn: CallConnection,
    methods: MethodTable,
    settings: CallSettings,
    calls: set[Call],
) -> Call | None:
    """Start the call a new stream asks for, or answer it at once when it cannot be served."""
    pseudo: dict[str, str] = {}
    fields: dict[str, str] = {}
    metadata: list[tuple[str, str | bytes]] = []
    for name, value in headers:
        if name[0] == ":":
            pseudo[name] = value
            continue
        fields[name] = value
        if name not in _RESERVED:
            metadata.append((name, _metadata_value(name, value)))
    if pseudo.get(":method") != "POST":
        stream.send_headers([(":status", "405")], end_stream=True)
        return None
    if not fields.get("content-type", "").startswith("application/grpc"):
        stream.send_headers([(":status", "415"), ("content-type", "text/plain")], end_stream=True)
        return None
    path = pseudo.get(":path", "")
    try:
        timeout = _timeout_s(fields.get("grpc-timeout"))
        encoding = fields.get("grpc-encoding", "identity")
        if encoding not in ("identity", "gzip", "deflate"):
            raise _StatusError(grpc.StatusCode.UNIMPLEMENTED, f"compression {encoding[:32]!r} is not supported")
        method = methods.find(path, tuple(metadata))
        if method is None:
            raise _StatusError(grpc.StatusCode.UNIMPLEMENTED, f"method {path[:128]!r} is not served here")
        identity = _admit(settings.gate, path, fields)
    except _StatusError as exc:
        send_status(stream, exc.code, exc.details, (), headers_sent=False)
        return None
    call = Call(stream, conn, path, method, tuple(metadata), encoding, settings, calls)
    call.identity = identity
    call.start(timeout)
    return call


def _admit(gate: Gate | None, path: str, fields: dict[str, str]) -> Identity | None:
    """The caller of a new call, from its headers alone: before its message is read or parsed."""
    if gate is None:
        return None
    try:
        identity = gate.check(grpc_access(path), fields.get("authorization"), fields.get("x-api-key"))
        gate.admit(identity)
    except TensorgateError as exc:
        raise _StatusError(grpc.StatusCode[exc.grpc_status], exc.message) from None
    return identity


class Call:
    """The stream owner and the servicer context of one call."""

    def __init__(
        self,
        stream: CallStream,
        conn: CallConnection,
        path: str,
        method: Any,
        metadata: Metadata,
        encoding: str,
        settings: CallSettings,
        calls: set[Call],
    ) -> None:
        self._stream = stream
        self._conn = conn
        self.path = path
        self._method = method
        self._metadata = metadata
        self._encoding = encoding
        self._settings = settings
        self._calls = calls
        self._loop = asyncio.get_running_loop()
        self.task: asyncio.Task[None] | None = None
        self._deadline: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        # Receiving: the message being assembled, complete ones not yet read, and the end.
        self._prefix = b""
        self._parts: list[memoryview] = []
        self._missing = 0
        self._compressed = False
        self._inbox: deque[bytes] = deque()
        self._held = 0
        self._ended = False
        self._waiter: asyncio.Future[None] | None = None
        self._receive_error: _StatusError | None = None
        # Sending.
        self._headers_sent = False
        self._initial: Metadata = ()
        self._trailing: Metadata = ()
        self._code = grpc.StatusCode.OK
        self._details = ""
        self._code_set = False
        # How the call ended, when it did not run to the end.
        self._reset_by_peer = False
        self._expired = False
        self._shutdown = False
        self.identity: Identity | None = None  # who called, where authentication is on

    def start(self, timeout_s: float | None) -> None:
        if timeout_s is not None:
            self._deadline = self._loop.time() + timeout_s
            self._timer = self._loop.call_at(self._deadline, self._expire)
        self._conn.call_started()
        self._calls.add(self)
        self.task = self._loop.create_task(self._run())

    # -- the stream's bytes (StreamOwner) -----------------------------------------------------

    def received(self, chunk: memoryview, end: bool) -> None:
        if self._receive_error is None:
            try:
                self._split(chunk)
            except _StatusError as exc:
                self._receive_error = exc
                self._inbox.clear()
        if self._receive_error is not None or len(self._inbox) < INBOX_MESSAGES:
            self._stream.consumed(len(chunk) + self._held)
            self._held = 0
        else:
            self._held += len(chunk)
        if end:
            self._ended = True
            if (self._parts or self._prefix) and self._receive_error is None:
                self._receive_error = _StatusError(grpc.StatusCode.INTERNAL, "the request ended inside a message")
        self._wake()

    def _split(self, chunk: memoryview) -> None:
        pos, size = 0, len(chunk)
        while pos < size:
            if self._missing == 0:
                take = min(5 - len(self._prefix), size - pos)
                self._prefix += bytes(chunk[pos : pos + take])
                pos += take
                if len(self._prefix) < 5:
                    return
                self._compressed = self._prefix[0] & 1 == 1
                length = int.from_bytes(self._prefix[1:5], "big")
                self._prefix = b""
                if self._compressed and self._encoding == "identity":
                    raise _StatusError(grpc.StatusCode.INTERNAL, "a compressed message without a grpc-encoding")
                if length > self._settings.max_receive_bytes:
                    raise _too_large(length, self._settings.max_receive_bytes)
                if length == 0:
                    self._complete(b"")
                    continue
                self._missing = length
            take = min(self._missing, size - pos)
            self._parts.append(chunk[pos : pos + take])
            self._missing -= take
            pos += take
            if self._missing == 0:
                parts, self._parts = self._parts, []
                self._complete(bytes(parts[0]) if len(parts) == 1 else b"".join(parts))

    def _complete(self, message: bytes) -> None:
        if self._compressed:
            message = _decompress(message, self._encoding, self._settings.max_receive_bytes)
        self._inbox.append(message)

    def reset(self) -> None:
        """The client reset the stream (cancelled the call) or the connection is gone.

        A reset that comes within ``CLIENT_DEADLINE_SLACK_S`` of the deadline is the client's own
        deadline timer: it started on the client's clock before the request reached us, so it
        fires first, by however long the request took to reach us and be read here; the call is
        counted as timed out, as the client counts it.
        """
        self._reset_by_peer = True
        if self._deadline is not None and self._loop.time() >= self._deadline - CLIENT_DEADLINE_SLACK_S:
            self._expire()
        else:
            self._cancel()

    def _expire(self) -> None:
        self._expired = True
        self._cancel(DEADLINE_CANCEL)

    def shut_down(self) -> None:
        """The server's grace period is over: the call ends UNAVAILABLE."""
        self._shutdown = True
        self._cancel()

    def _cancel(self, message: str | None = None) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel(message)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _next(self) -> bytes | None:
        """The next request message, or None at the end of the requests."""
        while not self._inbox:
            if self._receive_error is not None:
                raise self._receive_error
            if self._ended:
                return None
            self._waiter = self._loop.create_future()
            await self._waiter
        message = self._inbox.popleft()
        if self._held and len(self._inbox) < INBOX_MESSAGES:
            self._stream.consumed(self._held)
            self._held = 0
        return message

    def _request(self, message: bytes) -> Any:
        deserialize = self._method.request_deserializer
        if deserialize is None:
            return message
        try:
            return deserialize(message)
        except Exception as exc:
            raise _StatusError(
                grpc.StatusCode.INTERNAL, f"the request message could not be parsed: {type(exc).__name__}"
            ) from None

    def _requests(self) -> _Requests:
        return _Requests(self)

    # -- running the handler ------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            try:
                await self._serve()
            except Aborted:
                pass
            except _StatusError as exc:
                self._set_status(exc.code, exc.details)
            except asyncio.CancelledError:
                if self._reset_by_peer:
                    return
                if self._expired:
                    self._set_status(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
                else:
                    self._set_status(grpc.StatusCode.UNAVAILABLE, "the server is shutting down")
            except Exception as exc:
                if not self._code_set or self._code == grpc.StatusCode.OK:
                    if not isinstance(exc, NotImplementedError):
                        log.exception("unhandled error in gRPC method handler")
                    self._set_status(
                        grpc.StatusCode.UNKNOWN, f"Unexpected error in the method handler: {type(exc).__name__}"
                    )
            send_status(self._stream, self._code, self._details, self._trailing, self._headers_sent)
        finally:
            if self._timer is not None:
                self._timer.cancel()
            self._calls.discard(self)
            self._conn.call_ended()
            if self.identity is not None and self._settings.gate is not None:
                self._settings.gate.release(self.identity)

    async def _serve(self) -> None:
        method = self._method
        if method.request_streaming:
            requests: Any = self._requests()
            handler = method.stream_stream if method.response_streaming else method.stream_unary
        else:
            message = await self._next()
            if message is None:
                raise _StatusError(grpc.StatusCode.INTERNAL, "the call ended without its request message")
            requests = self._request(message)
            handler = method.unary_stream if method.response_streaming else method.unary_unary
        result = handler(requests, self)
        if not method.response_streaming:
            if inspect.isawaitable(result):
                result = await result
            self._send_message(result, flush=False)
            return
        if hasattr(result, "__aiter__"):
            async for reply in result:
                await self.write(reply)
        elif inspect.isawaitable(result):
            await result  # the handler wrote through context.write
        elif result is not None:
            for reply in result:
                await self.write(reply)

    def _send_message(self, reply: Any, flush: bool = True) -> None:
        serialize = self._method.response_serializer
        data = serialize(reply) if serialize is not None else reply
        if len(data) > self._settings.max_send_bytes:
            raise _StatusError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the response ({len(data)} bytes) is over the send limit ({self._settings.max_send_bytes} bytes)",
            )
        self._send_initial(flush=False)
        prefix = b"\0" + len(data).to_bytes(4, "big")
        if len(data) < 65536:
            self._stream.send_data(prefix + bytes(data), flush=flush)
        else:
            self._stream.send_data(prefix, flush=False)
            self._stream.send_data(data, flush=flush)

    def _send_initial(self, flush: bool = True) -> None:
        if not self._headers_sent:
            self._headers_sent = True
            self._stream.send_headers(_response_headers() + _encode_metadata(self._initial), flush=flush)

    def _set_status(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details, self._code_set = code, details, True

    # -- grpc.aio.ServicerContext, the part servicers use -------------------------------------

    def invocation_metadata(self) -> Metadata:
        return self._metadata

    def peer(self) -> str:
        return self._conn.peer

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return 0.0 if self._expired else self._deadline - self._loop.time()

    def cancelled(self) -> bool:
        return self._reset_by_peer or self._expired or self._shutdown

    def done(self) -> bool:
        return self.task is None or self.task.done()

    def set_trailing_metadata(self, metadata: Metadata) -> None:
        self._trailing = tuple(metadata)

    def trailing_metadata(self) -> Metadata:
        return self._trailing

    async def send_initial_metadata(self, metadata: Metadata) -> None:
        if self._headers_sent:
            raise RuntimeError("initial metadata was already sent")
        self._initial = tuple(metadata)
        self._send_initial()

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code, self._code_set = code, True

    def set_details(self, details: str) -> None:
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Metadata = ()) -> None:
        if code == grpc.StatusCode.OK:
            raise ValueError("abort with status OK")
        self._set_status(code, details)
        if trailing_metadata:
            self._trailing = tuple(trailing_metadata)
        raise Aborted(details)

    async def write(self, message: Any) -> None:
        self._send_message(message)
        await self._stream.drain()

    async def read(self) -> Any:
        message = await self._next()
        return grpc.aio.EOF if message is None else self._request(message)


class _Requests:
    """A client-streaming call's request messages, parsed as the handler reads them. A class, not an
    async generator: mypyc compiles this module and has no async generators."""

    def __init__(self, call: Call) -> None:
        self._call = call

    def __aiter__(self) -> _Requests:
        return self

    async def __anext__(self) -> Any:
        message = await self._call._next()
        if message is None:
            raise StopAsyncIteration
        return self._call._request(message)


def send_status(
    stream: CallStream, code: grpc.StatusCode, details: str, metadata: Metadata, headers_sent: bool
) -> None:
    """The call's trailers (or, with nothing sent yet, a trailers-only answer); ends the stream."""
    fields = [] if headers_sent else _response_headers()
    fields.append(("grpc-status", str(code.value[0])))
    if details:
        fields.append(("grpc-message", _percent_encode(details)))
    stream.send_headers(fields + _encode_metadata(metadata), end_stream=True)


def _response_headers() -> Headers:
    return [(":status", "200"), ("content-type", "application/grpc"), ("grpc-accept-encoding", ACCEPT_ENCODING)]


def _encode_metadata(metadata: Metadata) -> Headers:
    out: Headers = []
    for key, value in metadata:
        key = key.lower()
        if key.endswith("-bin"):
            raw = value if isinstance(value, bytes) else value.encode()
            out.append((key, base64.b64encode(raw).decode("ascii").rstrip("=")))
        else:
            out.append((key, value.decode("latin-1") if isinstance(value, bytes) else value))
    return out


def _metadata_value(name: str, value: str) -> str | bytes:
    if not name.endswith("-bin"):
        return value
    try:
        return base64.b64decode(value + "=" * (-len(value) % 4))
    except ValueError:
        return value.encode()


def _timeout_s(value: str | None) -> float | None:
    if value is None:
        return None
    match = _TIMEOUT.match(value)
    if match is None:
        raise _StatusError(grpc.StatusCode.INVALID_ARGUMENT, f"malformed grpc-timeout {value[:16]!r}")
    return int(match.group(1)) * _TIMEOUT_UNITS[match.group(2)]


def _percent_encode(text: str) -> str:
    """grpc-message's encoding: printable ASCII but '%' as is, everything else %XX of its UTF-8."""
    if all(" " <= ch <= "~" and ch != "%" for ch in text):
        return text
    return "".join(
        chr(byte) if 0x20 <= byte <= 0x7E and byte != 0x25 else f"%{byte:02X}" for byte in text.encode("utf-8")
    )


def _too_large(length: int, limit: int) -> _StatusError:
    return _StatusError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"Received message larger than max ({length} vs. {limit})")


def _decompress(message: bytes, encoding: str, limit: int) -> bytes:
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(message, limit + 1)
    except zlib.error:
        raise _StatusError(grpc.StatusCode.INTERNAL, f"the message is not valid {encoding}") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise _too_large(len(out) + len(inflater.unconsumed_tail), limit)
    return out
