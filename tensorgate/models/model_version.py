"""One loaded version of a model run by a backend: its instances behind a dynamic-batching scheduler.

The plain :class:`~tensorgate.models.servable.Servable`: the instances run the model, the
scheduler admits, queues and batches requests for them, and the health monitor (started once it
serves) takes an instance that fails out of rotation.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

from tensorgate.clock import Clock
from tensorgate.errors import InvalidInput, TensorgateError, Unavailable
from tensorgate.instances.base import Instance
from tensorgate.instances.health import HealthMonitor
from tensorgate.instances.pool import InstancePool
from tensorgate.models.response_cache import VersionCache
from tensorgate.models.sequence_runner import SequenceRunner, SequenceSettings
from tensorgate.models.servable import InstanceView, VersionState
from tensorgate.models.specs import ResolvedSpecs
from tensorgate.models.validation import TensorRules
from tensorgate.observability.metrics import VersionMetrics
from tensorgate.observability.tracing import NOOP_TRACER, Tracer
from tensorgate.scheduling.scheduler import QueueSettings, Scheduler
from tensorgate.scheduling.sequences import SequenceTable
from tensorgate.scheduling.statistics import InferenceStatistics
from tensorgate.types import InferRequest, InferResponse, ModelMetadata

log = logging.getLogger(__name__)
# Numbers every loaded copy of any model apart (a reload of the same version gets a new one).
serials = itertools.count(1)


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
        self.serial = next(serials)  # this loaded copy, apart from any other load of the same version
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
        self.sequencing: SequenceSettings | None = None  # a sequence model's controls, state, strategy
        self.sequences: SequenceRunner | None = None  # its requests' path, once the model's table is attached

    def attach_sequences(self, table: SequenceTable) -> None:
        """A sequence model's version joins its model's table of open sequences."""
        assert self.sequencing is not None
        self.sequences = SequenceRunner(
            self.name, self, table, self.sequencing, self.scheduler, self.pool, self.rules, self.metrics
        )

    @property
    def ready(self) -> bool:
        return self.state is VersionState.READY and self.pool.any_healthy()

    @property
    def statistics(self) -> InferenceStatistics:
        return self.scheduler.stats

    @property
    def queue_settings(self) -> QueueSettings:
        return self.scheduler.queue_settings

    @property
    def queued(self) -> int:
        return self.scheduler.queued

    @property
    def running(self) -> int:
        return self.scheduler.running

    def instances(self) -> tuple[InstanceView, ...]:
        health, pool = self.health, self.pool
        views = []
        for instance in pool.instances:
            record = None if health is None else health.records.get(instance)
            views.append(
                InstanceView(
                    instance.name,
                    instance.device,
                    _health(instance),
                    pool.is_busy(instance),
                    instance.pid,
                    "" if record is None else record.last_error,
                )
            )
        return tuple(views)

    def worker_pids(self) -> tuple[int, ...]:
        return tuple(instance.pid for instance in self.pool.instances if instance.pid is not None)

    def serve(self) -> None:
        if self.health is not None:
            self.health.start()

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
        sequences = self.sequences
        if sequences is not None:
            # A retired version still serves the sequences that began on it, to their end.
            if not self.ready and not (self.state is VersionState.DRAINING and sequences.continues_here(request)):
                self.metrics.outcome("unavailable")
                raise Unavailable(
                    f"model '{self.name}' version {self.version} is not ready ({self.state.value})",
                    retry_after_s=1.0,
                )
            try:
                return await sequences.infer(request)
            except InvalidInput:
                self.metrics.outcome("invalid")
                raise
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
        self.scheduler.stats.cache_hit(elapsed_ns)

    def count_failure(self, error: TensorgateError) -> None:
        """Count a request that failed before reaching the scheduler (bad body for a known model)."""
        self.metrics.outcome(error.outcome)

    async def aclose(self, drain_timeout_s: float) -> None:
        """Finish what is queued and running within ``drain_timeout_s`` in all, then close the
        instances side by side (a stuck worker's kill grace is paid once, not once per worker)."""
        self.state = VersionState.DRAINING
        deadline = self._clock.now() + drain_timeout_s
        if self.sequences is not None:  # its open sequences end here (new ones begin on its successor)
            await self.sequences.drain(drain_timeout_s)
        if self.cache is not None:  # its answers leave with it
            self.cache.close()
        if self.health is not None:  # no probe or restart while the instances stop
            await self.health.aclose()
        await self.scheduler.drain(max(0.0, deadline - self._clock.now()))
        await self.scheduler.aclose(timeout_s=max(0.0, deadline - self._clock.now()))
        await asyncio.gather(*(self._close_instance(instance) for instance in self.pool.instances))
        self.state = VersionState.UNLOADED

    async def _close_instance(self, instance: Instance) -> None:
        self.metrics.untrack_worker(instance.name)
        try:
            await instance.aclose()
        except Exception:
            log.exception("closing instance %s failed", instance.name)


def _health(instance: Instance) -> str:
    """ok (in rotation), ejected (alive, out of rotation by its health checks) or down."""
    if not instance.healthy:
        return "down"
    return "ejected" if instance.ejected else "ok"
