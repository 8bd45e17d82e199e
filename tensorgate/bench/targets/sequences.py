"""Targets for sequences: each concurrent sequence (a *slot*) has a connection of its own, as each
speaker's device would, and sends its chunks one after another on it.

- ``grpc-stream``: one ``ModelStreamInfer`` stream per slot (tritonclient's ``start_stream`` and
  ``async_stream_infer``), kept from one sequence to the next; a chunk's answer is read from the
  stream before the slot sends its next chunk. A stream that failed, or whose chunk timed out (its
  answer may still come), is closed and the slot opens another.
- ``grpc``: unary ``ModelInfer`` calls on the slot's connection (:mod:`tensorgate.bench.grpc_client`).
- ``v2-binary``, ``v2-json``: HTTP/1.1 keep-alive, one connection per slot.

Connections are opened by :meth:`open` before the run's clock starts, so no chunk's latency holds
a connection's set-up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from tensorgate.bench.grpc_client import GrpcConnection, connect
from tensorgate.bench.hang_up import hang_up
from tensorgate.bench.http_client import HttpConnection
from tensorgate.bench.inputs import RequestTensors
from tensorgate.bench.targets.base import Endpoint, Outcome
from tensorgate.bench.targets.grpc_v2 import (
    INFER_METHOD,
    STATUS_NAMES,
    STREAM_METHOD,
    call_metadata,
    exchange,
    open_channel,
    stubs,
)
from tensorgate.bench.targets.sequence_encoding import GrpcChunks, HttpChunks, SequenceId

SEQUENCE_PROTOCOLS = ("grpc-stream", "grpc", "v2-binary", "v2-json")


class SequenceTarget(Protocol):
    """A protocol client bound to one model, sending the chunks of sequences from numbered slots.

    The driver calls :meth:`send` from one task per slot, one chunk at a time per slot, each chunk
    after the slot's previous one was answered. ``variant`` picks a request variant (cycled).
    Failures come back as an :class:`Outcome`; OSError or ConnectionLost may be raised for a lost
    connection, which the driver counts.
    """

    async def open(self, slots: int) -> None:
        """Connect ``slots`` slots before the run starts."""
        ...

    async def send(self, slot: int, variant: int, sequence_id: SequenceId, start: bool, end: bool) -> Outcome: ...

    async def aclose(self) -> None: ...


class GrpcStreamSequences:
    def __init__(self, endpoint: Endpoint, model: str, version: str | None, variants: Sequence[RequestTensors]):
        self._endpoint = endpoint
        self._chunks = GrpcChunks(model, version, variants)
        self._answer = stubs()[0].ModelStreamInferResponse
        self._channels: list[Any] = []  # one per slot, each on its own connection
        self._streams: list[Any] = []  # the slot's open stream, or None

    async def open(self, slots: int) -> None:
        for _ in range(slots):
            self._channels.append(open_channel(self._endpoint, own_connection=True))
            self._streams.append(None)
        for channel in self._channels:
            await channel.channel_ready()

    def _stream(self, slot: int) -> Any:
        stream = self._streams[slot]
        if stream is None:
            method = self._channels[slot].stream_stream(STREAM_METHOD, response_deserializer=self._answer.FromString)
            stream = self._streams[slot] = method(metadata=call_metadata(self._endpoint))
        return stream

    async def send(self, slot: int, variant: int, sequence_id: SequenceId, start: bool, end: bool) -> Outcome:
        stream = self._stream(slot)
        reusable = False
        try:
            outcome, reusable = await exchange(stream, self._chunks.message(variant, sequence_id, start, end))
        finally:
            if not reusable:  # an answer may still be on its way: never read it as the next chunk's
                stream.cancel()
                self._streams[slot] = None
        return outcome

    async def aclose(self) -> None:
        for stream in self._streams:
            if stream is not None:
                stream.cancel()
        for channel in self._channels:
            await channel.close()


class GrpcUnarySequences:
    def __init__(self, endpoint: Endpoint, model: str, version: str | None, variants: Sequence[RequestTensors]):
        self._endpoint = endpoint
        self._chunks = GrpcChunks(model, version, variants)
        self._connections: list[GrpcConnection | None] = []
        self._all: list[GrpcConnection] = []

    async def open(self, slots: int) -> None:
        for _ in range(slots):
            connection = await connect(self._endpoint)
            self._all.append(connection)
            self._connections.append(connection)

    async def send(self, slot: int, variant: int, sequence_id: SequenceId, start: bool, end: bool) -> Outcome:
        connection = self._connections[slot]
        if connection is None or not connection.usable:
            connection = self._connections[slot] = await connect(self._endpoint)
            self._all.append(connection)
        status = await connection.call(INFER_METHOD, self._chunks.framed(variant, sequence_id, start, end))
        if status.code == 0:
            return Outcome()
        return Outcome(f"grpc {STATUS_NAMES.get(status.code, 'UNKNOWN')}")

    async def aclose(self) -> None:
        connections, self._all = self._all, []
        self._connections = []
        await hang_up(connections)


class HttpSequences:
    def __init__(
        self,
        endpoint: Endpoint,
        model: str,
        version: str | None,
        variants: Sequence[RequestTensors],
        binary: bool,
    ):
        self._endpoint = endpoint
        self._chunks = HttpChunks(endpoint, model, version, variants, binary)
        self._connections: list[HttpConnection] = []

    async def open(self, slots: int) -> None:
        tls = self._endpoint.ssl_context("http/1.1")
        for _ in range(slots):
            connection = HttpConnection(self._endpoint.host, self._endpoint.port, tls)
            await connection.connect()
            self._connections.append(connection)

    async def send(self, slot: int, variant: int, sequence_id: SequenceId, start: bool, end: bool) -> Outcome:
        response = await self._connections[slot].request(self._chunks.request(variant, sequence_id, start, end))
        return Outcome(None if response.status == 200 else f"http {response.status}")

    async def aclose(self) -> None:
        protocols = [c.protocol for c in self._connections if c.protocol is not None]
        self._connections = []
        await hang_up(protocols)


def build_sequence_target(
    protocol: str, endpoint: Endpoint, model: str, version: str | None, variants: Sequence[RequestTensors]
) -> SequenceTarget:
    """The slot-per-connection target for ``protocol`` (one of :data:`SEQUENCE_PROTOCOLS`)."""
    if protocol == "grpc-stream":
        return GrpcStreamSequences(endpoint, model, version, variants)
    if protocol == "grpc":
        return GrpcUnarySequences(endpoint, model, version, variants)
    if protocol in ("v2-binary", "v2-json"):
        return HttpSequences(endpoint, model, version, variants, binary=protocol == "v2-binary")
    raise ValueError(f"sequences are sent over {', '.join(SEQUENCE_PROTOCOLS)}, not {protocol}")
