"""The gRPC transport (tensorgate's HTTP/2 on the event loop) on its own, with test services, in this process.

grpcio's client checks that real clients get what gRPC specifies: deadlines, cancellation,
metadata, compression, streaming, messages larger than every flow-control window. Raw frames
(read back with hyperframe, an HTTP/2 implementation that is not ours) check what a hostile or
broken client gets: a clear refusal that ends at its own stream or connection, never the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
from hpack import Decoder, Encoder
from hyperframe.frame import Frame, GoAwayFrame, HeadersFrame, PingFrame, RstStreamFrame, SettingsFrame

from tensorgate.errors import DEADLINE_CANCEL
from tensorgate.protocols.grpc.call import CLIENT_DEADLINE_SLACK_S, CallSettings
from tensorgate.protocols.grpc.http2 import frames as f
from tensorgate.protocols.grpc.http2.connection import Http2Limits
from tensorgate.protocols.grpc.methods import MethodTable
from tensorgate.protocols.grpc.server import GrpcServer

MAX_MESSAGE = 32 * 1024 * 1024


class EchoService:
    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.started = asyncio.Event()
        self.sleeping = 0
        self.most_sleeping = 0  # the most handlers running at once
        self.cancel_args: tuple[Any, ...] = ()
        self.remaining_at_cancel: float | None = None
        self.deadline_at: float | None = None  # the last sleeping call's deadline, on the loop's clock

    async def unary(self, request: bytes, context: Any) -> bytes:
        metadata = dict(context.invocation_metadata())
        if "sleep" in metadata:
            remaining = context.time_remaining()
            self.deadline_at = None if remaining is None else asyncio.get_running_loop().time() + remaining
            self.started.set()
            self.sleeping += 1
            self.most_sleeping = max(self.most_sleeping, self.sleeping)
            try:
                await asyncio.sleep(float(metadata["sleep"]))
            except asyncio.CancelledError as exc:
                self.cancel_args = exc.args
                self.remaining_at_cancel = context.time_remaining()
                self.cancelled.set()
                raise
            finally:
                self.sleeping -= 1
        if "abort" in metadata:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.decode(), (("why-bin", b"\x00\xff"),))
        context.set_trailing_metadata((("echo-bin", metadata.get("echo-bin", b"")), ("seen", "yes")))
        return request

    async def server_stream(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        count, size = struct.unpack(">II", request)
        for index in range(count):
            yield bytes([index % 256]) * size

    async def bidi(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request[::-1]


def _table(service: EchoService) -> MethodTable:
    table = MethodTable()
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(service.unary),
        "ServerStream": grpc.unary_stream_rpc_method_handler(service.server_stream),
        "Bidi": grpc.stream_stream_rpc_method_handler(service.bidi),
    }
    table.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Echo", handlers),))
    return table


@pytest.fixture()
async def served() -> AsyncIterator[tuple[EchoService, int]]:
    limits = Http2Limits(
        max_concurrent_streams=8, stream_window=1 << 20, connection_window=4 << 20, preface_timeout_s=0.5
    )
    async with _served_with(limits) as served:
        yield served


@pytest.fixture()
async def channel(served: tuple[EchoService, int]) -> AsyncIterator[grpc.aio.Channel]:
    options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{served[1]}", options=options) as channel:
        yield channel


Connect = Callable[..., Awaitable["RawClient"]]


@pytest.fixture()
async def raw(served: tuple[EchoService, int]) -> AsyncIterator[Connect]:
    """Opens raw connections to the served port, and closes them at the end."""
    clients: list[RawClient] = []

    async def connect(preface: bytes = f.PREFACE + f.settings({})) -> RawClient:
        clients.append(await RawClient.connect(served[1], preface))
        return clients[-1]

    yield connect
    for client in clients:
        client.writer.close()
        with contextlib.suppress(OSError):
            await client.writer.wait_closed()


def _unary(channel: grpc.aio.Channel) -> Any:
    return channel.unary_unary("/test.Echo/Unary")


# -- what a gRPC client sees --------------------------------------------------------------------


async def test_a_message_larger_than_every_window_goes_both_ways(channel: grpc.aio.Channel) -> None:
    message = bytes(range(256)) * (20 * 1024 * 1024 // 256)  # 20 MiB: 20 stream windows, 5 connection ones
    assert await _unary(channel)(message, timeout=60) == message


async def test_metadata_and_trailers_round_trip(channel: grpc.aio.Channel) -> None:
    call = _unary(channel)(b"x", metadata=(("echo-bin", b"\x01\x02\xfe"),), timeout=10)
    assert await call == b"x"
    trailers = dict(await call.trailing_metadata())
    assert trailers["echo-bin"] == b"\x01\x02\xfe" and trailers["seen"] == "yes"


async def test_an_abort_carries_its_code_text_and_trailers(channel: grpc.aio.Channel) -> None:
    reason = "bad input: 100% wrong ✓"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _unary(channel)(reason.encode(), metadata=(("abort", "1"),), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == reason
    assert dict(info.value.trailing_metadata())["why-bin"] == b"\x00\xff"


async def test_the_deadline_cancels_the_handler(served: tuple[EchoService, int], channel: grpc.aio.Channel) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _unary(channel)(b"x", metadata=(("sleep", "30"),), timeout=0.2)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await asyncio.wait_for(served[0].cancelled.wait(), 10)


async def test_a_cancelled_call_cancels_the_handler(served: tuple[EchoService, int], channel: grpc.aio.Channel) -> None:
    call = _unary(channel)(b"x", metadata=(("sleep", "30"),), timeout=30)
    await asyncio.wait_for(served[0].started.wait(), 10)
    call.cancel()
    await asyncio.wait_for(served[0].cancelled.wait(), 10)
    assert await _unary(channel)(b"next", timeout=10) == b"next"


async def test_over_the_receive_limit_is_resource_exhausted_and_the_connection_goes_on(
    channel: grpc.aio.Channel,
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _unary(channel)(b"\0" * (MAX_MESSAGE + 1), timeout=60)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert await _unary(channel)(b"after", timeout=10) == b"after"


async def test_compressed_requests_are_accepted(channel: grpc.aio.Channel) -> None:
    message = b"compress me " * 10_000
    for algorithm in (grpc.Compression.Gzip, grpc.Compression.Deflate):
        assert await _unary(channel)(message, compression=algorithm, timeout=10) == message


async def test_an_unserved_method_is_unimplemented(channel: grpc.aio.Channel) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await channel.unary_unary("/test.Echo/Nope")(b"x", timeout=10)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_server_streaming_paces_to_the_clients_window(channel: grpc.aio.Channel) -> None:
    replies = [r async for r in channel.unary_stream("/test.Echo/ServerStream")(struct.pack(">II", 40, 1 << 20))]
    assert [len(r) for r in replies] == [1 << 20] * 40
    assert [r[0] for r in replies] == list(range(40))


async def test_a_bidirectional_stream_answers_in_order(channel: grpc.aio.Channel) -> None:
    messages = [f"message {i}".encode() * (i + 1) for i in range(200)]

    async def requests() -> AsyncIterator[bytes]:
        for message in messages:
            yield message

    replies = [r async for r in channel.stream_stream("/test.Echo/Bidi")(requests(), timeout=30)]
    assert replies == [m[::-1] for m in messages]


# -- what a broken or hostile client gets -------------------------------------------------------


class RawClient:
    """Frames written by hand; the server's read back with hyperframe."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.encoder = Encoder()
        self.ended = False  # the server closed the connection

    @classmethod
    async def connect(cls, port: int, preface: bytes) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(preface)
        return cls(reader, writer)

    def headers(self, stream_id: int, path: str = "/test.Echo/Unary", **fields: str) -> None:
        block = self.encoder.encode(
            [
                *((":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "t"), ("te", "trailers")),
                ("content-type", "application/grpc"),
                *((k.replace("_", "-"), v) for k, v in fields.items()),
            ]
        )
        self.writer.write(f.frame(f.HEADERS, f.END_HEADERS, stream_id, block))

    def message(self, stream_id: int, payload: bytes) -> None:
        self.writer.write(f.frame(f.DATA, f.END_STREAM, stream_id, b"\0" + struct.pack(">I", len(payload)) + payload))

    async def frames_until(self, wanted: type[Frame]) -> list[Frame]:
        """Frames the server sends, up to the first of type ``wanted`` (or the connection's end)."""
        seen: list[Frame] = []
        async with asyncio.timeout(10):
            while True:
                try:
                    head = await self.reader.readexactly(9)
                except (asyncio.IncompleteReadError, ConnectionResetError):
                    self.ended = True
                    return seen
                frame, length = Frame.parse_frame_header(memoryview(head))
                frame.parse_body(memoryview(await self.reader.readexactly(length)))
                seen.append(frame)
                if isinstance(frame, wanted):
                    return seen


async def _still_serves(channel: grpc.aio.Channel) -> None:
    assert await _unary(channel)(b"still here", timeout=10) == b"still here"


async def test_a_client_that_is_not_http2_is_closed(
    served: tuple[EchoService, int], channel: grpc.aio.Channel, raw: Connect
) -> None:
    client = await raw(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    frames = await client.frames_until(GoAwayFrame)
    assert isinstance(frames[-1], GoAwayFrame) and frames[-1].error_code == f.ErrorCode.PROTOCOL_ERROR
    await _still_serves(channel)


async def test_a_connection_that_sends_nothing_is_closed(raw: Connect) -> None:
    client = await raw(b"")
    frames = await client.frames_until(GoAwayFrame)  # after the fixture's 0.5 s without a preface
    assert isinstance(frames[-1], GoAwayFrame) and frames[-1].error_code == f.ErrorCode.PROTOCOL_ERROR
    assert await client.reader.read() == b""


async def test_pings_are_answered(served: tuple[EchoService, int], raw: Connect) -> None:
    client = await raw()
    client.writer.write(f.frame(f.PING, 0, 0, b"12345678"))
    frames = await client.frames_until(PingFrame)
    assert frames[-1].opaque_data == b"12345678" and "ACK" in frames[-1].flags


async def test_a_grpc_call_over_raw_frames(served: tuple[EchoService, int], raw: Connect) -> None:
    client = await raw()
    client.headers(1)
    client.message(1, b"hello")
    frames = await _until_trailers(client)
    statuses = [frame for frame in frames if isinstance(frame, HeadersFrame)]
    assert len(statuses) == 2  # headers, then trailers ending the stream
    assert "END_STREAM" in statuses[-1].flags


async def test_a_reset_long_before_the_deadline_is_a_cancel(served: tuple[EchoService, int], raw: Connect) -> None:
    service = served[0]
    client = await raw()
    client.headers(1, sleep="30", grpc_timeout="10S")
    client.message(1, b"x")
    await asyncio.wait_for(service.started.wait(), 10)
    client.writer.write(f.rst_stream(1, f.ErrorCode.CANCEL))
    await asyncio.wait_for(service.cancelled.wait(), 10)
    assert DEADLINE_CANCEL not in service.cancel_args
    assert service.remaining_at_cancel is not None and service.remaining_at_cancel > 1


async def test_a_reset_just_before_the_deadline_is_the_deadline(served: tuple[EchoService, int], raw: Connect) -> None:
    """A client's deadline timer starts before its request reaches the server, so its reset comes
    first; the server counts it as the deadline (``CLIENT_DEADLINE_SLACK_S``). Had the server's own
    timer fired first, the outcome would be the same."""
    service = served[0]
    client = await raw()
    client.headers(1, sleep="30", grpc_timeout="1S")
    client.message(1, b"x")
    await asyncio.wait_for(service.started.wait(), 10)
    # Reset a little before the server's deadline, as a client's timer would; timed from the
    # deadline the server holds, so however late the request was read, the reset is inside the slack.
    assert service.deadline_at is not None
    await asyncio.sleep(max(0.0, service.deadline_at - CLIENT_DEADLINE_SLACK_S / 2 - asyncio.get_running_loop().time()))
    client.writer.write(f.rst_stream(1, f.ErrorCode.CANCEL))
    await asyncio.wait_for(service.cancelled.wait(), 10)
    assert DEADLINE_CANCEL in service.cancel_args
    assert service.remaining_at_cancel == 0.0


async def _until_trailers(client: RawClient) -> list[Frame]:
    frames: list[Frame] = []
    while not frames or not (isinstance(frames[-1], HeadersFrame) and "END_STREAM" in frames[-1].flags):
        frames += await client.frames_until(HeadersFrame)
    return frames


@pytest.mark.parametrize(
    ("name", "frame", "code"),
    [
        ("push promise", f.frame(f.PUSH_PROMISE, f.END_HEADERS, 1, b"\0\0\0\2"), f.ErrorCode.PROTOCOL_ERROR),
        ("ping of 7 bytes", f.frame(f.PING, 0, 0, b"1234567"), f.ErrorCode.FRAME_SIZE_ERROR),
        ("window update of 0", f.window_update(0, 0), f.ErrorCode.PROTOCOL_ERROR),
        ("data on stream 0", f.frame(f.DATA, 0, 0, b"x"), f.ErrorCode.PROTOCOL_ERROR),
        ("data on a stream never opened", f.frame(f.DATA, 0, 5, b"x"), f.ErrorCode.PROTOCOL_ERROR),
        ("continuation alone", f.frame(f.CONTINUATION, f.END_HEADERS, 1, b""), f.ErrorCode.PROTOCOL_ERROR),
        ("an even stream id", f.frame(f.HEADERS, f.END_HEADERS, 2, b"\x83"), f.ErrorCode.PROTOCOL_ERROR),
        (
            "a header block hpack cannot read",
            f.frame(f.HEADERS, f.END_HEADERS, 1, b"\xff\xff\xff\xff"),
            f.ErrorCode.COMPRESSION_ERROR,
        ),
        (
            "an endless header block",
            f.frame(f.HEADERS, 0, 1, b"\x83") + f.frame(f.CONTINUATION, 0, 1, b"\0" * 9000) * 2,
            f.ErrorCode.ENHANCE_YOUR_CALM,
        ),
        ("settings on a stream", f.frame(f.SETTINGS, 0, 1, b""), f.ErrorCode.PROTOCOL_ERROR),
        ("a control frame of 20 kB", f.header(f.SETTINGS, 0, 0, 20_000), f.ErrorCode.FRAME_SIZE_ERROR),
    ],
)
async def test_protocol_errors_end_only_that_connection(
    served: tuple[EchoService, int],
    channel: grpc.aio.Channel,
    name: str,
    frame: bytes,
    code: f.ErrorCode,
    raw: Connect,
) -> None:
    client = await raw()
    client.writer.write(frame)
    frames = await client.frames_until(GoAwayFrame)
    assert isinstance(frames[-1], GoAwayFrame), (name, frames)
    assert frames[-1].error_code == code, name
    await _still_serves(channel)


async def test_data_over_the_stream_window_resets_that_stream(
    served: tuple[EchoService, int], channel: grpc.aio.Channel, raw: Connect
) -> None:
    client = await raw()
    client.headers(1)
    size = (1 << 20) + 1000  # the fixture's stream window is 1 MiB
    client.writer.write(f.frame(f.DATA, 0, 1, b"\0" + struct.pack(">I", size) + b"\0" * size))
    frames = await client.frames_until(RstStreamFrame)
    assert frames[-1].stream_id == 1 and frames[-1].error_code == f.ErrorCode.FLOW_CONTROL_ERROR
    await _still_serves(channel)


async def test_streams_over_the_limit_are_refused(
    served: tuple[EchoService, int], channel: grpc.aio.Channel, raw: Connect
) -> None:
    client = await raw()
    for stream_id in range(1, 19, 2):  # nine calls; the fixture allows eight at once per connection
        client.headers(stream_id, sleep="30")
        client.message(stream_id, b"x")
    frames = await client.frames_until(RstStreamFrame)
    assert (frames[-1].stream_id, frames[-1].error_code) == (17, f.ErrorCode.REFUSED_STREAM)
    assert served[0].most_sleeping == 8
    await _still_serves(channel)  # another connection has its own eight


async def test_opening_and_resetting_streams_in_a_loop_stays_within_the_limit(
    served: tuple[EchoService, int], channel: grpc.aio.Channel, raw: Connect
) -> None:
    # HTTP/2 "rapid reset" (CVE-2023-44487): a call counts against the limit until its handler has
    # ended, not only until its client reset it, so resets cannot pile up work.
    service = served[0]
    client = await raw()
    for stream_id in range(1, 4001, 2):
        client.headers(stream_id, sleep="30")
        client.message(stream_id, b"x")
        client.writer.write(f.rst_stream(stream_id, f.ErrorCode.CANCEL))
    with contextlib.suppress(ConnectionResetError):
        await client.writer.drain()
    frames = await client.frames_until(GoAwayFrame)  # refused past a bound, or read to the end
    refused = [x for x in frames if isinstance(x, RstStreamFrame) and x.error_code == f.ErrorCode.REFUSED_STREAM]
    calm = [x for x in frames if isinstance(x, GoAwayFrame) and x.error_code == f.ErrorCode.ENHANCE_YOUR_CALM]
    # Closing on a client still writing resets the socket, which can discard the GOAWAY before it is
    # read; here only ENHANCE_YOUR_CALM closes the connection.
    assert refused or calm or client.ended
    assert service.most_sleeping <= 8
    await _still_serves(channel)


async def test_a_wrong_method_or_content_type_is_an_http_error(served: tuple[EchoService, int], raw: Connect) -> None:
    client = await raw()
    block = client.encoder.encode(
        [(":method", "GET"), (":scheme", "http"), (":path", "/test.Echo/Unary"), (":authority", "t")]
    )
    client.writer.write(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, block))
    client.headers(3, content_type="application/json")
    headers = [frame for frame in await _until_trailers(client) if isinstance(frame, HeadersFrame)]
    headers += [frame for frame in await _until_trailers(client) if isinstance(frame, HeadersFrame)]
    decoder = Decoder()
    statuses = {frame.stream_id: dict(decoder.decode(frame.data))[":status"] for frame in headers}
    assert statuses == {1: "405", 3: "415"}


# -- idle connections and the client's GOAWAY ---------------------------------------------------


@contextlib.asynccontextmanager
async def _served_with(limits: Http2Limits) -> AsyncIterator[tuple[EchoService, int]]:
    service = EchoService()
    server = GrpcServer(_table(service), CallSettings(MAX_MESSAGE, MAX_MESSAGE), limits)
    port = await server.start("127.0.0.1", 0)
    try:
        yield service, port
    finally:
        await server.stop(1.0)


def _status(frames: list[Frame]) -> str | None:
    """The grpc-status of the trailers among ``frames``."""
    decoder = Decoder()
    status = None
    for frame in frames:
        if isinstance(frame, HeadersFrame):
            fields = dict(decoder.decode(frame.data))
            status = fields.get("grpc-status", status)
    return status


async def test_a_connection_idle_past_the_timeout_gets_goaway_and_is_closed() -> None:
    async with _served_with(Http2Limits(idle_timeout_s=0.2)) as (_, port):
        client = await RawClient.connect(port, f.PREFACE + f.settings({}))
        client.headers(1)
        client.message(1, b"hello")
        assert _status(await _until_trailers(client)) == "0"
        frames = await client.frames_until(GoAwayFrame)  # once idle for 0.2 s
        assert isinstance(frames[-1], GoAwayFrame) and frames[-1].error_code == f.ErrorCode.NO_ERROR
        assert frames[-1].last_stream_id == 1
        assert await client.reader.read() == b""
        client.writer.close()


async def test_a_call_open_past_the_idle_timeout_keeps_its_connection() -> None:
    async with _served_with(Http2Limits(idle_timeout_s=0.2)) as (service, port):
        client = await RawClient.connect(port, f.PREFACE + f.settings({}))
        client.headers(1, sleep="0.6", grpc_timeout="10S")  # three idle timeouts long
        client.message(1, b"x")
        frames = await _until_trailers(client)
        assert not any(isinstance(frame, GoAwayFrame) for frame in frames)
        assert _status(frames) == "0" and service.most_sleeping == 1
        assert isinstance((await client.frames_until(GoAwayFrame))[-1], GoAwayFrame)  # idle after it
        client.writer.close()


async def test_the_clients_goaway_lets_its_open_call_finish_then_closes() -> None:
    async with _served_with(Http2Limits(idle_timeout_s=None)) as (service, port):
        client = await RawClient.connect(port, f.PREFACE + f.settings({}))
        client.headers(1, sleep="0.2", grpc_timeout="10S")
        client.message(1, b"x")
        await asyncio.wait_for(service.started.wait(), 10)
        client.writer.write(f.goaway(0, f.ErrorCode.NO_ERROR))
        client.headers(3)  # after its own GOAWAY: ignored
        client.message(3, b"y")
        frames = await client.frames_until(GoAwayFrame)  # none comes: the connection ends instead
        assert client.ended and not any(isinstance(frame, GoAwayFrame) for frame in frames)
        assert _status(frames) == "0"
        assert {frame.stream_id for frame in frames if isinstance(frame, HeadersFrame)} == {1}
        client.writer.close()


# -- shutdown and pauses: nothing a client has sent is dropped -----------------------------------


async def test_a_call_sent_across_the_first_goaway_is_served() -> None:
    service = EchoService()
    server = GrpcServer(_table(service), CallSettings(MAX_MESSAGE, MAX_MESSAGE), Http2Limits())
    port = await server.start("127.0.0.1", 0)
    client = await RawClient.connect(port, f.PREFACE + f.settings({}))
    await client.frames_until(SettingsFrame)  # the connection is up
    stopping = asyncio.create_task(server.stop(5.0))
    first = (await client.frames_until(GoAwayFrame))[-1]
    assert first.last_stream_id == f.MAX_STREAM_ID  # no new streams, but what is on its way is taken
    client.headers(1)  # a call that crossed the GOAWAY, as a proxy's would
    client.message(1, b"crossed")
    frames = await client.frames_until(GoAwayFrame)
    assert _status(frames) == "0"
    assert frames[-1].last_stream_id == 1  # the final GOAWAY names the call it took
    await stopping
    client.writer.close()


async def test_a_paused_server_serves_the_connections_queued_and_refuses_new_ones() -> None:
    service = EchoService()
    server = GrpcServer(_table(service), CallSettings(MAX_MESSAGE, MAX_MESSAGE), Http2Limits())
    port = await server.start("127.0.0.1", 0)
    try:
        # Connected by the kernel, not yet accepted by the loop (nothing awaited in between): the
        # pause must take it, as its client may already have sent a call.
        queued = socket.create_connection(("127.0.0.1", port))
        server.pause()
        assert not server.accepting
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port)).close()
        queued.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=queued)
        writer.write(f.PREFACE + f.settings({}))
        client = RawClient(reader, writer)
        client.headers(1)
        client.message(1, b"queued")
        assert _status(await _until_trailers(client)) == "0"
        writer.close()
        await server.resume()  # the same port again
        client = await RawClient.connect(port, f.PREFACE + f.settings({}))
        client.headers(1)
        client.message(1, b"again")
        assert _status(await _until_trailers(client)) == "0"
        client.writer.close()
    finally:
        await server.stop(1.0)
