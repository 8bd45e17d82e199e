"""``inference.GRPCInferenceService`` over the InferenceService: decode, call the core, encode.

Every RPC runs through one boundary (:meth:`InferenceServicer._guard` for unary calls, the per-item
wrapper for the stream): a :class:`TensorgateError` becomes its table status, anything else is
logged and becomes INTERNAL with no detail. The transport cancels the handler's task when the client
cancels or its deadline passes, and that cancellation flows into ``service.infer``, so the
request leaves the scheduler's queue.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc

from tensorgate.clock import Clock
from tensorgate.errors import (
    DeadlineExceeded,
    InternalError,
    InvalidInput,
    NotFound,
    TensorgateError,
    Unavailable,
)
from tensorgate.models.service import InferenceService
from tensorgate.names import check_model_name
from tensorgate.observability.access_log import AccessLog
from tensorgate.observability.trace_context import sampled
from tensorgate.observability.tracing import NOOP_TRACER, RequestSpan, Tracer
from tensorgate.protocols.grpc import codec
from tensorgate.protocols.grpc.context import (
    MetadataReader,
    identity_of,
    is_local,
    metadata_of,
    owner_of,
    past_deadline,
)
from tensorgate.protocols.grpc.errors import Metadata, abort
from tensorgate.protocols.grpc.generated import grpc_service_pb2 as pb
from tensorgate.protocols.grpc.generated import grpc_service_pb2_grpc as pb_grpc
from tensorgate.protocols.grpc.management_rpcs import ManagementRpcs
from tensorgate.protocols.grpc.raw_inputs import ReceivedInfer, receive_infer_request
from tensorgate.protocols.request_ids import RequestIds
from tensorgate.protocols.shared_memory import (
    SharedMemoryRegions,
    SharedMemoryUse,
)
from tensorgate.protocols.tenancy import Tenancy
from tensorgate.security.gate import Gate
from tensorgate.types import SHARED_TENANT, InferRequest

log = logging.getLogger(__name__)

T = TypeVar("T")

# Requests of one stream being decoded or run at once. Past it the servicer stops reading the
# stream, so HTTP/2 flow control pushes back on the client instead of the server buffering.
STREAM_WINDOW = 64


@dataclass(frozen=True, slots=True)
class GrpcSettings:
    limits: codec.GrpcLimits
    access: AccessLog | None = None  # the server's access log, shared with HTTP
    gate: Gate | None = None  # the transport authenticated the call; a model-limited caller is checked here
    shared_memory: SharedMemoryRegions | None = None  # shared with HTTP: a region registered on one serves both
    tenancy: Tenancy = field(default_factory=Tenancy.off)  # who each call is queued for (fair sharing)
    # Told of each call refused as unavailable (a model not ready, the server draining, a full queue):
    # a listener that refuses connections while the server is not ready looks again at once.
    on_unavailable: Callable[[], None] | None = None


def _timeout(request: InferRequest, context: Any) -> InferRequest:
    """The gRPC deadline becomes the request's timeout (the earlier of it and the V2 ``timeout``)."""
    remaining = context.time_remaining()
    if remaining is None:
        return request
    if remaining <= 0:
        raise DeadlineExceeded(f"request to model '{request.model}' arrived after its deadline")
    if request.timeout_s is None or remaining < request.timeout_s:
        return request.with_timeout(remaining)
    return request


