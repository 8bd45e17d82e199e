"""``grpc.health.v1.Health`` backed by the InferenceService's readiness.

Service ``""`` is the server's readiness (``/v2/health/ready``), and so is the inference service's
own name (``inference.GRPCInferenceService``, the gRPC health convention's fully qualified name);
service ``"<model>"`` is that model's readiness; any other name is NOT_FOUND. ``Check`` computes
the answer on each call, so it is never stale and, like the HTTP health routes, never queues
behind inference. ``Watch`` streams come from the statuses :meth:`ReadinessHealth.refresh`
publishes; the listener calls it on a short interval and :meth:`enter_graceful_shutdown` flips
everything to NOT_SERVING on shutdown.
"""

from __future__ import annotations

from typing import Any

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer

from tensorgate.errors import TensorgateError
from tensorgate.models.service import InferenceService
from tensorgate.protocols.grpc.generated import grpc_service_pb2 as pb

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

INFERENCE_SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name


class ReadinessHealth(HealthServicer):  # type: ignore[misc]
    def __init__(self, service: InferenceService) -> None:
        super().__init__()
        self._service = service
        self._shutting_down = False

    def status_of(self, name: str) -> Any:
        """SERVING / NOT_SERVING, or None for a name that is neither "" nor a known model."""
        if self._shutting_down:
            return NOT_SERVING
        if not self._service.knows(name):
            if name in ("", INFERENCE_SERVICE):
                return SERVING if self._service.ready() else NOT_SERVING
            return None
        try:
            return SERVING if self._service.model_ready(name, None) else NOT_SERVING
        except TensorgateError:
            return NOT_SERVING

    async def Check(self, request: Any, context: Any) -> Any:
        status = self.status_of(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service[:128]!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request: Any, context: Any) -> None:
        # Publish first, so a watcher's first answer is the current status, not the last refresh's.
        await self.refresh()
        await super().Watch(request, context)

    async def refresh(self) -> None:
        """Publish the current statuses for Watch streams (only changes wake a watcher)."""
        for name in ("", INFERENCE_SERVICE, *(model.name for model in self._service.models())):
            await self.set(name, self.status_of(name))

    async def enter_graceful_shutdown(self) -> None:
        self._shutting_down = True
        await super().enter_graceful_shutdown()
