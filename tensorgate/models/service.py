"""The core call every protocol translates to: ``infer``, plus health, metadata and statistics.

HTTP and gRPC are thin layers over this one object, so a feature written here works on both.
"""

from __future__ import annotations

import contextlib
from typing import Any

from tensorgate.errors import NotFound, TensorgateError
from tensorgate.models.manager import ModelEntry, ModelManager
from tensorgate.models.model_version import ModelVersion, VersionState
from tensorgate.models.repository_control import RepositoryControl
from tensorgate.models.response_cache import statistics_of
from tensorgate.models.router import ModelRouter
from tensorgate.models.traffic import TrafficState
from tensorgate.models.triton_config import triton_config
from tensorgate.models.version_loader import declared_metadata
from tensorgate.repository.source import ModelSource
from tensorgate.types import InferRequest, InferResponse, ModelMetadata

SERVER_NAME = "tensorgate"
SERVER_VERSION = "0.1.0"
EXTENSIONS = ("binary_tensor_data", "schedule_policy", "statistics", "model_repository")


class InferenceService:
    def __init__(self, manager: ModelManager, repository: RepositoryControl | None = None) -> None:
        self.manager = manager
        self.router = ModelRouter(manager)
        manager.run_step = _PipelineSteps(self)  # a pipeline's steps are routed as clients' requests are
        # The model control mode and the repository API (off unless the server sets explicit mode).
        self.repository = repository if repository is not None else RepositoryControl(manager, "none", None)
        self.draining = False
        self.started = False
        self.extensions: tuple[str, ...] = EXTENSIONS  # the server adds those its settings turn on
        self._clock = manager.clock

    # -- health ----------------------------------------------------------------------------------

    def live(self) -> bool:
        # Liveness never depends on model state or load, so overload cannot cause restarts.
        return True

    def ready(self) -> bool:
        return self.started and not self.draining and self.manager.all_ready()

    def model_ready(self, name: str, version: int | None) -> bool:
        entry = self.router.entry(name)
        if version is None:
            return entry.latest_ready() is not None and not self.draining
        if version not in entry.versions and version not in entry.statuses:
            raise NotFound(f"unknown version {version} of model '{name}'")
        found = entry.versions.get(version)
        return found is not None and found.ready and not self.draining

    # -- metadata --------------------------------------------------------------------------------

    def server_metadata(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": list(self.extensions)}

    def metadata(self, name: str, version: int | None) -> ModelMetadata:
        entry = self.router.entry(name)
        if entry.residence.on_demand and not entry.versions and version is None:
            return declared_metadata(entry.source)  # not resident: what its configuration declares
        found = self.router.loaded(name, version)
        versions = tuple(sorted(v for v, mv in entry.versions.items() if mv.state is VersionState.READY))
        return found.metadata(versions if version is None else (found.version,))

    def residency(self, name: str) -> dict[str, Any] | None:
        """The model's memory residency (mode, state, measured bytes) where the server has a memory
        budget or on-demand models; None otherwise (nothing to show)."""
        entry = self.router.entry(name)
        return self.manager.memory.status(entry) if self.manager.memory.enabled else None

    def config(self, name: str, version: int | None) -> dict[str, Any]:
        """The version's configuration in Triton's ``model_config`` shape (see ``triton_config``)."""
        found = self.router.loaded(name, version)
        devices = [instance.device for instance in found.pool.instances]
        return triton_config(
            found.metadata((found.version,)), found.specs.batch, found.scheduler.queue_settings, devices
        )

    def traffic(self, name: str) -> dict[str, Any]:
        """The model's traffic split, canary rollout and shadow as they stand (``/v2/models/{m}/rollout``)."""
        entry = self.router.entry(name)
        if entry.traffic is None:
            latest = entry.latest_ready()
            return {"shares": {} if latest is None else {str(latest.version): 100.0}, "rollout": None, "shadow": None}
        return entry.traffic.status()

    def sticky_header(self, name: str) -> str | None:
        """The lower-case header (gRPC metadata key) whose value pins a client to one version of a
        model with a traffic split; None when the model has none (nothing to read)."""
        entry = self.manager.models.get(name)
        traffic = entry.traffic if entry is not None else None
        return traffic.sticky_header if traffic is not None else None

    def statistics(self, name: str | None, version: int | None) -> list[dict[str, Any]]:
        """Per-version cumulative counters in the shape of Triton's statistics extension."""
        if name is None:
            targets = [v for entry in self.manager.models.values() for v in entry.versions.values()]
        elif version is None:
            targets = list(self.router.entry(name).versions.values())
        else:
            targets = [self.router.loaded(name, version)]
        out = []
        for mv in sorted(targets, key=lambda v: (v.name, v.version)):
            s = mv.scheduler.stats
            out.append(
                {
                    "name": mv.name,
                    "version": str(mv.version),
                    "last_inference": s.last_inference_ms,
                    "inference_count": s.inference_count,
                    "execution_count": s.execution_count,
                    "inference_stats": {
                        "success": {"count": s.success_count, "ns": s.success_ns},
                        "fail": {"count": s.fail_count, "ns": s.fail_ns},
                        "queue": {"count": s.queue_count, "ns": s.queue_ns},
                        "compute_input": {"count": s.compute_count, "ns": 0},
                        "compute_infer": {"count": s.compute_count, "ns": s.compute_ns},
                        "compute_output": {"count": s.compute_count, "ns": 0},
                        **statistics_of(None if mv.cache is None else mv.cache.counts),
                    },
                    "batch_stats": [
                        {
                            "batch_size": rows,
                            "compute_input": {"count": c, "ns": 0},
                            "compute_infer": {"count": c, "ns": ns},
                            "compute_output": {"count": c, "ns": 0},
                        }
                        for rows, (c, ns) in sorted(s.batch_stats.items())
                    ],
                }
            )
        return out

    # -- inference -------------------------------------------------------------------------------

    async def infer(self, request: InferRequest, traffic_key: str | None = None) -> InferResponse:
        """Route and run one request; ``traffic_key`` is its sticky key (see :meth:`sticky_header`)."""
        entry = self.router.entry(request.model)
        if entry.residence.on_demand:
            return await self._infer_on_demand(entry, request, traffic_key)
        return await self._infer_entry(entry, request, traffic_key)

    async def _infer_on_demand(
        self, entry: ModelEntry, request: InferRequest, traffic_key: str | None
    ) -> InferResponse:
        """As ``infer``, for an on-demand model: a request that finds it not loaded loads it (and waits,
        within its deadline). Counted as using it throughout, so the memory budget never evicts it
        from under its request, and its end is the model's last use."""
        residence = entry.residence
        residence.active += 1
        residence.last_used = self._clock.now()
        try:
            if not entry.versions and not entry.problem:  # a problem: its config is broken, or unloaded by the API
                remaining = await self.manager.memory.ensure_loaded(entry, request.timeout_s)
                if remaining is not None:  # the deadline covers the wait for the load
                    request = request.with_timeout(remaining)
            return await self._infer_entry(entry, request, traffic_key)
        finally:
            residence.active -= 1
            residence.last_used = self._clock.now()

    async def _infer_entry(self, entry: ModelEntry, request: InferRequest, traffic_key: str | None) -> InferResponse:
        version = self.router.route_entry(entry, request.model, request.version, traffic_key)
        traffic = entry.traffic
        if traffic is None:
            return await version.infer(request)
        return await self._infer_with_traffic(traffic, version, request)

    async def _infer_with_traffic(
        self, traffic: TrafficState, version: ModelVersion, request: InferRequest
    ) -> InferResponse:
        """As ``infer``, and the rollout sees how it ended; the shadow may get a copy of it."""
        started = self._clock.now()
        try:
            response = await version.infer(request)
        except TensorgateError as exc:
            traffic.observe(version.version, self._clock.now() - started, exc.http_status >= 500)
            raise
        traffic.observe(version.version, self._clock.now() - started, False)
        shadow = traffic.shadow
        if shadow is not None and version.version != shadow.version:
            shadow.offer(request, response, self.router.entry(request.model).versions.get(shadow.version))
        return response

    async def route_resident(self, name: str, version: int | None) -> ModelVersion:
        """The version that serves a request, for a protocol that needs its specs before decoding
        (V1 rows): an on-demand model that is not loaded is loaded first (within its default
        timeout; the request's own deadline then applies in ``infer``)."""
        entry = self.router.entry(name)
        if entry.residence.on_demand and not entry.versions and not entry.problem:
            await self.manager.memory.ensure_loaded(entry, None)
        return self.router.route_entry(entry, name, version)

    def count_failure(self, name: str, version: int | None, error: TensorgateError) -> None:
        """Count a request for a loaded model that failed before ``infer`` (e.g. an undecodable body)."""
        with contextlib.suppress(TensorgateError):  # unknown models create no metric series
            self.router.loaded(name, version).count_failure(error)


class _PipelineSteps:
    """What a pipeline needs of the server (``pipeline.StepRunner``): its steps routed as clients'
    requests are, and the repository's models as the manager knows them now."""

    def __init__(self, service: InferenceService) -> None:
        self._service = service

    async def run(self, request: InferRequest) -> InferResponse:
        return await self._service.infer(request)

    def source(self, model: str) -> ModelSource | None:
        entry = self._service.manager.models.get(model)
        return None if entry is None else entry.source

    def serving(self, model: str) -> tuple[int, ...]:
        entry = self._service.manager.models.get(model)
        return () if entry is None else tuple(version.serial for version in entry.versions.values())
