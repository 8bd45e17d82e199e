"""What the service serves: one loaded copy of one version of a model, whatever runs it.

Three implementations, each owning what it needs and nothing it would have to fake:

- :class:`~tensorgate.models.model_version.ModelVersion`: a backend's instances behind a
  dynamic-batching scheduler, with health checks;
- :class:`~tensorgate.models.pipeline.PipelineVersion`: steps that are other models of the
  repository, each run through the service as a client's request would be;
- :class:`~tensorgate.models.generative.GenerativeVersion`: a causal language model behind a
  continuous-batching engine, which also streams generations (:class:`TextGenerator`).

The manager loads, serves and retires them; the service routes requests to them; the status page
and the statistics extension read them. None of those reads a field of one implementation.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from tensorgate.backends.base import Device
from tensorgate.errors import TensorgateError
from tensorgate.generation import GenerationStream, SamplingParams
from tensorgate.models.response_cache import VersionCache
from tensorgate.models.specs import ResolvedSpecs
from tensorgate.observability.metrics import VersionMetrics
from tensorgate.scheduling.scheduler import QueueSettings
from tensorgate.scheduling.statistics import InferenceStatistics
from tensorgate.types import InferRequest, InferResponse, ModelMetadata


class VersionState(enum.Enum):
    LOADING = "LOADING"
    WARMING = "WARMING"
    READY = "READY"
    DRAINING = "DRAINING"
    UNLOADED = "UNLOADED"
    FAILED = "FAILED"


@dataclass(slots=True)
class VersionStatus:
    """What the repository index reports for a version, loaded or not."""

    name: str
    version: int
    state: VersionState
    reason: str = ""


@dataclass(frozen=True, slots=True)
class InstanceView:
    """One instance as the status page and the model configuration show it."""

    name: str
    device: Device
    health: str  # ok (in rotation), ejected (alive, out by its health checks) or down
    busy: bool
    pid: int | None
    last_error: str


class Servable(Protocol):
    name: str
    version: int
    serial: int  # this loaded copy, apart from any other load of the same version
    platform: str  # Triton's platform name, which its clients show
    specs: ResolvedSpecs
    state: VersionState
    metrics: VersionMetrics
    cache: VersionCache | None  # the response cache, where the model enables it

    @property
    def statistics(self) -> InferenceStatistics:
        """Its counters for Triton's statistics extension."""
        ...

    @property
    def queue_settings(self) -> QueueSettings:
        """Its admission settings (the queue bound, priorities, the default timeout)."""
        ...

    @property
    def ready(self) -> bool:
        """READY and able to answer now (a version whose every instance is out is not)."""
        ...

    @property
    def queued(self) -> int:
        """Requests admitted and waiting (the memory budget never evicts a busy model)."""
        ...

    @property
    def running(self) -> int:
        """Work on its way through it now (batches on instances, runs of a pipeline, generations)."""
        ...

    def metadata(self, versions: tuple[int, ...]) -> ModelMetadata:
        """V2 model metadata, listing ``versions`` as the model's versions."""
        ...

    async def infer(self, request: InferRequest) -> InferResponse:
        """Run one request; raises :class:`TensorgateError` with the table's status. Called on the
        event loop by the service only, after routing; never blocks the loop."""
        ...

    def count_failure(self, error: TensorgateError) -> None:
        """Count a request that failed before reaching :meth:`infer` (an undecodable body)."""
        ...

    def instances(self) -> tuple[InstanceView, ...]:
        """Its instances as they stand (none for a pipeline: its steps' models hold them)."""
        ...

    def worker_pids(self) -> tuple[int, ...]:
        """Worker processes it runs in, for the memory budget's measure (none in-process)."""
        ...

    def serve(self) -> None:
        """It takes traffic from now on: start what runs while it serves (health checks). Called once
        by the manager, on the event loop, when it turns READY."""
        ...

    async def aclose(self, drain_timeout_s: float) -> None:
        """Finish what it admitted within ``drain_timeout_s``, then release everything it holds."""
        ...


@runtime_checkable
class TextGenerator(Protocol):
    """What a generative version offers the text-generation routes besides :meth:`Servable.infer`."""

    name: str
    version: int
    max_model_len: int

    def encode(self, text: str) -> list[int]: ...

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]: ...

    def token_text(self, token_id: int) -> str: ...

    def submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        priority: int | None = ...,
        timeout_s: float | None = ...,
        incremental: bool = ...,
    ) -> GenerationStream:
        """Admit one generation (raises InvalidInput, QueueFull or Unavailable at once)."""
        ...
