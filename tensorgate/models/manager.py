"""ModelManager: load, warm up, mark ready, drain and unload model versions.

States of a version: LOADING -> WARMING -> READY -> DRAINING -> UNLOADED, or FAILED with a reason.
Only READY versions take traffic. A version that fails to load is FAILED alone: other versions
and models keep serving.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tensorgate.backends.base import LoadSpec
from tensorgate.clock import Clock
from tensorgate.config.model_config import DynamicBatching
from tensorgate.errors import ModelLoadError
from tensorgate.instances.base import Instance, InstanceDied
from tensorgate.instances.factory import create_instance, placements
from tensorgate.instances.pool import InstancePool
from tensorgate.models.model_version import ModelVersion, VersionState, VersionStatus
from tensorgate.models.specs import resolve_specs
from tensorgate.models.warmup import warm_up
from tensorgate.observability.metrics import Metrics
from tensorgate.observability.tracing import NOOP_TRACER, Tracer
from tensorgate.repository.source import ModelSource, VersionSource
from tensorgate.scheduling.scheduler import QueueSettings

log = logging.getLogger(__name__)

_PLATFORMS = {"onnxruntime": "onnxruntime_onnx", "python": "python", "llm": "pytorch_causal_lm"}


@dataclass(slots=True)
class ModelEntry:
    source: ModelSource
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    statuses: dict[int, VersionStatus] = field(default_factory=dict)
    problem: str = ""

    def latest_ready(self) -> ModelVersion | None:
        """The highest READY version; a loop rather than a sort, because every request asks."""
        best: ModelVersion | None = None
        for version in self.versions.values():
            if version.ready and (best is None or version.version > best.version):
                best = version
        return best


def _queue_settings(db: DynamicBatching | None) -> QueueSettings:
    db = db or DynamicBatching()
    return QueueSettings(
        priority_levels=db.priority_levels,
        default_priority=db.default_priority,
        max_queue_size=db.max_queue_size,
        default_timeout_s=None if db.default_timeout_ms is None else db.default_timeout_ms / 1000.0,
    )


class ModelManager:
    def __init__(self, clock: Clock, metrics: Metrics) -> None:
        self.tracer: Tracer = NOOP_TRACER  # the server sets its tracer here before load_all
        self._clock = clock
        self._metrics = metrics
        self.models: dict[str, ModelEntry] = {}

    async def load_all(self, sources: list[ModelSource]) -> None:
        for source in sources:
            self.models[source.name] = ModelEntry(source)
        await asyncio.gather(*(self._load_model(self.models[s.name]) for s in sources))

    async def _load_model(self, entry: ModelEntry) -> None:
        source = entry.source
        if source.problems:
            entry.problem = "; ".join(source.problems)
            log.error("model %s cannot be loaded: %s", source.name, entry.problem)
            return
        for vsource in source.versions:
            entry.statuses[vsource.version] = VersionStatus(source.name, vsource.version, VersionState.LOADING)
        for vsource in source.versions:
            await self._load_version(entry, vsource)

    async def _load_version(self, entry: ModelEntry, vsource: VersionSource) -> None:
        source = entry.source
        name, version = source.name, vsource.version
        status = entry.statuses[version]
        if source.backend == "llm":  # generative: a continuous-batching engine instead of instances
            from tensorgate.models.generative import load_generative_version  # imports torch: only when needed

            await load_generative_version(source, vsource, status, entry.versions, self._clock, self._metrics)
            return
        started = self._clock.now()
        instances: list[Instance] = []
        try:
            for index, placement in enumerate(placements(source.config.instance_group, source.device_id)):
                spec = LoadSpec(name, version, vsource.artifact, vsource.directory, source.config, placement.device)
                instance = create_instance(f"{name}_{version}_{index}", source.backend, spec, placement)
                instances.append(instance)
                await instance.start()
            first = instances[0]
            specs = resolve_specs(
                name, first.input_specs(), first.output_specs(), source.config, source.request_input_shape
            )
            vmetrics = self._metrics.for_version(name, version)
            vmetrics.metrics.load_seconds.labels(name, str(version)).observe(self._clock.now() - started)
            model_version = ModelVersion(
                name,
                version,
                _PLATFORMS.get(source.backend, source.backend),
                specs,
                InstancePool(instances),
                _queue_settings(source.config.dynamic_batching),
                self._clock,
                vmetrics,
                self.tracer,
            )
            warm = functools.partial(
                warm_up,
                samples=source.config.warmup,
                specs=specs.inputs,
                batched=specs.max_batch_size > 0,
                directory=vsource.directory,
            )
            # Wired before the warm-up: a worker that dies warming up is restarted, warmed and
            # counted like one that dies serving.
            for instance in instances:
                _wire(instance, model_version, warm)
            status.state = VersionState.WARMING
            warm_started = self._clock.now()
            await _warm_all(instances, warm)
            vmetrics.metrics.warmup_seconds.labels(name, str(version)).observe(self._clock.now() - warm_started)
        except ModelLoadError as exc:
            status.state, status.reason = VersionState.FAILED, str(exc)
            log.error("model %s version %d failed to load: %s", name, version, exc)
            await _close_all(instances)
            return
        except Exception:  # a backend bug must fail this version, not the server
            # The detail (which may hold paths) goes to the log; clients see a generic reason.
            status.state, status.reason = (
                VersionState.FAILED,
                "the backend failed to load the model; see the server log",
            )
            log.exception("model %s version %d failed to load", name, version)
            await _close_all(instances)
            return
        for instance in instances:  # published once READY, so a version that failed shows no healthy instance
            vmetrics.instance_health(instance.name, instance.healthy)
        model_version.state = VersionState.READY
        status.state = VersionState.READY
        entry.versions[version] = model_version
        vmetrics.metrics.model_ready.labels(name, str(version)).set(1)
        log.info(
            "model %s version %d is READY (%d instance(s), max batch %d, %.0f ms)",
            name,
            version,
            len(instances),
            specs.max_batch_size,
            (self._clock.now() - started) * 1000,
        )

    def all_ready(self) -> bool:
        """Every model that should serve has at least one READY version with a healthy instance."""
        return all(entry.latest_ready() is not None for entry in self.models.values())

    async def aclose(self, drain_timeout_s: float) -> None:
        versions = [v for entry in self.models.values() for v in entry.versions.values()]
        await asyncio.gather(*(v.aclose(drain_timeout_s) for v in versions))


def _wire(instance: Instance, version: ModelVersion, warm: Callable[[Instance], Awaitable[None]]) -> None:
    """Connect an instance to its version: health, restarts and losses reach the metrics and the
    scheduler, and a restarted instance runs ``warm`` before it rejoins rotation."""
    instance.on_health_change = _health_listener(version)
    instance.on_restart = _restart_listener(version)
    instance.on_lost = _lost_listener(version)
    instance.warm = warm
    if instance.pid is not None:  # in a worker process of its own: its CPU and memory too
        version.metrics.track_worker(instance.name, functools.partial(_pid_of, instance))


async def _warm_all(instances: list[Instance], warm: Callable[[Instance], Awaitable[None]]) -> None:
    """Warm every instance side by side.

    One that dies warming up (a worker killed, or out of memory) is left to its restart, which warms
    it before it rejoins: it is out of rotation meanwhile, so no request meets it cold, and the
    others serve. Only when every instance died does the version fail: then the warm-up itself is
    the likely cause (an input that crashes the model), and a restart would only repeat it.
    """
    results = await asyncio.gather(*(warm(i) for i in instances), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, InstanceDied):
            raise result
    died = [(i, r) for i, r in zip(instances, results, strict=True) if isinstance(r, InstanceDied)]
    if len(died) == len(instances):
        raise ModelLoadError(f"every instance died during warm-up (first: {died[0][1]})")
    for instance, error in died:
        log.warning("instance %s died during warm-up (%s); it rejoins once restarted and warmed", instance.name, error)


def _health_listener(version: ModelVersion) -> Callable[[Instance, bool], None]:
    def changed(instance: Instance, healthy: bool) -> None:
        version.metrics.instance_health(instance.name, healthy)
        if healthy:
            version.scheduler.poke()  # requests may be waiting for this instance

    return changed


def _restart_listener(version: ModelVersion) -> Callable[[Instance], None]:
    def restarted(instance: Instance) -> None:
        version.metrics.instance_restart(instance.name)

    return restarted


def _pid_of(instance: Instance) -> int | None:
    return instance.pid


def _lost_listener(version: ModelVersion) -> Callable[[Instance], None]:
    def lost(instance: Instance) -> None:
        version.scheduler.fail_stranded()  # when nothing healthy is left, what is queued is answered now

    return lost


async def _close_all(instances: list[Instance]) -> None:
    for instance in instances:
        try:
            await instance.aclose()
        except Exception:
            log.exception("closing instance %s after a failed load", instance.name)
