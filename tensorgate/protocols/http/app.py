"""The HTTP front end: a plain ASGI application over the InferenceService.

Routes decode, call the core, encode; nothing else. It is written against ASGI directly rather
than a framework because on a 2-core machine the per-request cost of routing and request objects
is a visible share of a 1 ms inference; the routes are few and fixed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from tensorgate.clock import Clock
from tensorgate.errors import (
    Cancelled,
    InternalError,
    InvalidInput,
    MethodNotAllowed,
    NotFound,
    NotImplementedFeature,
    TensorgateError,
    Unauthenticated,
    Unavailable,
    UnsupportedMedia,
)
from tensorgate.models.service import InferenceService
from tensorgate.models.status import StatusReport
from tensorgate.observability.access_log import AccessLog
from tensorgate.observability.status_page import status_page
from tensorgate.observability.trace_context import sampled
from tensorgate.observability.tracing import NOOP_TRACER, Tracer
from tensorgate.protocols.access import http_access
from tensorgate.protocols.http.body import Receive, decompress, read_body
from tensorgate.protocols.http.disconnect import CONNECTION_EXTENSION, ConnectionWatch
from tensorgate.protocols.http.openai_routes import GenerationRoutes, is_generation_route
from tensorgate.protocols.http.openapi import openapi_json
from tensorgate.protocols.http.security_headers import NOSNIFF
from tensorgate.protocols.http.v1_codec import decode_predict, encode_predict
from tensorgate.protocols.http.v2_codec import (
    DecodeLimits,
    decode_infer,
    dumps,
    encode_infer,
    loads_object,
    parse_header_length,
)
from tensorgate.protocols.request_ids import RequestIds
from tensorgate.protocols.shared_memory import (
    CUDA_MESSAGE,
    SharedMemoryRegions,
    SharedMemoryUse,
    is_local_peer,
    region_owner,
)
from tensorgate.protocols.tenancy import Tenancy
from tensorgate.repository.names import check_model_name, parse_version
from tensorgate.security.gate import Gate
from tensorgate.security.hosts import HostAllowlist
from tensorgate.security.identity import Identity
from tensorgate.types import SHARED_TENANT, InferRequest, InferResponse, TensorSpec

T = TypeVar("T")
log = logging.getLogger(__name__)

Send = Callable[[dict[str, Any]], Awaitable[None]]
Scope = dict[str, Any]

_JSON = (b"content-type", b"application/json")
_NO_ATTRIBUTES: dict[str, str] = {}
_BINARY = (b"content-type", b"application/octet-stream")
_NO_STORE = (b"cache-control", b"no-store")
_CLOSE = (b"connection", b"close")
# Content types a client may send a body as; anything else (pickle, forms of code) is refused with 415.
_ACCEPTED_TYPES = frozenset(
    {"", "application/json", "application/octet-stream", "application/x-www-form-urlencoded", "text/plain"}
)
# Bodies larger than this are decoded in a worker thread so health checks never wait behind them.
# Smaller ones decode on the event loop: decoding holds the GIL either way, and a hand-off to a
# thread makes the loop and the decoders take turns for it. bench_serving.py measures image-sized
# JSON bodies (decoding alone, and served).
_OFFLOAD_BYTES = 8 * 1024 * 1024


class _WrongMethod(MethodNotAllowed):
    def __init__(self, message: str, allow: str) -> None:
        super().__init__(message)
        self.allow = (allow + ", HEAD" if allow == "GET" else allow).encode()


@dataclass(frozen=True, slots=True)
class HttpSettings:
    max_body_bytes: int
    limits: DecodeLimits
    tenancy: Tenancy = field(default_factory=Tenancy.off)


@dataclass(slots=True)
class Call:
    """What one HTTP exchange carries besides its body."""

    method: str
    path: str
    # Raw, lower-case names (as the server hands them over) to raw values; a route decodes the few
    # it reads (``header``) instead of every header being decoded for every request (~2 % of a
    # small model's request).
    headers: dict[bytes, bytes]
    request_id: str
    model: str = "-"
    version: str = "-"
    status: int = 0
    queue_s: float = 0.0
    compute_s: float = 0.0
    connection: ConnectionWatch | None = None  # from our listener, which hands one to every request
    identity: Identity | None = None  # the caller, where authentication is on
    gate: Gate | None = None
    peer_host: str | None = None  # the client's address (None on a Unix socket)

    def __init__(self, method: str, path: str, headers: dict[bytes, bytes], request_id: str) -> None:
        # Written out: a generated dataclass __init__ stays interpreted under mypyc (see types.py).
        self.method = method
        self.path = path
        self.headers = headers
        self.request_id = request_id
        self.model = "-"
        self.version = "-"
        self.status = 0
        self.queue_s = 0.0
        self.compute_s = 0.0
        self.connection = None
        self.identity = None
        self.gate = None
        self.peer_host = None

    def header(self, name: bytes) -> str | None:
        value = self.headers.get(name)
        return None if value is None else value.decode("latin-1")

    def allow_model(self, name: str) -> None:
        if self.gate is not None:
            self.gate.check_model(self.identity, name)

    def may_use(self, name: str) -> bool:
        identity = self.identity
        return identity is None or identity.models is None or name in identity.models


class HttpApp:
    def __init__(
        self,
        service: InferenceService,
        settings: HttpSettings,
        clock: Clock,
        access: AccessLog | None = None,
        tracer: Tracer = NOOP_TRACER,
        gate: Gate | None = None,
        hosts: HostAllowlist | None = None,
        shared_memory: SharedMemoryRegions | None = None,
        status: StatusReport | None = None,
    ) -> None:
        self._gate = gate if gate is not None else Gate(clock)  # without one: only admin keys are asked for
        self._hosts = hosts if hosts is not None else HostAllowlist(None)
        self._regions = shared_memory if shared_memory is not None else SharedMemoryRegions(enabled=False)
        self._tracer = tracer
        self._tracing_sampled_only = tracer.sampled_only
        self._service = service
        self._settings = settings
        self._clock = clock
        self._access_log = access if access is not None else AccessLog(enabled=False)
        self._ids = RequestIds()
        self._openapi = openapi_json()  # GET /openapi.json, read once here at startup
        self._status = status if status is not None else StatusReport(service, clock)  # GET /v2/status
        page = status_page()  # GET / and /status: the live status page, read once here too
        self._status_page, self._status_page_headers = page.body, page.headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await _lifespan(receive, send)
            return
        if kind != "http":
            return
        headers = dict(scope["headers"])  # a repeated header keeps its last value, as before
        call = Call(scope["method"], scope["path"], headers, "")
        client = scope.get("client")
        if client:
            call.peer_host = client[0]
        extensions = scope.get("extensions")
        if extensions:
            call.connection = extensions.get(CONNECTION_EXTENSION)
        call.request_id = self._ids.of(call.header(b"x-request-id"))
        started = self._clock.now()
        try:
            await self._route(call, receive, send)
        except TensorgateError as exc:
            if isinstance(exc, Cancelled):
                call.status = 499
            else:
                await self._error(call, send, exc)
        except asyncio.CancelledError:
            call.status = 499
            raise
        except Exception:
            log.exception("unhandled error on %s %s", call.method, call.path)
            await self._error(call, send, InternalError("internal server error"))
        finally:
            self._access(call, started)

    # -- routing ---------------------------------------------------------------------------------

    async def _route(self, call: Call, receive: Receive, send: Send) -> None:
        parts = call.path.strip("/").split("/")
        if self._hosts.checks:  # bound to loopback: a page that rebinds its name to us is refused
            self._hosts.check(call.header(b"host"))
        gate = self._gate
        if not gate.enabled:
            await self._dispatch(call, parts, receive, send)
            return
        # Authentication is on: the caller is known (401), has the role (403) and is within its
        # limits (429) before any of the body is read.
        call.identity = gate.check(http_access(parts), call.header(b"authorization"), call.header(b"x-api-key"))
        gate.admit(call.identity)
        call.gate = gate
        try:
            await self._dispatch(call, parts, receive, send)
        finally:
            gate.release(call.identity)

    async def _dispatch(self, call: Call, parts: list[str], receive: Receive, send: Send) -> None:
        head = parts[0] if parts else ""
        if is_generation_route(parts):  # text generation: OpenAI routes and the V2 generate extension
            await GenerationRoutes(self._service, self._settings.max_body_bytes).handle(call, parts, receive, send)
        elif head == "v2":
            await self._route_v2(call, parts[1:], receive, send)
        elif head == "v1" and len(parts) >= 3 and parts[1] == "models":
            await self._route_v1(call, parts[2:], receive, send)
        elif head == "openapi.json" and len(parts) == 1:  # behind the same gate as the metadata routes
            self._only(call, "GET")
            await self._send(call, send, 200, self._openapi, [_JSON])
        elif head in ("", "status") and len(parts) == 1:  # the live status page (metrics role)
            self._only(call, "GET")
            await self._send(call, send, 200, self._status_page, self._status_page_headers)
        else:
            raise NotFound(f"no route for {call.path[:200]}")

    async def _route_v2(self, call: Call, parts: list[str], receive: Receive, send: Send) -> None:
        n = len(parts)
        if n == 0:
            self._only(call, "GET")
            await self._json(call, send, 200, self._service.server_metadata())
        elif parts[0] == "health" and n == 2 and parts[1] in ("live", "ready"):
            self._only(call, "GET")
            ok = self._service.live() if parts[1] == "live" else self._service.ready()
            await self._empty(call, send, 200 if ok else 400)
        elif parts[0] == "models" and n >= 2:
            if parts[1] == "stats" and n == 2:
                self._only(call, "GET")
                self._gate.check_all_models(call.identity)
                await self._json(call, send, 200, {"model_stats": self._service.statistics(None, None)})
                return
            name = parts[1]
            if not self._service.router.knows(name):  # a known name was checked when its model was found
                check_model_name(name)
            call.model = name
            call.allow_model(name)
            rest = parts[2:]
            version: int | None = None
            if len(rest) >= 2 and rest[0] == "versions":
                version = parse_version(rest[1])
                call.version = rest[1]
                rest = rest[2:]
            await self._model_route(call, name, version, rest, receive, send)
        elif parts[0] == "repository":
            # Before any of the body is read: 401 without an admin key, 403 unless the mode allows it.
            if not self._gate.enabled:  # with authentication on, _route took the admin credential
                self._gate.check("admin", call.header(b"authorization"), call.header(b"x-api-key"))
            self._service.repository.authorize(changes=parts[1:] != ["index"])
            await self._repository_route(call, parts[1:], receive, send)
        elif parts[0] in ("systemsharedmemory", "cudasharedmemory"):
            await self._shared_memory_route(call, parts, receive, send)
        elif parts[0] == "status" and n == 1:  # what the status page polls (metrics role)
            self._only(call, "GET")
            visible = None if call.identity is None else call.identity.models
            await self._send(call, send, 200, dumps(self._status.document(visible)), [_JSON, _NO_STORE])
        else:
            raise NotFound(f"no route for {call.path[:200]}")

    async def _shared_memory_route(self, call: Call, parts: list[str], receive: Receive, send: Send) -> None:
        """Triton's shared-memory extensions: status, register, unregister (one region, or all)."""
        n = len(parts)
        region = parts[2] if n == 4 and parts[1] == "region" else None
        action = parts[3] if region is not None else (parts[1] if n == 2 else "")
        if action not in ("status", "register", "unregister") or (action == "register" and region is None):
            raise NotFound(f"no route for {call.path[:200]}")
        self._only(call, "GET" if action == "status" else "POST")
        if parts[0] == "cudasharedmemory":
            raise NotImplementedFeature(CUDA_MESSAGE)
        regions, owner = self._regions, region_owner(call.identity)
        regions.check_caller(is_local_peer(call.peer_host))
        if action == "status":
            await self._json(call, send, 200, regions.status(owner, region))
            return
        if action == "register":
            assert region is not None
            document = await self._management_body(call, receive)
            regions.register(owner, region, document.get("key"), document.get("offset", 0), document.get("byte_size"))
        else:
            regions.unregister(owner, region)
        await self._json(call, send, 200, {})

    async def _model_route(
        self, call: Call, name: str, version: int | None, rest: list[str], receive: Receive, send: Send
    ) -> None:
        action = rest[0] if len(rest) == 1 else ("" if not rest else None)
        if action == "":
            self._only(call, "GET")
            document = self._service.metadata(name, version).to_v2()
            residency = self._service.residency(name)
            if residency is not None:  # an extension field: V2 clients read the fields they know
                document["residency"] = residency
            await self._json(call, send, 200, document)
        elif action == "ready":
            self._only(call, "GET")
            await self._empty(call, send, 200 if self._service.model_ready(name, version) else 400)
        elif action == "infer":
            self._only(call, "POST")
            await self._infer_v2(call, name, version, receive, send)
        elif action == "stats":
            self._only(call, "GET")
            await self._json(call, send, 200, {"model_stats": self._service.statistics(name, version)})
        elif action == "config":  # Triton's model configuration extension (tritonclient's get_model_config)
            self._only(call, "GET")
            await self._json(call, send, 200, self._service.config(name, version))
        elif action == "rollout" and version is None:  # traffic split, canary rollout and shadow
            self._only(call, "GET")
            await self._json(call, send, 200, self._service.traffic(name))
        else:
            raise NotFound(f"no route for {call.path[:200]}")

    async def _repository_route(self, call: Call, parts: list[str], receive: Receive, send: Send) -> None:
        """Triton's model repository extension: index, load (with an optional config), unload."""
        repository = self._service.repository
        if parts == ["index"]:
            self._only(call, "POST")
            document = await self._management_body(call, receive)
            rows = await repository.index(ready_only=document.get("ready") is True)
            await self._json(call, send, 200, rows)
        elif len(parts) == 3 and parts[0] == "models" and parts[2] in ("load", "unload"):
            self._only(call, "POST")
            name = check_model_name(parts[1])
            call.model = name
            parameters = (await self._management_body(call, receive)).get("parameters") or {}
            if not isinstance(parameters, dict):
                raise InvalidInput("'parameters' must be an object")
            if parts[2] == "load":
                await repository.load(name, _load_config(parameters))
            else:
                await repository.unload(name)  # unload_dependents is accepted: no model depends on another
            await self._empty(call, send, 200)
        else:
            raise NotFound(f"no route for {call.path[:200]}")

    async def _management_body(self, call: Call, receive: Receive) -> dict[str, Any]:
        body = await self._body(call, receive)
        return loads_object(body, self._settings.limits) if body.strip() else {}

    async def _route_v1(self, call: Call, parts: list[str], receive: Receive, send: Send) -> None:
        # /v1/models/{m}[:predict] or /v1/models/{m}/versions/{v}[:predict]
        last = parts[-1]
        predict = last.endswith(":predict")
        if predict:
            parts = [*parts[:-1], last[: -len(":predict")]]
        name = check_model_name(parts[0])
        call.model = name
        call.allow_model(name)
        version = None
        if len(parts) == 3 and parts[1] == "versions":
            version = parse_version(parts[2])
            call.version = parts[2]
        elif len(parts) != 1:
            raise NotFound(f"no route for {call.path[:200]}")
        if predict:
            self._only(call, "POST")
            await self._predict_v1(call, name, version, receive, send)
        else:
            self._only(call, "GET")
            await self._json(call, send, 200, self._v1_status(name, version))

    @staticmethod
    def _only(call: Call, method: str) -> None:
        if call.method != method and not (method == "GET" and call.method == "HEAD"):
            raise _WrongMethod(f"{call.method} is not allowed on {call.path[:200]}; use {method}", method)

    # -- inference -------------------------------------------------------------------------------

    async def _body(self, call: Call, receive: Receive) -> bytes:
        content_type = (call.header(b"content-type") or "").split(";")[0].strip().lower()
        if content_type not in _ACCEPTED_TYPES:
            raise UnsupportedMedia(
                f"unsupported Content-Type {content_type[:60]!r}; send application/json or application/octet-stream"
            )
        length_header = call.header(b"content-length")
        length = int(length_header) if length_header and length_header.isdigit() else None
        limit = self._settings.max_body_bytes
        body = await read_body(receive, length, limit)
        encoding = call.header(b"content-encoding")
        if encoding and len(body) > _OFFLOAD_BYTES // 8:
            # Inflating can reach the full limit (64 MiB by default): off the loop, like big decodes.
            return await asyncio.to_thread(decompress, body, encoding, limit)
        return decompress(body, encoding, limit)

    def _check_known(self, name: str, version: int | None) -> None:
        """404 for an unknown model or version before any of the body is read or decoded."""
        entry = self._service.router.entry(name)
        known = version is None or version in entry.versions or version in entry.statuses
        if not known and entry.residence.on_demand:  # not resident: the versions it would load
            known = any(v.version == version for v in entry.source.versions)
        if not known:
            raise NotFound(f"unknown version {version} of model '{name}'")

    async def _infer_v2(self, call: Call, name: str, version: int | None, receive: Receive, send: Send) -> None:
        self._check_known(name, version)
        body = await self._body(call, receive)
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
            if len(body) > _OFFLOAD_BYTES:
                request, prefs = await asyncio.to_thread(decode)
            else:
                request, prefs = decode()
        except TensorgateError as exc:
            self._service.count_failure(name, version, exc)
            raise
        payload, json_length = await self._run(call, request, partial(encode_infer, prefs=prefs, shared=shared))
        extra = [] if json_length is None else [(b"inference-header-content-length", str(json_length).encode())]
        await self._send(call, send, 200, payload, [_BINARY if json_length is not None else _JSON, *extra])

    async def _predict_v1(self, call: Call, name: str, version: int | None, receive: Receive, send: Send) -> None:
        self._check_known(name, version)
        body = await self._body(call, receive)
        target = await self._service.route_resident(name, version)
        specs, batched, limits = target.specs.inputs, target.specs.max_batch_size > 0, self._settings.limits
        try:
            if len(body) > _OFFLOAD_BYTES:
                request, rows = await asyncio.to_thread(_decode_v1, body, name, version, specs, batched, limits)
            else:
                request, rows = _decode_v1(body, name, version, specs, batched, limits)
        except TensorgateError as exc:
            self._service.count_failure(name, version, exc)
            raise
        document = await self._run(call, request, partial(encode_predict, rows=rows))
        await self._json(call, send, 200, document)

    async def _run(self, call: Call, request: InferRequest, encode: Callable[[InferResponse], T]) -> T:
        """Call the core while watching the connection (a client that leaves cancels its request),
        then encode the answer: both inside the request's span, the encoding as its own child span."""
        if not request.request_id:  # decoders that cannot carry the ids (V1) get them here
            request = _with_ids(request, call)
        tenancy = self._settings.tenancy
        if tenancy.enabled:
            tenant = tenancy.resolve(call.identity, call.headers.get(tenancy.header_key))
            if tenant is not SHARED_TENANT:
                request = request.with_context(request.request_id, request.traceparent, tenant)
        task = asyncio.current_task()
        assert task is not None
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
            watch = call.connection.arm(task) if call.connection is not None else None
            sticky = self._service.sticky_header(request.model)
            key = None if sticky is None else call.header(sticky.encode("latin-1"))
            try:
                response = await self._service.infer(request, key)
            except asyncio.CancelledError:
                if watch is not None and watch.disconnected:
                    task.uncancel()
                    raise Cancelled("the client disconnected") from None
                if self._service.draining:  # the exit timeout ran out: the table's answer, not uvicorn's bare 500
                    task.uncancel()
                    raise Unavailable("the server is shutting down; retry the request", retry_after_s=1.0) from None
                raise
            finally:
                if watch is not None:
                    watch.close()
            span.record(response)
            call.version = str(response.version)
            call.queue_s = response.queue_s
            call.compute_s = response.compute_s
            with span.child("encode"):
                return encode(response)

    def _v1_status(self, name: str, version: int | None) -> dict[str, Any]:
        entry = self._service.router.entry(name)
        statuses = [s for v, s in sorted(entry.statuses.items()) if version is None or v == version]
        if version is not None and not statuses:
            raise NotFound(f"unknown version {version} of model '{name}'")
        states = {
            "READY": "AVAILABLE",
            "LOADING": "LOADING",
            "WARMING": "LOADING",
            "DRAINING": "UNLOADING",
            "UNLOADED": "END",
            "FAILED": "END",
        }
        return {
            "model_version_status": [
                {
                    "version": str(s.version),
                    "state": states[s.state.value],
                    "status": {"error_code": "OK" if not s.reason else "UNKNOWN", "error_message": s.reason},
                }
                for s in statuses
            ]
        }

    # -- responses -------------------------------------------------------------------------------

    async def _send(self, call: Call, send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        call.status = status
        # An explicit length spares every response uvicorn's chunked framing.
        out = [
            *headers,
            (b"content-length", str(len(body)).encode()),
            (b"x-request-id", call.request_id.encode("latin-1")),
            NOSNIFF,
        ]
        if self._service.draining:
            out.append(_CLOSE)  # tell keep-alive clients and proxies to reconnect elsewhere
        await send({"type": "http.response.start", "status": status, "headers": out})
        await send({"type": "http.response.body", "body": b"" if call.method == "HEAD" else body})

    async def _json(self, call: Call, send: Send, status: int, document: Any) -> None:
        await self._send(call, send, status, dumps(document), [_JSON])

    async def _empty(self, call: Call, send: Send, status: int) -> None:
        await self._send(call, send, status, b"", [])

    async def _error(self, call: Call, send: Send, exc: TensorgateError) -> None:
        headers = [_JSON]
        if exc.retry_after_s is not None:
            headers.append((b"retry-after", str(max(1, round(exc.retry_after_s))).encode()))
        if isinstance(exc, _WrongMethod):  # a 405 names the methods the route takes (RFC 9110 15.5.6)
            headers.append((b"allow", exc.allow))
        if isinstance(exc, Unauthenticated):  # a 401 names the scheme to use (RFC 9110 11.6.1)
            headers.append((b"www-authenticate", b'Bearer realm="tensorgate"'))
        try:
            await self._send(call, send, exc.http_status, dumps({"error": exc.message}), headers)
        except Exception:  # the response had already started, or the client is gone
            log.debug("could not send the error response for %s", call.path)

    def _access(self, call: Call, started: float) -> None:
        if not self._access_log.enabled:
            return
        self._access_log.record(
            call.request_id,
            "http",
            call.method,
            call.path[:200],
            call.model,
            call.version,
            call.status,
            call.queue_s,
            call.compute_s,
            self._clock.now() - started,
            None if call.identity is None else call.identity.name,
        )


def _load_config(parameters: dict[str, Any]) -> str | None:
    """The ``config`` override of a load request. Model files in the request (Triton's ``file:``
    parameters) are refused: this server loads only what its repository holds."""
    if any(isinstance(key, str) and key.startswith("file:") for key in parameters):
        raise InvalidInput("this server loads models only from its repository; 'file:' parameters are refused")
    config = parameters.get("config")
    if config is not None and not isinstance(config, str):
        raise InvalidInput("the 'config' parameter must be a string holding a JSON model configuration")
    return config


def _decode_v1(
    body: bytes, name: str, version: int | None, specs: tuple[TensorSpec, ...], batched: bool, limits: DecodeLimits
) -> tuple[InferRequest, bool]:
    return decode_predict(loads_object(body, limits), name, version, specs, batched)


def _with_ids(request: InferRequest, call: Call) -> InferRequest:
    return request.with_context(call.request_id, call.header(b"traceparent"), request.tenant)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
