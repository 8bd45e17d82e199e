"""``backend: pipeline``: Triton's ensembles in our configuration form, steps of other models run in order.

Each step is a model of the repository, reached through the same routing as a client's request, so
it is queued and batched by its own scheduler: a step that two pipelines share batches requests of
both. Tensors pass from step to step as arrays, never re-encoded. The pipeline's deadline covers
all of it: each step gets what is left of the request's timeout, and a step that starts with none
left fails the request. A step's error fails the request with the step named, keeping the step's
status (a bad input is still 400, a model unavailable still 503).

Beyond Triton, a step may carry ``when: {input, equals}``: it runs only when that tensor (a pipeline
input or an earlier output) holds one value equal to ``equals``; a skipped step's outputs are absent
unless another step provides them, and so are the pipeline outputs that only it would have made.

At load (:func:`check_steps`), as Triton does for an ensemble, every model the steps reach must be in
the repository, and no chain of pipelines may lead back to one already on it: a pipeline that named
itself, or two that named each other, would otherwise recurse on every request.

With ``response_cache: {enable: true}`` a pipeline's answers are cached as a whole (a hit runs no
step), keyed also by which loaded copies of the models it reaches are serving, so reloading a step
model (new weights) never answers from the old copy's results.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from typing import Protocol

from tensorgate.clock import Clock
from tensorgate.config.model_config import ModelConfig, PipelineStep, StepCondition
from tensorgate.errors import (
    DeadlineExceeded,
    InternalError,
    InvalidInput,
    ModelLoadError,
    TensorgateError,
    Unavailable,
)
from tensorgate.models.model_version import serials
from tensorgate.models.response_cache import VersionCache
from tensorgate.models.servable import InstanceView, VersionState
from tensorgate.models.specs import resolve_specs
from tensorgate.models.validation import TensorRules
from tensorgate.observability.metrics import Metrics
from tensorgate.repository.source import ModelSource
from tensorgate.scheduling.scheduler import QueueSettings
from tensorgate.scheduling.statistics import InferenceStatistics
from tensorgate.types import Array, DataType, InferRequest, InferResponse, ModelMetadata, TensorSpec

log = logging.getLogger(__name__)

PLATFORM = "ensemble"  # Triton's name for it, which its clients show
# The pipelines a request is inside of, outermost first: a guard against a cycle that slipped past
# the load-time check (two pipelines whose configurations changed at the same moment).
_CALLERS: ContextVar[tuple[str, ...]] = ContextVar("tensorgate_pipeline_callers", default=())
# Request parameters every step gets as the pipeline got them: Triton's sequence parameters, so
# that steps which are sequence models keep their state per sequence (as Triton's ensembles do).
FORWARDED_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end")


class StepRunner(Protocol):
    """What a pipeline needs of the server: the service's routing (``InferenceService``)."""

    async def run(self, request: InferRequest) -> InferResponse:
        """Run one step's request as a client's request to that model would run (routed, queued
        and batched by the step model's own scheduler). Called on the event loop, once per step."""
        ...

    def source(self, model: str) -> ModelSource | None:
        """The repository's model of that name as the server knows it now; None where it has none.
        Called at load only (:func:`check_steps`)."""
        ...

    def serving(self, model: str) -> tuple[int, ...]:
        """The serial numbers of the loaded copies of that model now in service (empty when none):
        a cached pipeline answer is only good while they are the same. Called per cached request."""
        ...


def _declared(config: ModelConfig, which: str) -> tuple[TensorSpec, ...]:
    tensors = config.inputs if which == "inputs" else config.outputs
    assert tensors is not None  # the config validator requires both for a pipeline
    return tuple(TensorSpec(t.name, DataType.parse(t.datatype), tuple(t.shape)) for t in tensors)


def condition_holds(condition: StepCondition, tensors: Mapping[str, Array], step: str) -> bool:
    """Whether the tensor the condition names holds one value equal to ``equals``."""
    array = tensors.get(condition.input)
    if array is None:  # produced only by a step that was skipped
        return False
    if array.size != 1:
        raise InvalidInput(f"{step}: its condition reads '{condition.input}', which must hold exactly one value")
    value = array.reshape(-1)[0]
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(condition.equals, str):
        return str(value) == condition.equals
    if isinstance(condition.equals, bool):
        return bool(value) is condition.equals
    return bool(value == condition.equals)


