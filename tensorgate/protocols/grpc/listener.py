"""The gRPC listener: a grpc.aio server with the inference service, health checking and reflection.

Started by the :class:`~tensorgate.server.Server` after the HTTP listeners and stopped right after
them. ``stop`` sends GOAWAY at once (no new RPCs) and lets in-flight RPCs finish within the grace
period, which is the server's exit timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from tensorgate.clock import Clock
from tensorgate.models.service import InferenceService
from tensorgate.observability.tracing import Tracer
from tensorgate.protocols.grpc.generated import _pool
from tensorgate.protocols.grpc.health import INFERENCE_SERVICE, ReadinessHealth
from tensorgate.protocols.grpc.servicer import GrpcSettings, InferenceServicer, add_to_server

log = logging.getLogger(__name__)

# Answers may be as large as protobuf allows (Triton's limit too); see the server options below.
MAX_SEND_BYTES = (1 << 31) - 1
# How often Watch streams of grpc.health.v1 see readiness changes (Check is always current).
HEALTH_REFRESH_S = 0.25


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
    ) -> None:
        self.name = "grpc"
        self._address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._health = ReadinessHealth(service)
        self._server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", max_message_bytes),
                # The limit bounds what clients make us allocate; answers are bounded by the model.
                # As in Triton, a large output goes out (gRPC's 4 MiB default, or the request
                # limit, failed one after it ran and after it was counted a success).
                ("grpc.max_send_message_length", MAX_SEND_BYTES),
                ("grpc.so_reuseport", 0),  # a second server must not share our port silently
            ]
        )
        add_to_server(InferenceServicer(service, settings, tracer, clock), self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        reflection.enable_server_reflection(
            (INFERENCE_SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            self._server,
            pool=_reflection_pool(),
        )
        self._port = 0
        self._refresher: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        return self._port

    async def start(self) -> None:
        try:
            self._port = self._server.add_insecure_port(self._address)
        except RuntimeError as exc:  # grpc's way of saying the address is taken or invalid
            raise OSError(f"gRPC cannot bind {self._address}: address in use or not available") from exc
        if self._port == 0:
            raise OSError(f"gRPC cannot bind {self._address}")
        await self._server.start()
        self._refresher = asyncio.get_running_loop().create_task(self._refresh_health())

    async def _refresh_health(self) -> None:
        while True:
            try:
                await self._health.refresh()
            except Exception:  # the boundary: a failed refresh must not end health reporting
                log.exception("refreshing gRPC health statuses failed")
            await asyncio.sleep(HEALTH_REFRESH_S)

    async def stop(self, grace_s: float) -> None:
        """Health to NOT_SERVING, GOAWAY, then wait up to ``grace_s`` for in-flight RPCs."""
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
        await self._health.enter_graceful_shutdown()
        await self._server.stop(grace=grace_s)
