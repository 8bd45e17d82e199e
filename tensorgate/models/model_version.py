"""One loaded version of a model: its state, its specs, its instances and its scheduler."""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
from dataclasses import dataclass

from tensorgate.clock import Clock
from tensorgate.errors import InvalidInput, TensorgateError, Unavailable
from tensorgate.instances.base import Instance
from tensorgate.instances.health import HealthMonitor
from tensorgate.instances.pool import InstancePool
from tensorgate.models.response_cache import VersionCache
from tensorgate.models.specs import ResolvedSpecs
from tensorgate.models.validation import TensorRules
from tensorgate.observability.metrics import VersionMetrics
from tensorgate.observability.tracing import NOOP_TRACER, Tracer
from tensorgate.scheduling.scheduler import QueueSettings, Scheduler
from tensorgate.types import InferRequest, InferResponse, ModelMetadata

log = logging.getLogger(__name__)
_serials = itertools.count(1)


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


class ModelVersion:
    def __init__(
        self,
        name: str,
        version: int,
        platform: str,
        specs: ResolvedSpecs,
        pool: InstancePool,
        queue: QueueSettings,
        clock: Clock,
        metrics: VersionMetrics,
        tracer: Tracer = NOOP_TRACER,
    ) -> None:
        self.name = name
        self.version = version
        self.serial = next(_serials)  # this loaded copy, apart from any other load of the same version
        self.platform = platform
        self.specs = specs
        self.rules = TensorRules(name, specs.inputs, specs.outputs, specs.max_batch_size, specs.ragged_inputs)
        self._cuts = specs.ragged_outputs
        self.pool = pool
        self.state = VersionState.WARMING
        self.metrics = metrics
        self._clock = clock
        self.scheduler = Scheduler(name, version, pool, specs.batch, queue, clock, metrics, tracer)
        self.health: HealthMonitor | None = None  # the instances' health checks, started when it serves
        self.cache: VersionCache | None = None  # the response cache, where the model enables it

    @property
    def ready(self) -> bool:
        return self.state is VersionState.READY and self.pool.any_healthy()

    def metadata(self, versions: tuple[int, ...]) -> ModelMetadata:
        return ModelMetadata(
            name=self.name,
            versions=versions,
            platform=self.platform,
            inputs=self.specs.inputs,
            outputs=self.specs.outputs,
            max_batch_size=self.specs.max_batch_size,
        )

    async def infer(self, request: InferRequest) -> InferResponse:
        if not self.ready:
            self.metrics.outcome("unavailable")
            raise Unavailable(
                f"model '{self.name}' version {self.version} is not ready ({self.state.value})",
                retry_after_s=1.0,
            )
        try:
            rows, key = self.rules.check_inputs(request.inputs)
            self.rules.check_outputs(request.outputs)
        except InvalidInput:
            self.metrics.outcome("invalid")
            raise
        cache = self.cache
        if self._cuts:
            if cache is None:
                return await self._submit_cut(request, rows, key)
            return await cache.infer(
                request,
                lambda: self._submit_cut(request, rows, key),
                self.name,
                self.version,
                on_hit=self.count_cache_hit,
            )
        if cache is None:
            return await self.scheduler.submit(request, rows, key)
        return await cache.infer(
            request,
            lambda: self.scheduler.submit(request, rows, key),
            self.name,
            self.version,
            on_hit=self.count_cache_hit,
        )

    async def _submit_cut(self, request: InferRequest, rows: int, key: tuple[tuple[int, ...], ...]) -> InferResponse:
        """A model with outputs that follow a ragged input: the answer cut back to its own request's size."""
        response = await self.scheduler.submit(request, rows, key)
        outputs = dict(response.outputs)
        for output, source, axes in self._cuts:
            array = outputs.get(output)
            if array is None:
                continue
            sizes = request.inputs[source].shape
            if any(array.shape[axis] > sizes[axis] for axis in axes):
                cut = tuple(slice(0, sizes[axis]) if axis in axes else slice(None) for axis in range(array.ndim))
                outputs[output] = array[cut]  # a view: the padded rows are never copied
        return InferResponse(
            response.model,
            response.version,
            outputs,
            response.id,
            response.parameters,
            response.queue_s,
            response.compute_s,
        )

    def count_cache_hit(self, elapsed_ns: int) -> None:
        """A request answered from the response cache, ``elapsed_ns`` after it reached the cache: a
        success in the metrics (outcome and duration) and in Triton's statistics, whose ``success``
        counts cache hits while ``inference_count`` and ``execution_count`` do not."""
        self.metrics.outcome("success")
        self.metrics.request_seconds.observe(elapsed_ns / 1e9)
        stats = self.scheduler.stats
        stats.success_count += 1
        stats.success_ns += elapsed_ns

    def count_failure(self, error: TensorgateError) -> None:
        """Count a request that failed before reaching the scheduler (bad body for a known model)."""
        self.metrics.outcome(error.outcome)

    async def aclose(self, drain_timeout_s: float) -> None:
        """Finish what is queued and running within ``drain_timeout_s`` in all, then close the
        instances side by side (a stuck worker's kill grace is paid once, not once per worker)."""
        self.state = VersionState.DRAINING
        if self.cache is not None:  # its answers leave with it
            self.cache.close()
        if self.health is not None:  # no probe or restart while the instances stop
            await self.health.aclose()
        deadline = self._clock.now() + drain_timeout_s
        await self.scheduler.drain(drain_timeout_s)
        await self.scheduler.aclose(timeout_s=max(0.0, deadline - self._clock.now()))
        await asyncio.gather(*(self._close_instance(instance) for instance in self.pool.instances))
        self.state = VersionState.UNLOADED

    async def _close_instance(self, instance: Instance) -> None:
        self.metrics.untrack_worker(instance.name)
        try:
            await instance.aclose()
        except Exception:
            log.exception("closing instance %s failed", instance.name)