def check_steps(name: str, config: ModelConfig, runner: StepRunner) -> tuple[str, ...]:
    """At load: every model the pipeline's steps reach (its steps, the steps of a pipeline among them,
    and so on) is in the repository, and none of those chains leads back to a pipeline already on it.
    Raises ModelLoadError saying which step is wrong; returns the models reached, in order.

    The reached pipelines' configurations are read as the server knows them now; ``config`` stands
    for ``name`` itself (it may be a new configuration, not yet the one the server holds).
    """
    reached: list[str] = []
    done: set[str] = set()

    def visit(path: list[str], steps: Sequence[PipelineStep]) -> None:
        owner = path[-1]
        for index, step in enumerate(steps, start=1):
            where = f"pipeline '{owner}' step {index} names model '{step.model}'"
            if step.model in path:
                chain = " -> ".join([*path[path.index(step.model) :], step.model])
                raise ModelLoadError(
                    f"{where}, which closes a cycle ({chain}): a pipeline cannot reach itself through "
                    "its steps, or every request would recurse"
                )
            source = runner.source(step.model)
            if source is None:
                raise ModelLoadError(f"{where}, which is not in the model repository")
            if step.model not in reached:
                reached.append(step.model)
            if step.model not in done and source.backend == "pipeline" and source.config.steps:
                visit([*path, step.model], source.config.steps)
            done.add(step.model)

    assert config.steps is not None  # the config validator requires them for a pipeline
    visit([name], config.steps)
    if config.response_cache.enable:
        for model in reached:
            source = runner.source(model)
            if source is not None and source.backend == "llm":
                raise ModelLoadError(
                    f"pipeline '{name}' enables response_cache, but it reaches model '{model}' (backend llm), "
                    "which samples: equal requests may rightly get different answers"
                )
    return tuple(reached)


