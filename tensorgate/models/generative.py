"""Generative model versions: a causal LM behind a continuous-batching engine.

A :class:`GenerativeVersion` is a :class:`~tensorgate.models.servable.Servable` (readiness,
metadata, routing and the V2 ``infer`` path: ``text_input`` BYTES in, ``text_output`` BYTES out,
each row one generation) and a :class:`~tensorgate.models.servable.TextGenerator`: :meth:`submit`
streams one generation, for the OpenAI and generate routes. The engine admits, queues and batches
every generation, whichever way it came.
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np

from tensorgate.backends.base import Device
from tensorgate.backends.registry import load_generative
from tensorgate.clock import Clock
from tensorgate.config.model_config import LLMSettings
from tensorgate.errors import InvalidInput, ModelLoadError, TensorgateError, Unavailable
from tensorgate.generation import GenerationStream, GenerativeRunner, SamplingParams, TextCodec, collect
from tensorgate.instances.factory import placements
from tensorgate.models.model_version import serials
from tensorgate.models.response_cache import VersionCache
from tensorgate.models.servable import InstanceView, VersionState, VersionStatus
from tensorgate.models.specs import resolve_specs
from tensorgate.models.validation import TensorRules
from tensorgate.observability.metrics import Metrics
from tensorgate.repository.source import ModelSource, VersionSource
from tensorgate.scheduling.continuous.engine import Engine, EngineSettings
from tensorgate.scheduling.continuous.kv_budget import KVBudget
from tensorgate.scheduling.continuous.step_scheduler import SchedulerSettings, StepScheduler
from tensorgate.scheduling.scheduler import QueueSettings
from tensorgate.scheduling.statistics import InferenceStatistics
from tensorgate.types import DataType, InferRequest, InferResponse, ModelMetadata, TensorSpec

log = logging.getLogger(__name__)

PLATFORM = "pytorch_causal_lm"
TEXT_INPUT = TensorSpec("text_input", DataType.BYTES, (-1, 1))
TEXT_OUTPUT = TensorSpec("text_output", DataType.BYTES, (-1, 1))


def _text(value: object) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            raise InvalidInput("text_input is not valid UTF-8") from None
    return str(value)


class GenerativeVersion:
    def __init__(
        self,
        name: str,
        version: int,
        runner: GenerativeRunner,
        settings: LLMSettings,
        source: ModelSource,
        device: Device,
        clock: Clock,
        metrics: Metrics,
    ) -> None:
        self.name = name
        self.version = version
        self.serial = next(serials)
        self.platform = PLATFORM
        self.device = device
        self.state = VersionState.WARMING
        self.metrics = metrics.for_version(name, version)
        self.statistics = InferenceStatistics()
        self.cache: VersionCache | None = None  # sampling: equal requests may rightly differ
        self.queue_settings = QueueSettings(max_queue_size=settings.max_waiting)
        self.runner = runner
        self.codec: TextCodec = runner.codec
        self.settings = settings
        self.max_model_len = min(
            settings.max_model_len or runner.max_position_embeddings, runner.max_position_embeddings
        )
        kv = KVBudget(settings.kv_cache_bytes, runner.kv_bytes_per_token, settings.block_size)
        if kv.total_blocks == 0:
            raise ModelLoadError(
                f"llm.kv_cache_bytes {settings.kv_cache_bytes} holds no {settings.block_size}-token block "
                f"({runner.kv_bytes_per_token} bytes per token)"
            )
        scheduler = StepScheduler(
            SchedulerSettings(
                max_num_seqs=settings.max_num_seqs,
                max_num_batched_tokens=settings.max_num_batched_tokens,
                max_model_len=self.max_model_len,
                max_waiting=settings.max_waiting,
                priority_levels=settings.priority_levels,
                eos_token_id=self.codec.eos_token_id,
            ),
            kv,
        )
        self.engine = Engine(
            runner,
            scheduler,
            self.codec,
            clock,
            metrics.generation().for_version(name, version),
            EngineSettings(default_priority=settings.priority_levels),
        )
        self.specs = resolve_specs(name, (TEXT_INPUT,), (TEXT_OUTPUT,), source.config)
        self.rules = TensorRules(name, self.specs.inputs, self.specs.outputs, self.specs.max_batch_size)
        self._clock = clock

    # -- the Servable side ---------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self.state is VersionState.READY

    @property
    def queued(self) -> int:
        return self.engine.scheduler.num_waiting

    @property
    def running(self) -> int:
        return self.engine.scheduler.num_running

    def metadata(self, versions: tuple[int, ...]) -> ModelMetadata:
        specs = self.specs
        return ModelMetadata(self.name, versions, self.platform, specs.inputs, specs.outputs, specs.max_batch_size)

    def instances(self) -> tuple[InstanceView, ...]:
        busy = self.running > 0
        return (InstanceView(f"{self.name}_{self.version}_engine", self.device, "ok", busy, None, ""),)

    def worker_pids(self) -> tuple[int, ...]:
        return ()

    def serve(self) -> None:
        return None

    def count_failure(self, error: TensorgateError) -> None:
        self.metrics.outcome(error.outcome)

    async def infer(self, request: InferRequest) -> InferResponse:
        """V2 ``infer``: each row of ``text_input`` is one generation of ``default_max_tokens`` at
        most, run side by side in the engine; ``text_output`` holds their texts in row order."""
        started = self._clock.now()
        try:
            texts = await self._generate_rows(request)
        except TensorgateError as exc:
            self._count(started, exc.outcome, 0)
            raise
        self._count(started, "success", len(texts))
        output = np.array(texts, dtype=object).reshape(-1, 1)
        return InferResponse(self.name, self.version, {"text_output": output}, id=request.id)

    async def _generate_rows(self, request: InferRequest) -> list[bytes]:
        self._check_ready()
        self.rules.check_inputs(request.inputs)
        self.rules.check_outputs(request.outputs)
        params = SamplingParams(max_tokens=self.settings.default_max_tokens)
        streams: list[GenerationStream] = []
        try:
            for row in request.inputs["text_input"].reshape(-1):
                prompt = self.encode(_text(row))
                streams.append(
                    self.submit(
                        prompt,
                        params,
                        priority=request.priority or None,
                        timeout_s=request.timeout_s,
                        incremental=False,
                    )
                )
            await asyncio.gather(*(collect(stream) for stream in streams))
        finally:
            for stream in streams:  # one row failed, or the caller left: the others stop too
                if stream.finish_reason is None:
                    stream.cancel()
        return [stream.text.encode() for stream in streams]

    def _count(self, started: float, outcome: str, rows: int) -> None:
        elapsed = self._clock.now() - started
        self.metrics.outcome(outcome if outcome in self.metrics.outcomes else "internal")
        self.metrics.request_seconds.observe(elapsed)
        if outcome == "success":
            self.statistics.executed(rows, elapsed, 1)
        self.statistics.ended(outcome == "success", elapsed)

    # -- the generation API used by the protocols ------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return self.codec.encode(text)

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        if not self.codec.has_chat_template:
            raise InvalidInput(f"model '{self.name}' has no chat template; use /v1/completions")
        try:
            return self.codec.chat_prompt(messages)
        except Exception as exc:  # a template error is the request's messages not fitting it
            raise InvalidInput(f"the messages do not fit the model's chat template: {exc}") from exc

    def token_text(self, token_id: int) -> str:
        return self.codec.token_text(token_id)

    def submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        priority: int | None = None,
        timeout_s: float | None = None,
        incremental: bool = True,
    ) -> GenerationStream:
        """Admit one generation (raises InvalidInput, QueueFull, Unavailable at once).

        ``incremental``: the caller streams text as it comes (False: only the final text is read)."""
        self._check_ready()
        if priority is not None and not 1 <= priority <= self.settings.priority_levels:
            raise InvalidInput(f"priority {priority} is outside 1..{self.settings.priority_levels}")
        return self.engine.submit(prompt_ids, params, priority=priority, timeout_s=timeout_s, incremental=incremental)

    def _check_ready(self) -> None:
        if not self.ready:
            raise Unavailable(
                f"model '{self.name}' version {self.version} is not ready ({self.state.value})", retry_after_s=1.0
            )

    async def aclose(self, drain_timeout_s: float) -> None:
        self.state = VersionState.DRAINING  # new generations are refused from here on
        await self.engine.drain(drain_timeout_s)  # in-flight ones finish within the exit timeout
        await self.engine.aclose()
        await asyncio.to_thread(self.runner.close)
        self.state = VersionState.UNLOADED


async def load_generative_version(
    source: ModelSource, vsource: VersionSource, status: VersionStatus, clock: Clock, metrics: Metrics
) -> GenerativeVersion:
    """Load and warm one generative version, not yet serving; raises ModelLoadError, leaving nothing behind."""
    name, version = source.name, vsource.version
    settings = source.config.llm or LLMSettings()
    started = clock.now()
    model_version: GenerativeVersion | None = None
    try:
        placement = placements(source.config.instance_group, source.device_id)[0]
        device = placement.device
        if placement.isolation != "thread":
            raise ModelLoadError("the llm backend runs in the server process (isolation: thread)")
        runner = await asyncio.to_thread(
            load_generative,
            source.backend,
            vsource.directory,
            device,
            settings.dtype,
            settings.threads,
            settings.lean_forward,
        )
        model_version = GenerativeVersion(name, version, runner, settings, source, device, clock, metrics)
        metrics.load_seconds.labels(name, str(version)).observe(clock.now() - started)
        status.state = VersionState.WARMING
        await model_version.engine.start()
        model_version.state = VersionState.READY  # the warm-up goes through the engine's own checks
        warm = model_version.submit(model_version.encode("warm up") or [0], SamplingParams(max_tokens=1))
        await collect(warm)
        model_version.state = VersionState.WARMING  # the manager marks it READY when it takes traffic
    except BaseException as exc:
        if model_version is not None:
            await model_version.aclose(0.0)
        if isinstance(exc, ModelLoadError | ModuleNotFoundError) or not isinstance(exc, Exception):
            raise
        raise ModelLoadError(f"{type(exc).__name__}: {exc}") from exc
    log.info(
        "model %s version %d is warm (llm on %s, %d KV tokens, max %d sequences, %.0f ms)",
        name,
        version,
        device,
        model_version.engine.scheduler.kv.capacity_tokens,
        settings.max_num_seqs,
        (clock.now() - started) * 1000,
    )
    return model_version
