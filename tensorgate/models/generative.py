"""Generative model versions: a causal LM behind a continuous-batching engine.

A :class:`GenerativeModelVersion` is a :class:`ModelVersion` (so readiness, metadata, routing and
the V2 ``infer`` path keep working: ``text_input`` BYTES in, ``text_output`` BYTES out) that also
exposes :meth:`submit` for streaming generation, used by the OpenAI and generate routes. Its V2
``infer`` runs through small adapter instances that submit each row to the shared engine.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

import numpy as np

from tensorgate.backends.base import Device
from tensorgate.backends.registry import load_generative
from tensorgate.clock import Clock
from tensorgate.config.model_config import LLMSettings
from tensorgate.errors import InvalidInput, ModelLoadError, TensorgateError, Unavailable
from tensorgate.generation import GenerationStream, GenerativeRunner, SamplingParams, TextCodec, collect
from tensorgate.instances.base import Instance, ModelFailed
from tensorgate.instances.factory import placements
from tensorgate.instances.pool import InstancePool
from tensorgate.models.model_version import ModelVersion, VersionState, VersionStatus
from tensorgate.models.specs import resolve_specs
from tensorgate.observability.metrics import Metrics
from tensorgate.repository.source import ModelSource, VersionSource
from tensorgate.scheduling.continuous.engine import Engine, EngineSettings
from tensorgate.scheduling.continuous.kv_budget import KVBudget
from tensorgate.scheduling.continuous.step_scheduler import SchedulerSettings, StepScheduler
from tensorgate.scheduling.scheduler import QueueSettings
from tensorgate.types import Array, DataType, TensorSpec

log = logging.getLogger(__name__)

PLATFORM = "pytorch_causal_lm"
TEXT_INPUT = TensorSpec("text_input", DataType.BYTES, (-1, 1))
TEXT_OUTPUT = TensorSpec("text_output", DataType.BYTES, (-1, 1))
# V2 infer requests run through this many adapter instances at once (each submits its rows).
_V2_CONCURRENCY = 16


class _EngineInstance(Instance):
    """Adapts the request-level path (V2 infer) to the engine: each row is one generation."""

    def __init__(self, name: str, device: Device, owner: GenerativeModelVersion) -> None:
        super().__init__(name, device)
        self._owner = owner
        self._closed = False

    async def start(self) -> None:
        return None

    def input_specs(self) -> tuple[TensorSpec, ...]:
        return (TEXT_INPUT,)

    def output_specs(self) -> tuple[TensorSpec, ...]:
        return (TEXT_OUTPUT,)

    async def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        rows = inputs["text_input"].reshape(-1)
        params = SamplingParams(max_tokens=self._owner.settings.default_max_tokens)
        try:
            streams = [self._owner.submit(self._owner.encode(_text(row)), params, incremental=False) for row in rows]
            texts = []
            for stream in streams:
                events = await collect(stream)
                texts.append(stream.text.encode() if events else b"")
        except TensorgateError as exc:
            raise ModelFailed(exc.message) from exc
        return {"text_output": np.array(texts, dtype=object).reshape(-1, 1)}

    @property
    def healthy(self) -> bool:
        return not self._closed

    async def aclose(self) -> None:
        self._closed = True


def _text(value: object) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            raise InvalidInput("text_input is not valid UTF-8") from None
    return str(value)


class GenerativeModelVersion(ModelVersion):
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
        instances = [_EngineInstance(f"{name}_{version}_{i}", device, self) for i in range(_V2_CONCURRENCY)]
        specs = resolve_specs(name, (TEXT_INPUT,), (TEXT_OUTPUT,), source.config)
        super().__init__(
            name,
            version,
            PLATFORM,
            specs,
            InstancePool(instances),
            QueueSettings(),
            clock,
            metrics.for_version(name, version),
        )

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
        await super().aclose(drain_timeout_s)
        await asyncio.to_thread(self.runner.close)


async def load_generative_version(
    source: ModelSource, vsource: VersionSource, status: VersionStatus, clock: Clock, metrics: Metrics
) -> GenerativeModelVersion:
    """Load and warm one generative version, not yet serving; raises ModelLoadError, leaving nothing behind."""
    name, version = source.name, vsource.version
    settings = source.config.llm or LLMSettings()
    started = clock.now()
    model_version: GenerativeModelVersion | None = None
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
        model_version = GenerativeModelVersion(name, version, runner, settings, source, device, clock, metrics)
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
