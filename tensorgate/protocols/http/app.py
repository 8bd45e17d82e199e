"""The HTTP front end: a plain ASGI application over the InferenceService.

For every request, in this order: the Host check, authentication and rate limits (before any of the
body is read), the route (one 404, one 405 with ``Allow``), the route's own checks and work, and
one error answer for anything that fails (the error table's status, ``{"error": ...}``). The routes
live by job: inference (V2, V1), management (repository, shared memory, status), text generation
(OpenAI, the generate extension). It is written against ASGI directly rather than a framework
because on a 2-core machine the per-request cost of routing and request objects is a visible share
of a 1 ms inference.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from tensorgate.clock import Clock
from tensorgate.errors import Cancelled, InternalError, NotFound, TensorgateError, Unavailable
from tensorgate.models.service import InferenceService
from tensorgate.models.status import StatusReport
from tensorgate.names import check_model_name
from tensorgate.observability.access_log import AccessLog
from tensorgate.observability.tracing import NOOP_TRACER, Tracer
from tensorgate.protocols.access import http_access
from tensorgate.protocols.http.body import Receive
from tensorgate.protocols.http.disconnect import CONNECTION_EXTENSION
from tensorgate.protocols.http.exchange import Call, Responder, Send
from tensorgate.protocols.http.generate_routes import GenerateRoutes
from tensorgate.protocols.http.inference_routes import HttpSettings, InferenceRoutes
from tensorgate.protocols.http.management_routes import ManagementRoutes
from tensorgate.protocols.http.openai_routes import OpenAIRoutes
from tensorgate.protocols.http.routes import Handler, Params, RouteTable, split_path
from tensorgate.protocols.request_ids import RequestIds
from tensorgate.protocols.shared_memory import SharedMemoryRegions
from tensorgate.security.gate import Gate
from tensorgate.security.hosts import HostAllowlist

__all__ = ["HttpApp", "HttpSettings"]

log = logging.getLogger(__name__)

Scope = dict[str, Any]


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
        self._service = service
        self._clock = clock
        self._access_log = access if access is not None else AccessLog(enabled=False)
        self._ids = RequestIds()
        self._out = Responder(lambda: service.draining)
        regions = shared_memory if shared_memory is not None else SharedMemoryRegions(enabled=False)
        report = status if status is not None else StatusReport(service, clock)
        self._routes = RouteTable()
        InferenceRoutes(service, self._out, settings, tracer, regions).register(self._routes)
        ManagementRoutes(service, self._out, settings, regions, report).register(self._routes)
        OpenAIRoutes(service, self._out, settings.max_body_bytes).register(self._routes)
        GenerateRoutes(service, self._out, settings.max_body_bytes).register(self._routes)

    def routes(self) -> list[tuple[str, str]]:
        """Every (method, path pattern) this app serves (HEAD too, wherever GET is)."""
        return self._routes.routes()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await _lifespan(receive, send)
            return
        if kind != "http":
            return
        headers = dict(scope["headers"])  # a repeated header keeps its last value, as before
        call = Call(scope["method"], scope["path"], headers, "")
        raw_path = scope.get("raw_path")
        if raw_path:
            call.raw_path = raw_path.decode("latin-1")
        client = scope.get("client")
        if client:
            call.peer_host = client[0]
        extensions = scope.get("extensions")
        watch = extensions.get(CONNECTION_EXTENSION) if extensions else None
        call.connection = watch
        call.request_id = self._ids.of(call.header(b"x-request-id"))
        started = self._clock.now()
        task = asyncio.current_task()
        assert task is not None
        if watch is not None:  # a client that leaves cancels its request (it leaves the queue at once)
            watch.arm(task)
        try:
            await self._route(call, receive, send)
        except TensorgateError as exc:
            await self._failed(call, send, exc)
        except asyncio.CancelledError:
            if watch is not None and watch.disconnected:
                task.uncancel()
                call.status = 499  # no answer: nobody is there to read it
            elif self._service.draining:  # the exit timeout ran out: the table's answer, not a bare 500
                task.uncancel()
                await self._failed(
                    call, send, Unavailable("the server is shutting down; retry the request", retry_after_s=1.0)
                )
            else:
                call.status = 499
                raise
        except Exception:
            log.exception("unhandled error on %s %s", call.method, call.path)
            await self._failed(call, send, InternalError("internal server error"))
        finally:
            if watch is not None:
                watch.close()
            self._access(call, started)

    async def _failed(self, call: Call, send: Send, exc: TensorgateError) -> None:
        if isinstance(exc, Cancelled):  # the client is gone: nobody to answer
            call.status = 499
        else:
            await self._out.error(call, send, exc)

    def _match(self, call: Call, parts: list[str]) -> tuple[Handler, Params]:
        try:
            return self._routes.match(call.method, call.path, parts)
        except NotFound:
            # Under /v{1,2}/models/ the next segment names a model whatever follows: a name that could
            # never exist (``..``) is 400 for what it is, as on the routes that take it.
            if len(parts) > 2 and parts[1] == "models" and parts[0] in ("v1", "v2"):
                check_model_name(parts[2])
            raise

    async def _route(self, call: Call, receive: Receive, send: Send) -> None:
        parts = split_path(call.raw_path)
        if self._hosts.checks:  # bound to loopback: a page that rebinds its name to us is refused
            self._hosts.check(call.header(b"host"))
        gate = self._gate
        access = http_access(parts)
        if not gate.enabled:
            handler, params = self._match(call, parts)
            if access == "admin":  # the repository API asks for an admin key even without authentication
                gate.check("admin", call.header(b"authorization"), call.header(b"x-api-key"))
            await handler(call, params, receive, send)
            return
        # Authentication is on: the caller is known (401), has the role (403) and is within its
        # limits (429) before the route is looked up or any of the body is read.
        call.identity = gate.check(access, call.header(b"authorization"), call.header(b"x-api-key"))
        gate.admit(call.identity)
        call.gate = gate
        try:
            handler, params = self._match(call, parts)
            await handler(call, params, receive, send)
        finally:
            gate.release(call.identity)

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


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
