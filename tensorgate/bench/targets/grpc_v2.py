"""KServe V2 over gRPC: messages from tensorgate's own generated stubs.

Requests are built as ``ModelInferRequest`` with ``raw_input_contents`` and serialized once at
start-up; the hot path sends those bytes, for the same reason the HTTP targets keep bytes: the
client must not be the bottleneck. ``grpc`` calls ``ModelInfer`` once per request with the lean
client of :mod:`tensorgate.bench.grpc_client` and reads only the status; ``grpc-stream`` sends each
request as a message of a ``ModelStreamInfer`` stream (tritonclient's ``async_stream_infer``,
perf_analyzer's ``--streaming``) with ``grpc.aio`` and reads its answer's ``error_message``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tensorgate.bench.grpc_client import GrpcConnection, connect, framed
from tensorgate.bench.hang_up import hang_up
from tensorgate.bench.inputs import RequestTensors, TensorMeta
from tensorgate.bench.targets.base import Endpoint, Outcome
from tensorgate.bench.targets.encoding import raw_bytes

INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"
STREAM_METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"
_MAX_MESSAGE = 1 << 30


def stubs() -> tuple[Any, Any]:
    # The same wire messages as Triton's and KServe's (a test pins them against tritonclient's).
    from tensorgate.protocols.grpc.generated import grpc_service_pb2, grpc_service_pb2_grpc

    return grpc_service_pb2, grpc_service_pb2_grpc


def infer_request_bytes(model: str, version: str | None, tensors: RequestTensors) -> bytes:
    """A serialized ``inference.ModelInferRequest`` with every input in ``raw_input_contents``."""
    service_pb2, _ = stubs()
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version or "")
    for tensor in tensors:
        entry = request.inputs.add()
        entry.name = tensor.name
        entry.datatype = tensor.datatype
        entry.shape.extend(tensor.array.shape)
        request.raw_input_contents.append(raw_bytes(tensor))
    return bytes(request.SerializeToString())


def open_channel(endpoint: Endpoint, own_connection: bool = False) -> Any:
    import grpc

    options = [("grpc.max_send_message_length", _MAX_MESSAGE), ("grpc.max_receive_message_length", _MAX_MESSAGE)]
    if own_connection:  # channels with equal arguments otherwise share one connection (grpc's global pool)
        options.append(("grpc.use_local_subchannel_pool", 1))
    if endpoint.tls:
        root = None if endpoint.ca_file is None else Path(endpoint.ca_file).read_bytes()
        credentials = grpc.ssl_channel_credentials(root_certificates=root)
        return grpc.aio.secure_channel(endpoint.authority, credentials, options=options)
    return grpc.aio.insecure_channel(endpoint.authority, options=options)


def call_metadata(endpoint: Endpoint) -> tuple[tuple[str, str], ...]:
    return tuple((name.lower(), value) for name, value in endpoint.request_headers)


async def fetch_metadata(endpoint: Endpoint, model: str, version: str | None, timeout_s: float) -> list[TensorMeta]:
    """The model's inputs from ``ModelMetadata``, for servers that speak only gRPC."""
    import grpc

    service_pb2, service_pb2_grpc = stubs()
    channel = open_channel(endpoint)
    try:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        reply = await stub.ModelMetadata(
            service_pb2.ModelMetadataRequest(name=model, version=version or ""),
            timeout=timeout_s,
            metadata=call_metadata(endpoint),
        )
    except grpc.aio.AioRpcError as exc:
        raise RuntimeError(
            f"cannot fetch model metadata over gRPC from {endpoint.authority}: {exc.code().name} {exc.details()}"
        ) from exc
    finally:
        await channel.close()
    return [TensorMeta(i.name, i.datatype.upper(), tuple(int(d) for d in i.shape)) for i in reply.inputs]


class GrpcTarget:
    """Sends pre-serialized ``ModelInfer`` calls with :mod:`tensorgate.bench.grpc_client`, one at a
    time per connection; a non-OK status becomes ``grpc CODE``.

    Connections are handed out one call at a time like the HTTP targets' keep-alive connections: a
    closed loop of ``c`` workers is ``c`` clients on ``c`` connections, as it is over HTTP, and an
    open loop opens as many as it has calls outstanding. (One connection shared by every call would
    push them all through one connection, which grpc servers serve one frame at a time on one
    thread; Triton's C++ client, for the same reason, stops sharing a channel past a few clients.)
    """

    def __init__(self, endpoint: Endpoint, requests: Sequence[bytes]) -> None:
        if not requests:
            raise ValueError("no requests to send")
        self._endpoint = endpoint
        self._requests = [framed(request) for request in requests]
        self._idle: list[GrpcConnection] = []
        self._all: list[GrpcConnection] = []

    async def call(self, index: int) -> Outcome:
        if self._idle:
            connection = self._idle.pop()
        else:
            connection = await connect(self._endpoint)
            self._all.append(connection)
        try:
            status = await connection.call(INFER_METHOD, self._requests[index % len(self._requests)])
        finally:
            # A cancelled call's stream was reset; its connection carries the next call.
            if connection.usable:
                self._idle.append(connection)
            else:
                self._all.remove(connection)
                if connection.transport is not None:
                    connection.transport.close()
        if status.code == 0:
            return Outcome()
        return Outcome(f"grpc {STATUS_NAMES.get(status.code, 'UNKNOWN')}")

    async def aclose(self) -> None:
        connections = list(self._all)
        self._all.clear()
        self._idle.clear()
        await hang_up(connections)