class PipelineVersion:
    """A pipeline's loaded version (a :class:`~tensorgate.models.servable.Servable`): it holds no
    model and no queue of its own; each step is queued and batched by its model's scheduler."""

    def __init__(
        self,
        name: str,
        version: int,
        config: ModelConfig,
        runner: StepRunner,
        clock: Clock,
        metrics: Metrics,
        reached: tuple[str, ...] = (),
    ) -> None:
        """``reached``: the models :func:`check_steps` found the steps reach (their serving copies
        key the cached answers)."""
        assert config.steps is not None
        self.name = name
        self.version = version
        self.serial = next(serials)
        self.platform = PLATFORM
        self.steps: list[PipelineStep] = list(config.steps)
        self.specs = resolve_specs(name, _declared(config, "inputs"), _declared(config, "outputs"), config)
        self.rules = TensorRules(name, self.specs.inputs, self.specs.outputs, self.specs.max_batch_size)
        self.state = VersionState.WARMING
        self.metrics = metrics.for_version(name, version)
        self.statistics = InferenceStatistics()
        self.cache: VersionCache | None = None
        self.queue_settings = QueueSettings()
        self._runner = runner
        self._reached = reached
        self._clock = clock
        self._runs = 0  # requests running their steps now
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def ready(self) -> bool:
        return self.state is VersionState.READY

    @property
    def queued(self) -> int:
        return 0  # each step waits in its own model's queue

    @property
    def running(self) -> int:
        return self._runs

    def metadata(self, versions: tuple[int, ...]) -> ModelMetadata:
        return ModelMetadata(self.name, versions, self.platform, self.specs.inputs, self.specs.outputs, 0)

    def instances(self) -> tuple[InstanceView, ...]:
        return ()

    def worker_pids(self) -> tuple[int, ...]:
        return ()

    def serve(self) -> None:
        return None

    def count_failure(self, error: TensorgateError) -> None:
        self.metrics.outcome(error.outcome)

    def count_cache_hit(self, elapsed_ns: int) -> None:
        self.metrics.outcome("success")
        self.metrics.request_seconds.observe(elapsed_ns / 1e9)
        self.statistics.cache_hit(elapsed_ns)

    async def aclose(self, drain_timeout_s: float) -> None:
        """Let the requests running their steps finish (within ``drain_timeout_s``)."""
        self.state = VersionState.DRAINING
        if self.cache is not None:
            self.cache.close()
        if self._runs:
            try:
                await asyncio.wait_for(self._idle.wait(), drain_timeout_s)
            except TimeoutError:
                log.warning("pipeline %s version %d unloads with %d request(s) still running", *self._key())
        self.state = VersionState.UNLOADED

    def _key(self) -> tuple[str, int, int]:
        return self.name, self.version, self._runs

    async def infer(self, request: InferRequest) -> InferResponse:
        if not self.ready:
            self.metrics.outcome("unavailable")
            raise Unavailable(
                f"model '{self.name}' version {self.version} is not ready ({self.state.value})", retry_after_s=1.0
            )
        try:
            self.rules.check_inputs(request.inputs)
            self.rules.check_outputs(request.outputs)
        except InvalidInput:
            self.metrics.outcome("invalid")
            raise
        cache = self.cache
        if cache is None:
            return await self._answer(request)
        return await cache.infer(
            request,
            lambda: self._answer(request),
            self.name,
            self.version,
            on_hit=self.count_cache_hit,
            salt=self._serving_key(),
        )

    def _serving_key(self) -> bytes:
        """Which loaded copies of the reached models serve now, as bytes for the cache key."""
        serials = [serial for model in self._reached for serial in self._runner.serving(model)]
        return b"".join(serial.to_bytes(8, "little") for serial in serials)

    async def _answer(self, request: InferRequest) -> InferResponse:
        started = self._clock.now()
        self._runs += 1
        self._idle.clear()
        try:
            outputs = await self._run(request, started)
        except TensorgateError as exc:
            self._count(started, exc.outcome)
            raise
        finally:
            self._runs -= 1
            if not self._runs:
                self._idle.set()
        self._count(started, "success")
        wanted = request.outputs or tuple(s.name for s in self.specs.outputs)
        answer = {name: outputs[name] for name in wanted if name in outputs}
        return InferResponse(self.name, self.version, answer, id=request.id)

    async def _run(self, request: InferRequest, started: float) -> dict[str, Array]:
        callers = _CALLERS.get()
        if self.name in callers:
            chain = " -> ".join([*callers[callers.index(self.name) :], self.name])
            raise InternalError(
                f"pipeline '{self.name}' reached itself through its steps ({chain}); "
                "reload the pipelines involved to have their steps checked"
            )
        token = _CALLERS.set((*callers, self.name))
        try:
            return await self._run_steps(request, started)
        finally:
            _CALLERS.reset(token)

    async def _run_steps(self, request: InferRequest, started: float) -> dict[str, Array]:
        tensors: dict[str, Array] = dict(request.inputs)
        forwarded = {name: request.parameters[name] for name in FORWARDED_PARAMETERS if name in request.parameters}
        deadline = None if request.timeout_s is None else started + request.timeout_s
        for index, step in enumerate(self.steps, start=1):
            label = f"pipeline '{self.name}' step {index} ('{step.model}')"
            if step.when is not None and not condition_holds(step.when, tensors, label):
                continue
            missing = [source for source in step.inputs.values() if source not in tensors]
            if missing:
                raise InvalidInput(f"{label}: its input(s) {', '.join(missing)} come from a step that was skipped")
            timeout = None
            if deadline is not None:
                timeout = deadline - self._clock.now()
                if timeout <= 0:
                    raise DeadlineExceeded(f"{label}: the request's deadline passed before the step could start")
            inner = InferRequest(
                model=step.model,
                version=step.version,
                inputs={name: tensors[source] for name, source in step.inputs.items()},
                outputs=tuple(step.outputs),
                parameters=dict(forwarded),
                priority=request.priority,
                timeout_s=timeout,
                id=request.id,
                request_id=request.request_id,
                traceparent=request.traceparent,
                tenant=request.tenant,  # each step queues for the pipeline's caller
            )
            try:
                response = await self._runner.run(inner)
            except TensorgateError as exc:
                raise _named(exc, label) from exc
            for produced, name in step.outputs.items():
                if produced not in response.outputs:
                    raise InvalidInput(f"{label}: model '{step.model}' has no output '{produced}'")
                tensors[name] = response.outputs[produced]
        return tensors

    def _count(self, started: float, outcome: str) -> None:
        elapsed = self._clock.now() - started
        self.metrics.outcome(outcome if outcome in self.metrics.outcomes else "internal")
        self.metrics.request_seconds.observe(elapsed)
        self.statistics.ran_steps(outcome == "success", elapsed)


def _named(exc: TensorgateError, label: str) -> TensorgateError:
    """The step's error, same class and status, with the step named first."""
    named = copy.copy(exc)
    named.message = f"{label}: {exc.message}"
    named.args = (named.message,)
    return named
