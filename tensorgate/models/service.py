"""The core call every protocol translates to: ``infer``, plus health, metadata and statistics.

HTTP and gRPC are thin layers over this one object, so a feature written here works on both.
"""

from __future__ import annotations

import contextlib
from typing import Any

from tensorgate.errors import NotFound, TensorgateError
from tensorgate.models.manager import ModelManager
from tensorgate.models.model_version import VersionState
from tensorgate.models.router import ModelRouter
from tensorgate.models.triton_config import triton_config
from tensorgate.types import InferRequest, InferResponse, ModelMetadata

SERVER_NAME = "tensorgate"
SERVER_VERSION = "0.1.0"
EXTENSIONS = ("binary_tensor_data", "schedule_policy", "statistics", "model_repository")


class InferenceService:
    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager
        self.router = ModelRouter(manager)
        self.draining = False
        self.started = False

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
        return {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": list(EXTENSIONS)}

    def metadata(self, name: str, version: int | None) -> ModelMetadata:
        found = self.router.loaded(name, version)
        entry = self.router.entry(name)
        versions = tuple(sorted(v for v, mv in entry.versions.items() if mv.state is VersionState.READY))
        return found.metadata(versions if version is None else (found.version,))

    def config(self, name: str, version: int | None) -> dict[str, Any]:
        """The version's configuration in Triton's ``model_config`` shape (see ``triton_config``)."""
        found = self.router.loaded(name, version)
        devices = [instance.device for instance in found.pool.instances]
        return triton_config(
            found.metadata((found.version,)), found.specs.batch, found.scheduler.queue_settings, devices
        )

    def index(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for name, entry in sorted(self.manager.models.items()):
            if not entry.statuses:
                rows.append({"name": name, "state": "UNAVAILABLE", "reason": entry.problem})
            for version, status in sorted(entry.statuses.items()):
                rows.append(
                    {
                        "name": name,
                        "version": str(version),
                        "state": status.state.value,
                        "reason": status.reason,
                    }
                )
        return rows

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
                        "cache_hit": {"count": 0, "ns": 0},
                        "cache_miss": {"count": 0, "ns": 0},
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

    async def infer(self, request: InferRequest) -> InferResponse:
        version = self.router.route(request.model, request.version)
        return await version.infer(request)

    def count_failure(self, name: str, version: int | None, error: TensorgateError) -> None:
        """Count a request for a loaded model that failed before ``infer`` (e.g. an undecodable body)."""
        with contextlib.suppress(TensorgateError):  # unknown models create no metric series
            self.router.loaded(name, version).count_failure(error)
