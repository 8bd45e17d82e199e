"""Building one model version: start its instances, resolve its specs, warm it up.

The ModelManager decides what to load and when traffic moves; this module does one load and either
returns a warm version that is not yet serving, or raises :class:`ModelLoadError` with a reason a
client may read (the detail that could hold paths goes to the log), having closed what it started.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable

from tensorgate.backends.base import LoadSpec
from tensorgate.backends.registry import GENERATIVE, missing_runtime
from tensorgate.clock import Clock
from tensorgate.config.model_config import DynamicBatching, TensorConfig
from tensorgate.errors import ModelLoadError
from tensorgate.instances.base import Instance, InstanceDied
from tensorgate.instances.factory import create_instance, placements
from tensorgate.instances.health import HealthMonitor, finite_outputs
from tensorgate.instances.pool import InstancePool
from tensorgate.models.generative import load_generative_version
from tensorgate.models.model_version import ModelVersion
from tensorgate.models.pipeline import PipelineVersion, StepRunner, check_steps
from tensorgate.models.sequence_runner import check_model_tensors, sequence_settings
from tensorgate.models.servable import Servable, VersionState, VersionStatus
from tensorgate.models.specs import resolve_specs, without
from tensorgate.models.warmup import build_sample, warm_up
from tensorgate.observability.metrics import Metrics
from tensorgate.observability.tracing import Tracer
from tensorgate.repository.source import ModelSource, VersionSource
from tensorgate.scheduling.pace import Pace
from tensorgate.scheduling.scheduler import QueueSettings
from tensorgate.types import Array, DataType, ModelMetadata, TensorSpec

log = logging.getLogger(__name__)

_PLATFORMS = {
    "onnxruntime": "onnxruntime_onnx",
    "python": "python",
    "torch": "pytorch_libtorch",
    "llm": "pytorch_causal_lm",
}


def declared_metadata(source: ModelSource) -> ModelMetadata:
    """The metadata of a model that is not loaded (on demand, not resident): its configuration's
    declared inputs and outputs (none where it declares none: the model's own are read at load)."""

    def specs(declared: list[TensorConfig] | None) -> tuple[TensorSpec, ...]:
        found = []
        for tensor in declared or []:
            try:
                found.append(TensorSpec(tensor.name, DataType.parse(tensor.datatype), tuple(tensor.shape)))
            except ValueError:  # a wrong datatype fails the load, with its reason, when it comes
                continue
        return tuple(found)

    return ModelMetadata(
        name=source.name,
        versions=(),
        platform=_PLATFORMS.get(source.backend, source.backend),
        inputs=specs(source.config.inputs),
        outputs=specs(source.config.outputs),
        max_batch_size=source.config.max_batch_size or 0,
    )


def _queue_settings(db: DynamicBatching | None) -> QueueSettings:
    db = db or DynamicBatching()
    return QueueSettings(
        priority_levels=db.priority_levels,
        default_priority=db.default_priority,
        max_queue_size=db.max_queue_size,
        default_timeout_s=None if db.default_timeout_ms is None else db.default_timeout_ms / 1000.0,
        order=db.order,
        deadline_admission=db.deadline_admission,
    )


async def build_version(
    source: ModelSource,
    vsource: VersionSource,
    status: VersionStatus,
    clock: Clock,
    metrics: Metrics,
    tracer: Tracer,
    generation: int = 0,
    run_step: StepRunner | None = None,
) -> Servable:
    """Load and warm one version; ``status`` follows it (LOADING, WARMING). Raises ModelLoadError.

    ``generation`` counts earlier loads of the same version number in this server, so the instances
    of a reload are named apart from those of the copy that is still draining. ``run_step`` runs a
    pipeline's steps (the service's routing), for ``backend: pipeline``, whose steps are checked
    against the repository first (:func:`check_steps`).
    """
    try:
        if source.backend == "pipeline":  # no model of its own: the steps are the repository's models
            if run_step is None:
                raise ModelLoadError("pipelines need the server's routing to reach their steps")
            # Models that appear in one repository scan are applied side by side, each known to the
            # manager from the moment its apply starts: one turn of the loop lets those started
            # beside this one be known before its steps are looked up.
            await asyncio.sleep(0)
            reached = check_steps(source.name, source.config, run_step)
            return PipelineVersion(source.name, vsource.version, source.config, run_step, clock, metrics, reached)
        if source.config.model_transaction_policy.decoupled and source.backend != "python":
            raise ModelLoadError(
                f"model_transaction_policy decoupled is for Python models; this model's backend is {source.backend}"
            )
        if source.backend in GENERATIVE:  # a continuous-batching engine instead of instances
            return await load_generative_version(source, vsource, status, clock, metrics)
        return await _build_batching(source, vsource, status, clock, metrics, tracer, generation)
    except ModelLoadError:
        raise
    except ModuleNotFoundError as exc:  # an optional runtime this backend needs is not installed
        raise ModelLoadError(missing_runtime(source.backend, exc)) from exc
    except Exception as exc:  # a backend bug must fail this version, not the server
        log.exception("model %s version %d failed to load", source.name, vsource.version)
        raise ModelLoadError("the backend failed to load the model; see the server log") from exc


async def _build_batching(
    source: ModelSource,
    vsource: VersionSource,
    status: VersionStatus,
    clock: Clock,
    metrics: Metrics,
    tracer: Tracer,
    generation: int,
) -> ModelVersion:
    name, version = source.name, vsource.version
    started = clock.now()
    instances: list[Instance] = []
    suffix = "" if generation == 0 else f"_r{generation}"
    try:
        for index, placement in enumerate(placements(source.config.instance_group, source.device_id)):
            instance_name = f"{name}_{version}_{index}{suffix}"
            spec = LoadSpec(
                name, version, vsource.artifact, vsource.directory, source.config, placement.device, instance_name
            )
            instance = create_instance(instance_name, source.backend, spec, placement)
            instances.append(instance)
            await instance.start()
        first = instances[0]
        specs = resolve_specs(
            name, first.input_specs(), first.output_specs(), source.config, source.request_input_shape
        )
        sequencing = None
        if source.config.sequence_batching is not None:
            sequencing = sequence_settings(
                source.config.sequence_batching, specs.max_batch_size, len(instances), vsource.directory
            )
            check_model_tensors(name, sequencing, first.input_specs(), first.output_specs())
            specs = without(specs, sequencing.hidden_inputs, sequencing.hidden_outputs)
        vmetrics = metrics.for_version(name, version)
        metrics.load_seconds.labels(name, str(version)).observe(clock.now() - started)
        model_version = ModelVersion(
            name,
            version,
            _PLATFORMS.get(source.backend, source.backend),
            specs,
            InstancePool(instances),
            _queue_settings(source.config.dynamic_batching),
            clock,
            vmetrics,
            tracer,
            decoupled=source.config.model_transaction_policy.decoupled,
        )
        warm = functools.partial(
            warm_up,
            samples=source.config.warmup,
            specs=specs.inputs,
            batched=specs.max_batch_size > 0,
            directory=vsource.directory,
            extra=None if sequencing is None else sequencing.warmup_tensors,
        )
        # Wired before the warm-up: a worker that dies warming up is restarted, warmed and
        # counted like one that dies serving.
        for instance in instances:
            _wire(instance, model_version, warm)
        status.state = VersionState.WARMING
        warm_started = clock.now()
        reference = await _warm_all(instances, warm)
        metrics.warmup_seconds.labels(name, str(version)).observe(clock.now() - warm_started)
        if sequencing is not None:
            model_version.sequencing = sequencing
        if source.config.health_check.enabled:
            _monitor(model_version, source, vsource, reference)
    except BaseException:  # a failed load, or a cancelled one (shutdown): nothing it started survives it
        await _close_all(instances)
        raise
    for instance in instances:  # published once warm, so a version that failed shows no healthy instance
        vmetrics.instance_health(instance.name, instance.healthy)
    log.info(
        "model %s version %d is warm (%d instance(s), max batch %d, %.0f ms)",
        name,
        version,
        len(instances),
        specs.max_batch_size,
        (clock.now() - started) * 1000,
    )
    return model_version


def _monitor(
    version: ModelVersion, source: ModelSource, vsource: VersionSource, reference: dict[str, Array] | None
) -> None:
    """Health checks for the version: the probe sample is the first warm-up sample, which the model
    answered while warming up (without one, the monitor learns a real request's inputs once the
    model has answered them); the outputs the warm-up gave for it (else good probes of any instance)
    say which outputs must stay finite."""
    samples = source.config.warmup
    batched = version.specs.max_batch_size > 0
    extra = None if version.sequencing is None else version.sequencing.warmup_tensors
    sample = build_sample(samples[0], version.specs.inputs, batched, vsource.directory, extra) if samples else None
    monitor = HealthMonitor(
        f"{version.name}/{version.version}",
        version.pool,
        source.config.health_check,
        sample,
        None if reference is None else finite_outputs(reference),
        version.scheduler.poke,
        on_probe=lambda instance, ok: version.metrics.instance_probe(instance.name, ok),
    )
    version.health = version.scheduler.health = monitor
    checks = source.config.health_check
    # A sequence's requests are never hedged: two runs of one would race to write its state.
    if checks.enabled and checks.hang_detection and source.config.sequence_batching is None:
        version.scheduler.pace = Pace(checks.hang_floor_s, checks.hang_factor, checks.batch_timeout_s)


def _wire(
    instance: Instance, version: ModelVersion, warm: Callable[[Instance], Awaitable[dict[str, Array] | None]]
) -> None:
    """Connect an instance to its version: health, restarts and losses reach the metrics and the
    scheduler, and a restarted instance runs ``warm`` before it rejoins rotation."""
    instance.on_health_change = _health_listener(version)
    instance.on_restart = _restart_listener(version)
    instance.on_lost = _lost_listener(version)
    instance.warm = warm
    if instance.pid is not None:  # in a worker process of its own: its CPU and memory too
        version.metrics.track_worker(instance.name, functools.partial(_pid_of, instance))


async def _warm_all(
    instances: list[Instance], warm: Callable[[Instance], Awaitable[dict[str, Array] | None]]
) -> dict[str, Array] | None:
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
    return next((r for r in results if isinstance(r, dict)), None)


def _health_listener(version: ModelVersion) -> Callable[[Instance, bool], None]:
    def changed(instance: Instance, healthy: bool) -> None:
        version.metrics.instance_health(instance.name, healthy)
        if healthy:
            version.scheduler.poke()  # requests may be waiting for this instance
        elif instance.ejected:  # out by its health checks: with nothing left, what waits is answered (503)
            version.scheduler.fail_stranded()

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