class InferenceServicer(ManagementRpcs, pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """The RPCs of ``inference.GRPCInferenceService``; created by the listener, one per server.

    Handlers run on the event loop and never block: tensors are decoded with ``np.frombuffer``
    views and models run in their instances, off the loop.
    """

    def __init__(self, service: InferenceService, settings: GrpcSettings, tracer: Tracer, clock: Clock) -> None:
        self._service = service
        self._settings = settings
        self._tracer = tracer
        self._clock = clock
        self._ids = RequestIds()
        self._regions = settings.shared_memory or SharedMemoryRegions(enabled=False)

    def _model(self, context: Any, name: str) -> str:
        """A valid model name that the caller may use (403 for a caller limited to other models)."""
        name = check_model_name(name)
        if self._settings.gate is not None:
            self._settings.gate.check_model(identity_of(context), name)
        return name

    async def _guard(self, context: Any, call: Callable[[], Awaitable[T]], ids: Metadata = ()) -> T:
        try:
            return await call()
        except TensorgateError as exc:
            error = exc
            if isinstance(exc, Unavailable) and self._settings.on_unavailable is not None:
                self._settings.on_unavailable()
        except Exception:
            log.exception("unhandled error in a gRPC call")
            error = InternalError("internal server error")
        await abort(context, error, ids)

    # -- health and metadata ---------------------------------------------------------------------

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=self._service.live())

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=self._service.ready())

    async def ModelReady(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            name, version = self._model(context, request.name), codec.optional_version(request.version)
            try:
                ready = self._service.model_ready(name, version)
            except NotFound:  # as Triton: an unknown model or version is not ready, not an error
                ready = False
            return pb.ModelReadyResponse(ready=ready)

        return await self._guard(context, call)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        meta = self._service.server_metadata()
        return pb.ServerMetadataResponse(name=meta["name"], version=meta["version"], extensions=meta["extensions"])

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            version = codec.optional_version(request.version)
            return codec.encode_metadata(self._service.metadata(self._model(context, request.name), version))

        return await self._guard(context, call)

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            name = self._model(context, request.name)
            return codec.encode_config(self._service.config(name, codec.optional_version(request.version)))

        return await self._guard(context, call)

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            if not request.name and self._settings.gate is not None:  # every model's: not for a limited caller
                self._settings.gate.check_all_models(identity_of(context))
            name = self._model(context, request.name) if request.name else None
            version = codec.optional_version(request.version) if name is not None else None
            return codec.encode_statistics(self._service.statistics(name, version))

        return await self._guard(context, call)

    # -- inference -------------------------------------------------------------------------------

    async def _infer(
        self, rpc: str, received: ReceivedInfer, context: Any, request_id: str, traceparent: str | None
    ) -> Any:
        """Decode, run and encode one request; raises TensorgateError for the caller to report."""
        message = received.message
        started = self._clock.now()
        outcome = "OK"
        caller = identity_of(context)
        served = _Served(message.model_version[:20] or "-", identity=None if caller is None else caller.name)
        try:
            tracer = self._tracer
            if tracer.sampled_only and not sampled(traceparent):
                tracer = NOOP_TRACER  # sampling off and not marked sampled: nothing to record
            with tracer.request(rpc, traceparent, {"rpc.system": "grpc", "rpc.method": rpc}) as span:
                return await self._run(received, context, request_id, traceparent, span, served)
        except TensorgateError as exc:
            outcome = exc.grpc_status
            raise
        except asyncio.CancelledError:
            # The transport cancels the handler when the client cancels, and when the deadline passes.
            outcome = "DEADLINE_EXCEEDED" if past_deadline(context) else "CANCELLED"
            raise
        finally:
            self._access(rpc, message, request_id, outcome, started, served)

    async def _run(
        self,
        received: ReceivedInfer,
        context: Any,
        request_id: str,
        traceparent: str | None,
        span: RequestSpan,
        served: _Served,
    ) -> Any:
        message = received.message
        if received.error is not None:
            raise InvalidInput(received.error)
        if self._settings.gate is not None and message.model_name:  # before any tensor is decoded
            self._settings.gate.check_model(identity_of(context), check_model_name(message.model_name))
        shared = SharedMemoryUse(self._regions, owner_of(context), is_local(context)) if self._regions.enabled else None
        try:
            request = _timeout(codec.decode_infer(message, self._settings.limits, received.raw, shared), context)
        except TensorgateError as exc:
            # Counted against the version it names; a malformed version names none (as on HTTP).
            if message.model_name and _well_formed(message.model_version):
                self._service.count_failure(message.model_name, codec.optional_version(message.model_version), exc)
            raise
        tenancy = self._settings.tenancy
        metadata = MetadataReader(context)  # read once, and only where a header is looked up in it
        tenant = (
            tenancy.resolve(identity_of(context), metadata(tenancy.metadata_key)) if tenancy.enabled else SHARED_TENANT
        )
        request = request.with_context(request_id, span.traceparent or traceparent, tenant)
        response = await self._service.infer(request, metadata)
        served.version, served.queue_s, served.compute_s = str(response.version), response.queue_s, response.compute_s
        span.record(response)
        with span.child("encode"):
            return codec.encode_infer(response, shared)

    async def ModelInfer(self, request: ReceivedInfer, context: Any) -> Any:
        headers = metadata_of(context)
        request_id = self._ids.of(headers.get("x-request-id"))
        ids: Metadata = (("x-request-id", request_id),)
        context.set_trailing_metadata(ids)
        return await self._guard(
            context, lambda: self._infer("ModelInfer", request, context, request_id, headers.get("traceparent")), ids
        )

    async def ModelStreamInfer(self, requests: AsyncIterator[ReceivedInfer], context: Any) -> AsyncIterator[Any]:
        """Requests run concurrently (so they can share batches); answers come back in request order.

        A failed request answers with ``error_message`` and the stream goes on.
        """
        headers = metadata_of(context)
        stream_id = self._ids.of(headers.get("x-request-id"))
        context.set_trailing_metadata((("x-request-id", stream_id),))
        traceparent = headers.get("traceparent")
        window = asyncio.Semaphore(STREAM_WINDOW)
        started: asyncio.Queue[asyncio.Task[Any] | None] = asyncio.Queue()

        async def read() -> None:
            try:
                async for message in requests:
                    await window.acquire()
                    coro = self._stream_one(message, context, stream_id, traceparent)
                    started.put_nowait(asyncio.get_running_loop().create_task(coro))
            finally:
                started.put_nowait(None)

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while (task := await started.get()) is not None:
                try:
                    yield await task
                finally:
                    window.release()
            await reader  # surfaces an error reading the stream
        finally:
            reader.cancel()
            while not started.empty():
                leftover = started.get_nowait()
                if leftover is not None:
                    leftover.cancel()

    async def _stream_one(self, received: ReceivedInfer, context: Any, stream_id: str, traceparent: str | None) -> Any:
        message = received.message
        try:
            answer = pb.ModelStreamInferResponse(
                infer_response=await self._infer("ModelStreamInfer", received, context, stream_id, traceparent)
            )
        except TensorgateError as exc:
            error = exc
        except Exception:
            log.exception("unhandled error in a gRPC stream request")
            error = InternalError("internal server error")
        else:
            return _final(answer)
        answer = pb.ModelStreamInferResponse(error_message=error.message)
        answer.infer_response.id = message.id
        answer.infer_response.model_name = message.model_name
        return _final(answer)

    def _access(self, rpc: str, message: Any, request_id: str, status: str, started: float, served: _Served) -> None:
        access = self._settings.access
        if access is None or not access.enabled:
            return
        access.record(
            request_id,
            "grpc",
            rpc,
            None,
            message.model_name[:128] or "-",
            served.version,
            status,
            served.queue_s,
            served.compute_s,
            self._clock.now() - started,
            served.identity,
        )


@dataclass(slots=True)
class _Served:
    """What the access line reports of a request: the version that served it (the one asked for,
    until an answer names it), and its queue and compute seconds."""

    version: str
    queue_s: float = 0.0
    compute_s: float = 0.0
    identity: str | None = None  # the caller's name where authentication is on


def _final(answer: Any) -> Any:
    """Mark a stream answer as its request's last, as Triton does: every model here answers once, and
    clients of decoupled-style streams (tritonclient, PyTriton) read until they see this flag."""
    answer.infer_response.parameters["triton_final_response"].bool_param = True
    return answer


def _well_formed(version: str) -> bool:
    try:
        codec.optional_version(version)
    except TensorgateError:
        return False
    return True


def add_to_server(servicer: InferenceServicer, server: Any) -> None:
    """Register the service, as the generated ``add_GRPCInferenceServiceServicer_to_server`` does, with
    ModelInfer and ModelStreamInfer taking their requests through :func:`receive_infer_request`."""
    table = _GeneratedTable()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, table)
    handlers = table.handlers
    for name in ("ModelInfer", "ModelStreamInfer"):  # grpc's handlers are named tuples
        handlers[name] = handlers[name]._replace(request_deserializer=receive_infer_request)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(table.service, handlers),))
    server.add_registered_method_handlers(table.service, handlers)


class _GeneratedTable:
    """Stands in for the server while the generated code registers, to keep its method table."""

    def __init__(self) -> None:
        self.service = ""
        self.handlers: dict[str, Any] = {}

    def add_generic_rpc_handlers(self, handlers: object) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.service, self.handlers = service, handlers
