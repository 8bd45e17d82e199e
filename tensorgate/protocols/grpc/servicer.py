"""``inference.GRPCInferenceService`` over the InferenceService: decode, call the core, encode.

Every RPC runs through one boundary (:meth:`InferenceServicer._guard` for unary calls, the per-item
wrapper for the stream): a :class:`TensorgateError` becomes its table status, anything else is
logged and becomes INTERNAL with no detail. The transport cancels the handler's task when the client
cancels or its deadline passes, and that cancellation flows into ``service.infer``, so the
request leaves the scheduler's queue.

A decoupled model (any number of responses per request) is served on ``ModelStreamInfer`` only
(``stream_infer``): each response is one answer, the last marked ``triton_final_response``, as
Triton does; ``ModelInfer`` refuses it in Triton's words.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc

from tensorgate.clock import Clock
from tensorgate.decoupled import ResponseStream, StreamEvent
from tensorgate.errors import (
    DeadlineExceeded,
    InternalError,
    InvalidInput,
    NotFound,
    NotImplementedFeature,
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
from tensorgate.protocols.grpc.stream_infer import decoupled_checker, stream_infer
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

# Triton's words for a decoupled model called the unary way (its UNSUPPORTED: UNIMPLEMENTED here).
DECOUPLED_REFUSED = "ModelInfer RPC doesn't support models with decoupled transaction policy"
# A request parameter asking for an answer of its own when the model sends the final flag alone.
EMPTY_FINAL = "triton_enable_empty_final_response"


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
        if received.error is None and self._service.decoupled(received.message.model_name):
            raise NotImplementedFeature(DECOUPLED_REFUSED)
        request, shared, metadata = self._prepare(received, context, request_id, traceparent, span)
        response = await self._service.infer(request, metadata)
        served.version, served.queue_s, served.compute_s = str(response.version), response.queue_s, response.compute_s
        span.record(response)
        with span.child("encode"):
            return codec.encode_infer(response, shared)

    def _prepare(
        self, received: ReceivedInfer, context: Any, request_id: str, traceparent: str | None, span: RequestSpan
    ) -> tuple[InferRequest, SharedMemoryUse | None, MetadataReader]:
        """Decode a request (after the caller's model access is checked) with its ids and tenant."""
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
        return request.with_context(request_id, span.traceparent or traceparent, tenant), shared, metadata

    async def ModelInfer(self, request: ReceivedInfer, context: Any) -> Any:
        headers = metadata_of(context)
        request_id = self._ids.of(headers.get("x-request-id"))
        ids: Metadata = (("x-request-id", request_id),)
        context.set_trailing_metadata(ids)
        return await self._guard(
            context, lambda: self._infer("ModelInfer", request, context, request_id, headers.get("traceparent")), ids
        )

    async def ModelStreamInfer(self, requests: AsyncIterator[ReceivedInfer], context: Any) -> AsyncIterator[Any]:
        """Requests run concurrently (so they can share batches); answers come back in request order,
        a decoupled model's responses as they come (``stream_infer``).

        A failed request answers with ``error_message`` and the stream goes on.
        """
        headers = metadata_of(context)
        stream_id = self._ids.of(headers.get("x-request-id"))
        context.set_trailing_metadata((("x-request-id", stream_id),))
        call = _StreamCall(self, context, stream_id, headers.get("traceparent"))
        async for answer in stream_infer(call, requests):
            yield answer

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

    async def _stream_decoupled(
        self, received: ReceivedInfer, context: Any, stream_id: str, traceparent: str | None
    ) -> AsyncGenerator[Any, None]:
        """A decoupled model's request on the stream: one answer per response, the last marked final."""
        message = received.message
        started = self._clock.now()
        outcome = "OK"
        caller = identity_of(context)
        served = _Served(message.model_version[:20] or "-", identity=None if caller is None else caller.name)
        stream: ResponseStream | None = None
        try:
            try:
                tracer = self._tracer
                if tracer.sampled_only and not sampled(traceparent):
                    tracer = NOOP_TRACER
                attributes = {"rpc.system": "grpc", "rpc.method": "ModelStreamInfer"}
                with tracer.request("ModelStreamInfer", traceparent, attributes) as span:  # the admission only
                    request, shared, metadata = self._prepare(received, context, stream_id, traceparent, span)
                    stream = await self._service.stream(request, metadata)
            except TensorgateError as exc:
                outcome = exc.grpc_status
                if message.model_name and _well_formed(message.model_version) and stream is None:
                    self._service.count_failure(message.model_name, codec.optional_version(message.model_version), exc)
                yield _error_answer(message, exc.message, final=True)
                return
            served.version = str(stream.version)
            empty_final = request.parameters.get(EMPTY_FINAL) is True
            async for event in stream:
                answer = _stream_answer(stream, event, message, shared, empty_final)
                if event.final and event.error is not None:
                    outcome = event.error.grpc_status
                if answer is not None:
                    yield answer
        except (asyncio.CancelledError, GeneratorExit):
            # The call ended under it: the client cancelled or closed the stream, or its deadline passed.
            outcome = "DEADLINE_EXCEEDED" if past_deadline(context) else "CANCELLED"
            raise
        finally:
            if stream is not None:
                stream.cancel()  # the model is told, unless its stream already ended
            self._access("ModelStreamInfer", message, stream_id, outcome, started, served)

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


class _StreamCall:
    """One ``ModelStreamInfer`` call's handler for ``stream_infer``: each request through the servicer."""

    def __init__(self, servicer: InferenceServicer, context: Any, stream_id: str, traceparent: str | None) -> None:
        self._servicer = servicer
        self._context = context
        self._stream_id = stream_id
        self._traceparent = traceparent
        self.is_decoupled = decoupled_checker(servicer._service.decoupled)

    def answer(self, received: ReceivedInfer) -> Any:
        return self._servicer._stream_one(received, self._context, self._stream_id, self._traceparent)

    def answers(self, received: ReceivedInfer) -> AsyncGenerator[Any, None]:
        return self._servicer._stream_decoupled(received, self._context, self._stream_id, self._traceparent)


def _stream_answer(
    stream: ResponseStream, event: StreamEvent, message: Any, shared: SharedMemoryUse | None, empty_final: bool
) -> Any:
    """One event of a decoupled request as Triton writes it: a response (final or not), an error, or,
    for the final flag alone, an empty answer where the request asked for one (else nothing)."""
    if event.error is not None:
        return _error_answer(message, event.error.message, final=event.final)
    if event.outputs is not None:
        answer = pb.ModelStreamInferResponse(infer_response=codec.encode_infer(stream.response(event.outputs), shared))
    elif event.final and empty_final:
        answer = pb.ModelStreamInferResponse()
        _name(answer, message, str(stream.version))
    else:
        return None
    answer.infer_response.parameters["triton_final_response"].bool_param = event.final
    return answer


def _error_answer(message: Any, error: str, *, final: bool) -> Any:
    """An error on the stream, naming the request it belongs to (its id, model and version)."""
    answer = pb.ModelStreamInferResponse(error_message=error)
    _name(answer, message, message.model_version)
    answer.infer_response.parameters["triton_final_response"].bool_param = final
    return answer


def _name(answer: Any, message: Any, version: str) -> None:
    answer.infer_response.id = message.id
    answer.infer_response.model_name = message.model_name
    answer.infer_response.model_version = version


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
