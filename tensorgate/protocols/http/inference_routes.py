"""The inference routes: KServe V2 (health, metadata, readiness, ``infer``, statistics, Triton's model
configuration, tensorgate's traffic status) and KServe V1 (``:predict``, version status).

Each decodes, calls the service, encodes. An inference request is resolved to its target before its
body is read (404 at once for an unknown model or version), decoded (V1: against the version the
target picked), run, and encoded inside the request's trace span.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

from tensorgate.errors import NotImplementedFeature, TensorgateError, UnsupportedMedia
from tensorgate.models.service import InferenceService
from tensorgate.models.target import Target
from tensorgate.names import check_model_name, parse_version
from tensorgate.observability.trace_context import sampled
from tensorgate.observability.tracing import NOOP_TRACER, Tracer
from tensorgate.protocols.http.body import Receive, decompress, read_body
from tensorgate.protocols.http.exchange import Call, Responder, Send
from tensorgate.protocols.http.routes import Params, RouteTable
from tensorgate.protocols.http.v1_codec import decode_predict, encode_predict
from tensorgate.protocols.http.v2_codec import (
    DecodeLimits,
    decode_infer,
    encode_infer,
    loads_object,
    parse_header_length,
)
from tensorgate.protocols.shared_memory import SharedMemoryRegions, SharedMemoryUse, is_local_peer, region_owner
from tensorgate.protocols.tenancy import Tenancy
from tensorgate.types import SHARED_TENANT, InferRequest, InferResponse, TensorSpec

T = TypeVar("T")

_NO_ATTRIBUTES: dict[str, str] = {}
# Triton's words for a decoupled model called the unary way (its UNSUPPORTED: 501 here, as there);
# such a model streams through generate_stream (generate_routes.py) and gRPC ModelStreamInfer.
DECOUPLED_REFUSED = "HTTP end point doesn't support models with decoupled transaction policy"
_BINARY = (b"content-type", b"application/octet-stream")
_JSON = (b"content-type", b"application/json")
# Content types a client may send a body as; anything else (pickle, forms of code) is refused with 415.
_ACCEPTED_TYPES = frozenset(
    {"", "application/json", "application/octet-stream", "application/x-www-form-urlencoded", "text/plain"}
)
# Bodies larger than this are decoded in a worker thread so health checks never wait behind them.
# Smaller ones decode on the event loop: decoding holds the GIL either way, and a hand-off to a
# thread makes the loop and the decoders take turns for it. bench_serving.py measures image-sized
# JSON bodies (decoding alone, and served).
OFFLOAD_BYTES = 8 * 1024 * 1024
_LIVE, _NOT_LIVE = b'{"live":true}', b'{"live":false}'
_READY, _NOT_READY = b'{"ready":true}', b'{"ready":false}'
_V1_STATES = {
    "READY": "AVAILABLE",
    "LOADING": "LOADING",
    "WARMING": "LOADING",
    "DRAINING": "UNLOADING",
    "UNLOADED": "END",
    "FAILED": "END",
}


@dataclass(frozen=True, slots=True)
class HttpSettings:
    max_body_bytes: int
    limits: DecodeLimits
    tenancy: Tenancy = field(default_factory=Tenancy.off)


async def read_request_body(call: Call, receive: Receive, limit: int) -> bytes:
    """The body, within ``limit`` also once decompressed; 415 for a content type that is not data."""
    content_type = (call.header(b"content-type") or "").split(";")[0].strip().lower()
    if content_type not in _ACCEPTED_TYPES:
        raise UnsupportedMedia(
            f"unsupported Content-Type {content_type[:60]!r}; send application/json or application/octet-stream"
        )
    length_header = call.header(b"content-length")
    length = int(length_header) if length_header and length_header.isdigit() else None
    body = await read_body(receive, length, limit)
    encoding = call.header(b"content-encoding")
    if encoding and len(body) > OFFLOAD_BYTES // 8:
        # Inflating can reach the full limit (64 MiB by default): off the loop, like big decodes.
        return await asyncio.to_thread(decompress, body, encoding, limit)
    return decompress(body, encoding, limit)


class InferenceRoutes:
    def __init__(
        self,
        service: InferenceService,
        responder: Responder,
        settings: HttpSettings,
        tracer: Tracer,
        regions: SharedMemoryRegions,
    ) -> None:
        self._service = service
        self._out = responder
        self._settings = settings
        self._tracer = tracer
        self._tracing_sampled_only = tracer.sampled_only
        self._regions = regions

    def register(self, routes: RouteTable) -> None:
        routes.add("GET", "/v2", self.server_metadata)
        routes.add("GET", "/v2/health/live", self.live)
        routes.add("GET", "/v2/health/ready", self.ready)
        routes.add("GET", "/v2/models/stats", self.all_statistics)
        for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            routes.add("GET", prefix, self.model_metadata)
            routes.add("GET", f"{prefix}/ready", self.model_ready)
            routes.add("POST", f"{prefix}/infer", self.infer)
            routes.add("GET", f"{prefix}/stats", self.statistics)
            routes.add("GET", f"{prefix}/config", self.config)  # Triton's model configuration extension
        routes.add("GET", "/v2/models/{model}/rollout", self.rollout)  # traffic split, canary and shadow
        for prefix in ("/v1/models/{model}", "/v1/models/{model}/versions/{version}"):
            routes.add("GET", prefix, self.v1_status)
            routes.add("POST", f"{prefix}:predict", self.predict)

    # -- health and metadata ---------------------------------------------------------------------

    async def server_metadata(self, call: Call, params: Params, receive: Receive, send: Send) -> None:
        await self._out.json(call, send, 200, self._service.server_metadata())

    # The health routes answer the Open Inference Protocol's bodies (the KServe SDK reads them) with
    # Triton's status codes (its clients read only those): 200, or 400 for not live / not ready.

    async def live(self, call: Call, params: Params, receive: Receive, send: Send) -> None:
        live = self._service.live()
        await self._out.body(call, send, 200 if live else 400, _LIVE if live else _NOT_LIVE, [_JSON])

    async def ready(self, call: Call, params: Params, receive: Receive, send: Send) -> None:
        ready = self._service.ready()
        await self._out.body(call, send, 200 if ready else 400, _READY if ready else _NOT_READY, [_JSON])

    async def all_statistics(self, call: Call, params: Params, receive: Receive, send: Send) -> None:
        if call.gate is not None:
            call.gate.check_all_models(call.identity)
        await self._out.json(call, send, 200, {"model_stats": self._service.statistics(None, None)})

    def _model(self, call: Call, params: Params) -> tuple[str, int | None]:
        name = params["model"]
        if not self._service.knows(name):  # a known name was checked when its model was found
            check_model_name(name)
        call.model = name
        call.allow_model(name)
        text = params.get("version")
        if text is None:
            return name, None
        version = parse_version(text)
        call.version = text
        return name, version

    async def model_metadata(self, call: Call, params: Params, receive: Receive, send: Send) -> None:
        name, version = self._model(call, params)
        document = self._service.metadata(name, version).to_v2()
        residency = self._service.residency(name)
        if residency is not None:  # an extension field: V2 clients read the fields they know
            document["residency"] = residency
        await self._out.json(call, send, 200, document)

    async def model_ready(self, call: Call, params: Params, receive: Receive, send: Send) -> None:
        name, version = self._model(call, params)
        ready = self._service.model_ready(name, version)
        await self._out.json(call, send, 200 if ready else 400, {"name": name, "ready": ready})

    async def statistics(self, call: Call, params: Params, receive: Receive, send: Send) -> None:
        name, version = self._model(call, params)
        await self._out.json(call, send, 200, {"model_stats": self._service.statistics(name, version)})

    async def config(self, call: Call, params: Params, receive: Receive, send: Send) -> None:
        name, version = self._model(call, params)
        await self._out.json(call, send, 200, self._service.config(name, version))

    async def rollout(self, call: Call, params: Params, receive: Receive, send: Send) -> None:
        name, _ = self._model(call, params)
        await self._out.json(call, send, 200, self._service.traffic(name))

    async def v1_status(self, call: Call, params: Params, receive: Receive, send: Send) -> None:
        name, version = self._model(call, params)
        statuses = self._service.version_statuses(name, version)
        document = {
            # KServe V1's model status (what its SDK's is_model_ready reads) beside TF Serving's.
            "name": name,
            "ready": self._service.model_ready(name, version),
            "model_version_status": [
                {
                    "version": str(s.version),
                    "state": _V1_STATES[s.state.value],
                    "status": {"error_code": "OK" if not s.reason else "UNKNOWN", "error_message": s.reason},
                }
                for s in statuses
            ],
        }
        await self._out.json(call, send, 200, document)

    # -- inference -------------------------------------------------------------------------------

    async def infer(self, call: Call, params: Params, receive: Receive, send: Send) -> None:
        name, version = self._model(call, params)
        target = self._service.resolve(name, version, call.text_header)  # 404 before the body is read
        if target.decoupled:
            raise NotImplementedFeature(DECOUPLED_REFUSED)
        body = await read_request_body(call, receive, self._settings.max_body_bytes)
        header_length = parse_header_length(call.header(b"inference-header-content-length"), len(body))
        shared = None
        if self._regions.enabled:
            shared = SharedMemoryUse(self._regions, region_owner(call.identity), is_local_peer(call.peer_host))
        decode = partial(
            decode_infer,
            body,
            header_length,
            name,
            version,
            self._settings.limits,
            request_id=call.request_id,
            traceparent=call.header(b"traceparent"),
            shared=shared,
        )
        try:
            if len(body) > OFFLOAD_BYTES:
                request, prefs = await asyncio.to_thread(decode)
            else:
                request, prefs = decode()
        except TensorgateError as exc:
            target.count_failure(exc)
            raise
        payload, json_length = await self._run(call, target, request, partial(encode_infer, prefs=prefs, shared=shared))
        extra = [] if json_length is None else [(b"inference-header-content-length", str(json_length).encode())]
        await self._out.body(call, send, 200, payload, [_BINARY if json_length is not None else _JSON, *extra])

    async def predict(self, call: Call, params: Params, receive: Receive, send: Send) -> None:
        name, version = self._model(call, params)
        target = self._service.resolve(name, version, call.text_header)  # 404 before the body is read
        if target.decoupled:
            raise NotImplementedFeature(DECOUPLED_REFUSED)
        body = await read_request_body(call, receive, self._settings.max_body_bytes)
        servable = await target.servable()  # the version the request runs on: decoded against its specs
        specs, batched, limits = servable.specs.inputs, servable.specs.max_batch_size > 0, self._settings.limits
        try:
            if len(body) > OFFLOAD_BYTES:
                request, rows = await asyncio.to_thread(_decode_v1, body, name, version, specs, batched, limits)
            else:
                request, rows = _decode_v1(body, name, version, specs, batched, limits)
        except TensorgateError as exc:
            target.count_failure(exc)
            raise
        document = await self._run(call, target, request, partial(encode_predict, rows=rows))
        await self._out.json(call, send, 200, document)

    async def _run(self, call: Call, target: Target, request: InferRequest, encode: Callable[[InferResponse], T]) -> T:
        """Run the request on its target, then encode the answer: both inside the request's span, the
        encoding as its own child span. (A client that leaves cancels this task: the listener's
        connection watch, armed by the app.)"""
        if not request.request_id:  # decoders that cannot carry the ids (V1) get them here
            request = request.with_context(call.request_id, call.header(b"traceparent"), request.tenant)
        tenancy = self._settings.tenancy
        if tenancy.enabled:
            tenant = tenancy.resolve(call.identity, call.headers.get(tenancy.header_key))
            if tenant is not SHARED_TENANT:
                request = request.with_context(request.request_id, request.traceparent, tenant)
        tracer = self._tracer
        if self._tracing_sampled_only and not sampled(request.traceparent):
            tracer = NOOP_TRACER  # sampling off and not marked sampled: nothing to record
        if tracer.enabled:
            attributes = {"http.request.method": call.method, "url.path": call.path[:200]}
            spans = tracer.request(f"{call.method} infer", request.traceparent, attributes)
        else:  # the no-op takes no notice of its arguments: build none
            spans = tracer.request("", None, _NO_ATTRIBUTES)
        with spans as span:
            if span.traceparent is not None:  # None when tracing is off: no copy of the request
                request = request.with_context(request.request_id, span.traceparent, request.tenant)
            response = await target.infer(request)
            span.record(response)
            call.version = str(response.version)
            call.queue_s = response.queue_s
            call.compute_s = response.compute_s
            with span.child("encode"):
                return encode(response)


def _decode_v1(
    body: bytes, name: str, version: int | None, specs: tuple[TensorSpec, ...], batched: bool, limits: DecodeLimits
) -> tuple[InferRequest, bool]:
    return decode_predict(loads_object(body, limits), name, version, specs, batched)
