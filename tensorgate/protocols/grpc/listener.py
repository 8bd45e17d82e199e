"""The gRPC listener: the inference service, health checking and reflection, over tensorgate's own
HTTP/2 (:mod:`tensorgate.protocols.grpc.http2`, read on the event loop; its connection module says
why not grpcio's server).

Started by the :class:`~tensorgate.server.Server` after the HTTP listeners and stopped right after
them. ``stop`` sends GOAWAY (no new calls; see ``GrpcServer.stop``) and lets calls in flight finish
within the grace period, which is the server's exit timeout; health ``Watch`` streams are told
NOT_SERVING and end. With ``refuse_when_unready`` the port takes no connection while the server is
not ready, for a balancer that cannot send a gRPC call twice (nginx).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from dataclasses import replace

from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

from tensorgate.clock import Clock
from tensorgate.models.service import InferenceService
from tensorgate.observability.tracing import Tracer
from tensorgate.protocols.grpc.call import CallSettings
from tensorgate.protocols.grpc.generated import _pool
from tensorgate.protocols.grpc.health import INFERENCE_SERVICE, ReadinessHealth
from tensorgate.protocols.grpc.http2.connection import Http2Limits
from tensorgate.protocols.grpc.methods import MethodTable
from tensorgate.protocols.grpc.server import GrpcServer
from tensorgate.protocols.grpc.servicer import GrpcSettings, InferenceServicer, add_to_server
from tensorgate.security.gate import Gate

log = logging.getLogger(__name__)

# Answers may be as large as protobuf allows (Triton's limit too). The receive limit bounds what
# clients make us allocate; answers are bounded by the model. As in Triton, a large output goes out
# (gRPC's 4 MiB default, or the request limit, would fail it after it ran and was counted a success).
MAX_SEND_BYTES = (1 << 31) - 1
# How often Watch streams of grpc.health.v1 see readiness changes (Check is always current).
HEALTH_REFRESH_S = 0.25
HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
WATCH_PATH = f"/{HEALTH_SERVICE}/Watch"


def _reflection_pool() -> object:
    """Our private descriptor pool, plus the health and reflection files, so reflection can describe
    every service this listener serves (see ``generate.py`` for why the pool is private)."""
    from grpc_reflection.v1alpha import reflection_pb2

    for module in (health_pb2, reflection_pb2):
        name = module.DESCRIPTOR.name
        try:
            _pool.POOL.FindFileByName(name)
        except KeyError:
            _pool.POOL.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    return _pool.POOL


class GrpcListener:
    def __init__(
        self,
        service: InferenceService,
        settings: GrpcSettings,
        tracer: Tracer,
        clock: Clock,
        *,
        host: str,
        port: int,
        max_message_bytes: int,
        limits: Http2Limits = Http2Limits(),
        tls: ssl.SSLContext | None = None,
        max_connections: int | None = None,
        gate: Gate | None = None,
        refuse_when_unready: bool = False,
    ) -> None:
        self.name = "grpc"
        self._service = service
        self._refuse_when_unready = refuse_when_unready
        if self._refuse_when_unready:
            settings = replace(settings, on_unavailable=self.readiness_changed)
        self._host, self._requested_port = host, port
        self._address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._health = ReadinessHealth(service)
        methods = MethodTable()
        add_to_server(InferenceServicer(service, settings, tracer, clock), methods)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, methods)
        names = (INFERENCE_SERVICE, HEALTH_SERVICE, reflection.SERVICE_NAME)
        reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
            reflection.aio.ReflectionServicer(names, pool=_reflection_pool()), methods
        )
        call_settings = CallSettings(max_receive_bytes=max_message_bytes, max_send_bytes=MAX_SEND_BYTES, gate=gate)
        self._server = GrpcServer(methods, call_settings, limits, tls=tls, max_connections=max_connections)
        self._port = 0
        self._refresher: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        return self._port

    async def start(self) -> None:
        try:
            self._port = await self._server.start(self._host, self._requested_port)
        except OSError as exc:
            raise OSError(f"gRPC cannot bind {self._address}: {exc.strerror or exc}") from exc
        self.readiness_changed()  # not ready yet while the models load: refused until they are
        self._refresher = asyncio.get_running_loop().create_task(self._refresh_health())

    def readiness_changed(self) -> None:
        """The server may have turned not ready (a call found a model unavailable, a stop began):
        with ``refuse_when_unready``, stop taking connections now rather than at the next look.
        Taking them again is the refresher's, which looks every ``HEALTH_REFRESH_S``."""
        server = self._server
        if not self._refuse_when_unready:
            return
        if server.accepting and not self._service.ready():
            server.pause()
            log.warning("gRPC port %d refuses connections: the server is not ready", self._port)

    async def follow_readiness(self) -> None:
        """Refuse connections while the server is not ready and take them again once it is (with
        ``refuse_when_unready``); the server calls it as it turns ready after loading its models."""
        self.readiness_changed()
        server = self._server
        if not server.accepting and self._service.ready():
            await server.resume()
            log.info("gRPC port %d takes connections again: the server is ready", self._port)

    async def _refresh_health(self) -> None:
        while True:
            try:
                await self._health.refresh()
                if self._refuse_when_unready:
                    await self.follow_readiness()
            except Exception:  # the boundary: a failed refresh (or listen) must not end health reporting
                log.exception("refreshing gRPC health statuses failed")
            await asyncio.sleep(HEALTH_REFRESH_S)

    async def stop(self, grace_s: float) -> None:
        """Health to NOT_SERVING, GOAWAY, then wait up to ``grace_s`` for calls in flight."""
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
        await self._health.enter_graceful_shutdown()
        await asyncio.sleep(0)  # Watch streams send NOT_SERVING; they never end alone, so end them
        await self._server.stop(grace_s, end_at_once=lambda call: call.path == WATCH_PATH)
