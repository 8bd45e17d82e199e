"""The one door every protocol goes through: inference, generation, health, metadata, statistics and the
repository API.

HTTP (V2, V1, OpenAI, generate) and gRPC are thin translations of these calls, so a feature written
here works on all of them, and the protocols never reach past this object to the manager, the
router or the repository control. A request is routed once: :meth:`InferenceService.resolve` names
its :class:`~tensorgate.models.target.Target`, which decodes, runs and reports one version.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tensorgate.decoupled import ResponseStream
from tensorgate.errors import NotFound, TensorgateError
from tensorgate.models import router
from tensorgate.models.manager import ModelManager
from tensorgate.models.repository_control import RepositoryControl
from tensorgate.models.response_cache import statistics_of
from tensorgate.models.servable import VersionState, VersionStatus
from tensorgate.models.target import Target, generates_text
from tensorgate.models.triton_config import triton_config
from tensorgate.models.version_loader import declared_metadata
from tensorgate.repository.source import ModelSource
from tensorgate.types import InferRequest, InferResponse, ModelMetadata
from tensorgate.version import __version__

SERVER_NAME = "tensorgate"
SERVER_VERSION = __version__
EXTENSIONS = ("binary_tensor_data", "schedule_policy", "sequence", "statistics", "model_repository")

# Reads one request header (gRPC: metadata key) by its lower-case name: how a protocol hands the
# service a sticky key without the service knowing where it came from.
HeaderReader = Callable[[str], str | None]


@dataclass(frozen=True, slots=True)
class ModelListing:
    name: str
    generates_text: bool  # its latest READY version generates text (the OpenAI models list)


class InferenceService:
    def __init__(self, manager: ModelManager, repository: RepositoryControl | None = None) -> None:
        self._manager = manager
        manager.run_step = _PipelineSteps(self)  # a pipeline's steps are routed as clients' requests are
        # The model control mode and the repository API (off unless the server sets explicit mode).
        self._repository = repository if repository is not None else RepositoryControl(manager, "none", None)
        self.draining = False
        self.started = False
        self.name = SERVER_NAME  # the server's name in its metadata (server.server_name)
        self.extensions: tuple[str, ...] = EXTENSIONS  # the server adds those its settings turn on
        self._clock = manager.clock

    @property
    def manager(self) -> ModelManager:
        """For the server and the status report (the models layer); never for a protocol."""
        return self._manager

    def attach_repository(self, repository: RepositoryControl) -> None:
        """The server's repository control, once the repository is known (at start)."""
        self._repository = repository

    # -- health ----------------------------------------------------------------------------------

    def live(self) -> bool:
        # Liveness never depends on model state or load, so overload cannot cause restarts.
        return True

    def ready(self) -> bool:
        return self.started and not self.draining and self._manager.all_ready()

    def model_ready(self, name: str, version: int | None) -> bool:
        """Whether the model (or that version) takes requests now; 404 for an unknown one."""
        entry = router.find_entry(self._manager, name)
        if version is None:
            return entry.latest_ready() is not None and not self.draining
        if version not in entry.versions and version not in entry.statuses:
            raise NotFound(f"Request for unknown model: '{name}' version {version} is not found")
        found = entry.versions.get(version)
        return found is not None and found.ready and not self.draining

    def version_statuses(self, name: str, version: int | None) -> list[VersionStatus]:
        """The model's versions as the repository index shows them (one, where ``version`` is given:
        404 when the model has no such version)."""
        entry = router.find_entry(self._manager, name)
        statuses = [s for v, s in sorted(entry.statuses.items()) if version is None or v == version]
        if version is not None and not statuses:
            raise NotFound(f"Request for unknown model: '{name}' version {version} is not found")
        return statuses

    def knows(self, name: str) -> bool:
        """Whether a model of this name is in the repository (its name was checked when it was found)."""
        return name in self._manager.models

    def models(self) -> list[ModelListing]:
        """Every model the server knows, by name."""
        return [
            ModelListing(name, generates_text(entry.latest_ready()))
            for name, entry in sorted(self._manager.models.items())
        ]

    # -- metadata --------------------------------------------------------------------------------

    def server_metadata(self) -> dict[str, Any]:
        return {"name": self.name, "version": SERVER_VERSION, "extensions": list(self.extensions)}

    def metadata(self, name: str, version: int | None) -> ModelMetadata:
        entry = router.find_entry(self._manager, name)
        if entry.residence.on_demand and not entry.versions and version is None:
            return declared_metadata(entry.source)  # not resident: what its configuration declares
        found = router.loaded(entry, name, version)
        versions = tuple(sorted(v for v, mv in entry.versions.items() if mv.state is VersionState.READY))
        return found.metadata(versions if version is None else (found.version,))

    def residency(self, name: str) -> dict[str, Any] | None:
        """The model's memory residency (mode, state, measured bytes) where the server has a memory
        budget or on-demand models; None otherwise (nothing to show)."""
        entry = router.find_entry(self._manager, name)
        memory = self._manager.memory
        return memory.status(entry) if memory.enabled else None

    def config(self, name: str, version: int | None) -> dict[str, Any]:
        """The version's configuration in Triton's ``model_config`` shape (see ``triton_config``)."""
        found = router.loaded(router.find_entry(self._manager, name), name, version)
        devices = [view.device for view in found.instances()]
        return triton_config(found.metadata((found.version,)), found.specs.batch, found.queue_settings, devices)

    def traffic(self, name: str) -> dict[str, Any]:
        """The model's traffic split, canary rollout and shadow as they stand (``/v2/models/{m}/rollout``)."""
        entry = router.find_entry(self._manager, name)
        if entry.traffic is None:
            latest = entry.latest_ready()
            return {"shares": {} if latest is None else {str(latest.version): 100.0}, "rollout": None, "shadow": None}
        return entry.traffic.status()

    def statistics(self, name: str | None, version: int | None) -> list[dict[str, Any]]:
        """Per-version cumulative counters in the shape of Triton's statistics extension."""
        models = self._manager.models
        if name is None:
            targets = [v for entry in models.values() for v in entry.versions.values()]
        elif version is None:
            targets = list(router.find_entry(self._manager, name).versions.values())
        else:
            targets = [router.loaded(router.find_entry(self._manager, name), name, version)]
        return [
            v.statistics.document(v.name, v.version, statistics_of(None if v.cache is None else v.cache.counts))
            for v in sorted(targets, key=lambda v: (v.name, v.version))
        ]

    # -- the repository API (Triton's model repository extension) ---------------------------------

    def authorize_repository(self, *, changes: bool) -> None:
        """403 where the model control mode does not open the call (``changes``: load or unload)."""
        self._repository.authorize(changes=changes)

    async def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return await self._repository.index(ready_only=ready_only)

    async def load_model(self, name: str, config_json: str | None = None) -> None:
        await self._repository.load(name, config_json)

    async def unload_model(self, name: str) -> None:
        await self._repository.unload(name)

    # -- inference -------------------------------------------------------------------------------

    def resolve(self, name: str, version: int | None, headers: HeaderReader | None = None) -> Target:
        """The route of one request: 404 for an unknown model or version (before any body is read),
        503 while the server has not named its models yet. ``headers`` reads the sticky key of a
        model with a traffic split."""
        manager = self._manager
        entry = router.find_entry(manager, name)
        router.check_version(entry, name, version)
        traffic = entry.traffic
        key = None if traffic is None or headers is None else headers(traffic.sticky_header)
        return Target(entry, name, version, key, manager.memory, self._clock)

    async def infer(self, request: InferRequest, headers: HeaderReader | None = None) -> InferResponse:
        """Route and run one request that is already decoded."""
        return await self.resolve(request.model, request.version, headers).infer(request)

    def decoupled(self, name: str) -> bool:
        """Whether the model answers with any number of responses (``model_transaction_policy``), so a
        protocol picks its streaming path; False for a model the server does not know (its call then
        fails as any other would)."""
        entry = self._manager.models.get(name)
        return entry is not None and entry.source.config.model_transaction_policy.decoupled

    async def stream(self, request: InferRequest, headers: HeaderReader | None = None) -> ResponseStream:
        """Route and run one decoded request as a stream of responses (``Target.stream``)."""
        return await self.resolve(request.model, request.version, headers).stream(request)

    def count_failure(self, name: str, version: int | None, error: TensorgateError) -> None:
        """Count a request for a known model that failed before it could be routed (a body that
        could not be decoded); an unknown model or version creates no metric series."""
        with contextlib.suppress(TensorgateError):
            self.resolve(name, version).count_failure(error)


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