# grpc-status numbers to grpc.StatusCode names; NO_STATUS (a reset stream, no status) is its own.
STATUS_NAMES = {
    -1: "NO_STATUS",
    **dict(
        enumerate(
            [
                "OK",
                "CANCELLED",
                "UNKNOWN",
                "INVALID_ARGUMENT",
                "DEADLINE_EXCEEDED",
                "NOT_FOUND",
                "ALREADY_EXISTS",
                "PERMISSION_DENIED",
                "RESOURCE_EXHAUSTED",
                "FAILED_PRECONDITION",
                "ABORTED",
                "OUT_OF_RANGE",
                "UNIMPLEMENTED",
                "INTERNAL",
                "UNAVAILABLE",
                "DATA_LOSS",
                "UNAUTHENTICATED",
            ]
        )
    ),
}


class GrpcStreamTarget:
    """Sends each request on a ``ModelStreamInfer`` stream and waits for its answer before the stream
    carries another: one stream per call in flight, each on its own connection (as
    :class:`GrpcTarget`'s channels), kept open from call to call.

    A request's answer ends with the one marked ``triton_final_response``, where the server marks
    them (Triton's decoupled models answer a request several times; tensorgate marks its one
    answer), else with the first. A stream whose call did not end with its last answer (the stream
    failed, or the runner cancelled the call at its timeout) is closed, never reused: an answer
    still on its way would otherwise be read as the next request's. Its connection is kept for the
    next stream. A failed request answers with ``error_message`` and its stream goes on, as
    Triton's and tensorgate's servers do.
    """

    def __init__(self, endpoint: Endpoint, requests: Sequence[bytes]) -> None:
        if not requests:
            raise ValueError("no requests to send")
        self._endpoint = endpoint
        self._requests = list(requests)
        self._channels: list[Any] = []
        self._answer = stubs()[0].ModelStreamInferResponse
        self._idle: list[tuple[Any, Any]] = []  # (channel, stream) with no request in flight
        self._spare: list[Any] = []  # channels whose stream was closed
        self._streams: set[Any] = set()  # every stream opened and not yet closed

    def _open(self) -> tuple[Any, Any]:
        if self._spare:
            channel = self._spare.pop()
        else:
            channel = open_channel(self._endpoint, own_connection=True)
            self._channels.append(channel)
        # No request serializer (the requests are bytes); answers are parsed for error_message.
        stream = channel.stream_stream(STREAM_METHOD, response_deserializer=self._answer.FromString)(
            metadata=call_metadata(self._endpoint)
        )
        self._streams.add(stream)
        return channel, stream

    async def call(self, index: int) -> Outcome:
        channel, stream = self._idle.pop() if self._idle else self._open()
        reusable = False
        try:
            outcome, reusable = await exchange(stream, self._requests[index % len(self._requests)])
        finally:
            if reusable:
                self._idle.append((channel, stream))
            else:
                self._streams.discard(stream)
                stream.cancel()
                self._spare.append(channel)
        return outcome

    async def aclose(self) -> None:
        for stream in self._streams:
            stream.cancel()
        for channel in self._channels:
            await channel.close()


async def exchange(stream: Any, request: Any) -> tuple[Outcome, bool]:
    """One request on a kept ``ModelStreamInfer`` stream, its answers read up to its final one: the
    outcome, and whether the stream may carry the next request (not when it ended or failed
    part-way: an answer may still be on its way, and must never be read as the next request's)."""
    import grpc

    failed = False
    try:
        await stream.write(request)
        while True:
            answer = await stream.read()
            if answer is grpc.aio.EOF:  # the server ended the stream without answering
                return Outcome("grpc stream ended"), False
            failed = failed or bool(answer.error_message)
            if is_final(answer):
                return Outcome("grpc stream error" if failed else None), True
    except grpc.aio.AioRpcError as exc:
        return Outcome(f"grpc {exc.code().name}"), False


def is_final(answer: Any) -> bool:
    """Whether ``answer`` is its request's last: marked so, or from a server that marks none."""
    flag = answer.infer_response.parameters.get("triton_final_response")
    return flag is None or bool(flag.bool_param)
