"""Per-model configuration: the schema of ``<repo>/<model>/config.yaml``.

Inert data validated by pydantic. Field names follow Triton's model configuration where one exists,
so operators can carry their habits over.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# When a model can batch and its config says nothing, a request may carry up to this many rows.
DEFAULT_MAX_BATCH_SIZE = 8
# Rule: every queue is bounded. Triton's default (0) means unbounded; ours is finite.
DEFAULT_MAX_QUEUE_SIZE = 1024
# Backends whose models are always resident (model_residency on_demand is refused): generation is
# served through its own routes (no cold load on their path), and a pipeline holds no model of its
# own (its steps are the repository's models, each with its residency).
ALWAYS_RESIDENT = frozenset({"llm", "pipeline"})


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Ragged(Strict):
    """Requests whose tensors differ in a dynamic axis past the batch axis, batched together.

    On an input: such requests share a batch, each padded with ``pad_value`` to the batch's longest
    along those axes (never to the model's maximum). On an output: its dynamic axes past the batch
    axis follow those of ``input`` (a ragged input), and each request's answer is cut back to its own
    input's size along them. An output without ``ragged`` is returned as the model made it (a
    pooled classifier's logits have no such axis).
    """

    pad_value: float = 0.0
    input: str | None = None


class TensorConfig(Strict):
    name: str
    datatype: str
    shape: list[int]
    ragged: Ragged | None = None

    @field_validator("shape")
    @classmethod
    def _dims(cls, shape: list[int]) -> list[int]:
        if any(d < -1 for d in shape):
            raise ValueError("dimensions are positive integers, or -1 for a dynamic dimension")
        return shape


class DynamicBatching(Strict):
    max_batch_size: int | None = Field(default=None, ge=1)
    max_queue_delay_ms: float = Field(default=5.0, ge=0)
    # Wait out max_queue_delay_ms only while the batch has fewer rows than arrive during this
    # model's measured per-call cost (scheduling/batch_cost.py); false: always wait, as Triton does.
    adaptive_delay: bool = True
    preferred_batch_sizes: list[int] = Field(default_factory=list)
    priority_levels: int = Field(default=1, ge=1, le=16)
    default_priority: int | None = Field(default=None, ge=1)
    max_queue_size: int = Field(default=DEFAULT_MAX_QUEUE_SIZE, ge=1)
    default_timeout_ms: float | None = Field(default=None, gt=0)
    # Within a priority level: fifo (fair between tenants, first come first served within one) or
    # deadline (earliest deadline first; requests without one last).
    order: Literal["fifo", "deadline"] = "fifo"
    # Refuse at once (503 + Retry-After) a request whose deadline the queue ahead of it and the
    # model's measured batch cost say it cannot meet, instead of holding it until it times out.
    deadline_admission: bool = False

    @model_validator(mode="after")
    def _levels(self) -> DynamicBatching:
        if self.default_priority is not None and self.default_priority > self.priority_levels:
            raise ValueError(
                f"default_priority {self.default_priority} is above priority_levels {self.priority_levels}"
            )
        if any(size < 1 for size in self.preferred_batch_sizes):
            raise ValueError("preferred_batch_sizes must be positive")
        return self


class InstanceGroup(Strict):
    count: int = Field(default=1, ge=1, le=64)
    kind: Literal["cpu", "gpu", "npu"] = "cpu"
    devices: list[int] = Field(default_factory=list)
    isolation: Literal["thread", "process"] = "thread"
    # The CPUs each instance of the group runs on, in order (wrapping around when there are fewer
    # sets than instances): its thread and the runtime threads it starts, or its worker process.
    cpus: list[list[int]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _cpus(self) -> InstanceGroup:
        if any(not cpu_set for cpu_set in self.cpus):
            raise ValueError("each entry of cpus lists at least one CPU")
        if any(cpu < 0 for cpu_set in self.cpus for cpu in cpu_set):
            raise ValueError("CPU numbers are not negative")
        return self


class WarmupSample(Strict):
    name: str = "warmup"
    inputs: Literal["zeros", "random", "file"] = "zeros"
    file: str | None = None
    batch_size: int = Field(default=1, ge=1)
    count: int = Field(default=1, ge=1, le=1000)

    @model_validator(mode="after")
    def _file(self) -> WarmupSample:
        if self.inputs == "file" and not self.file:
            raise ValueError("inputs: file needs a 'file' key naming a JSON file beside config.yaml")
        return self


class VersionPolicy(Strict):
    latest: int | None = Field(default=None, ge=1)
    all: bool = False
    specific: list[int] | None = None

    @model_validator(mode="after")
    def _one(self) -> VersionPolicy:
        chosen = sum([self.latest is not None, self.all, self.specific is not None])
        if chosen > 1:
            raise ValueError("choose one of latest, all, specific")
        if self.specific is not None and any(v < 1 for v in self.specific):
            raise ValueError("versions are positive integers")
        return self


class OnnxRuntimeOptions(Strict):
    intra_op_threads: int = Field(default=0, ge=0)
    inter_op_threads: int = Field(default=0, ge=0)
    # ORT's pool threads spin between parallel sections by default: fastest on cores nobody else
    # needs, but in a server they take CPU from the threads decoding the next request.
    allow_spinning: bool = True


class TorchOptions(Strict):
    # torch.set_num_threads for the instance's process (0: torch's default, one per core).
    intra_op_threads: int = Field(default=0, ge=0)


class LLMSettings(Strict):
    """The ``llm:`` section of a generative model: continuous batching limits and the KV cache budget."""

    max_num_seqs: int = Field(default=64, ge=1, le=4096)
    max_num_batched_tokens: int = Field(default=512, ge=1)
    kv_cache_bytes: int = Field(default=256 * 1024 * 1024, ge=1)
    max_model_len: int | None = Field(default=None, ge=2)
    block_size: int = Field(default=16, ge=1, le=1024)
    max_waiting: int = Field(default=1024, ge=1)
    priority_levels: int = Field(default=1, ge=1, le=16)
    default_max_tokens: int = Field(default=16, ge=1)
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    threads: int = Field(default=0, ge=0)
    # Plain Llama models run decode steps and prefill chunks through tensorgate's fused forward
    # (backends/llm/lean_forward.py) instead of transformers' own, which bench_llm_realistic
    # measures as faster served; false keeps transformers' forward (any other model always does).
    lean_forward: bool = True


class HealthCheck(Strict):
    """Each instance's health checks: probes when idle, and what counts as failing."""

    enabled: bool = True
    interval_s: float = Field(default=10.0, gt=0)  # idle this long, an instance is probed
    timeout_s: float = Field(default=2.0, gt=0)  # a probe running longer fails
    failure_threshold: int = Field(default=3, ge=1)  # consecutive failures that take it out of rotation
    success_threshold: int = Field(default=1, ge=1)  # good probes that bring it back
    # A real batch running longer than this is taken as hung: it is retried on another instance and
    # the instance counts a failure (a thread instance is reloaded, a worker process killed).
    batch_timeout_s: float = Field(default=120.0, gt=0)
    # Hang detection at the model's own pace (scheduling/pace.py): a batch running past
    # max(hang_floor_s, hang_factor x the 99th percentile of the instance's recent batches of its
    # size) is suspect; its requests are sent to another instance too, the first answer wins, and a
    # second suspect batch in a row takes the instance out. Five times the slowest 1 % is far past
    # any pace the model has shown (a GC pause or a noisy neighbour stays within two or three); the
    # one-second floor keeps a millisecond model from hedging on a hiccup of the host.
    hang_detection: bool = True
    hang_floor_s: float = Field(default=1.0, gt=0)
    hang_factor: float = Field(default=5.0, ge=1)


class StepCondition(Strict):
    """Run a pipeline step only when a tensor (a pipeline input or an earlier step's output) holds
    exactly one value, equal to ``equals``."""

    input: str
    equals: str | int | float | bool


class PipelineStep(Strict):
    """One model of the repository as a step: its inputs from the pipeline's inputs or earlier
    steps' outputs (``step_input: source``), its outputs named for later steps and the answer."""

    model: str
    version: int | None = Field(default=None, ge=1)
    inputs: dict[str, str]
    outputs: dict[str, str]
    when: StepCondition | None = None


class ResponseCacheConfig(Strict):
    """Triton's response cache for this model: only for a model whose answer depends on nothing but
    its inputs and parameters (no state, no randomness)."""

    enable: bool = False


class CanaryConfig(Strict):
    """A rollout that moves traffic to ``version`` step by step, judged against the version it replaces."""

    version: int = Field(ge=1)
    # The version being replaced; None: the highest version on disk below the canary's.
    stable: int | None = Field(default=None, ge=1)
    steps: list[float] = Field(default_factory=lambda: [10.0, 25.0, 50.0, 100.0])  # percent of traffic
    step_s: float = Field(default=60.0, gt=0)
    max_error_rate: float = Field(default=0.01, ge=0, le=1)
    max_p99_ratio: float = Field(default=1.5, gt=0)
    min_requests: int = Field(default=200, ge=1)

    @model_validator(mode="after")
    def _steps(self) -> CanaryConfig:
        if not self.steps or any(not 0 < s <= 100 for s in self.steps):
            raise ValueError("steps are percentages of traffic, each above 0 and at most 100")
        if any(b <= a for a, b in zip(self.steps, self.steps[1:], strict=False)) or self.steps[-1] != 100:
            raise ValueError("steps must increase and end at 100")
        if self.stable is not None and self.stable == self.version:
            raise ValueError("stable names the version the canary replaces, not the canary itself")
        return self


class ShadowConfig(Strict):
    """Copies of served requests sent to ``version`` after the answer, to compare its outputs."""

    version: int = Field(ge=1)
    fraction: float = Field(default=0.1, gt=0, le=1)
    tolerance: float = Field(default=1e-5, ge=0)  # relative; classification outputs' argmax is counted too
    # Shadow requests in flight at most; past it a copy is shed, so a slow shadow never piles up work.
    max_inflight: int = Field(default=64, ge=1)


class TrafficConfig(Strict):
    """How requests that name no version are shared between versions (gray release, A/B, canary, shadow)."""

    weights: dict[int, float] | None = None  # version -> relative weight
    sticky_header: str = Field(default="X-Traffic-Key", pattern=r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$")
    canary: CanaryConfig | None = None
    shadow: ShadowConfig | None = None

    @model_validator(mode="after")
    def _consistent(self) -> TrafficConfig:
        if self.weights is not None:
            if any(v < 1 for v in self.weights) or any(w < 0 for w in self.weights.values()):
                raise ValueError("weights map positive version numbers to weights of 0 or more")
            if sum(self.weights.values()) <= 0:
                raise ValueError("at least one weight must be above 0")
            if self.canary is not None:
                raise ValueError("choose weights or canary: a canary sets the weights itself")
        if self.shadow is not None:
            if self.weights is not None and self.weights.get(self.shadow.version, 0) > 0:
                raise ValueError(f"shadow version {self.shadow.version} also has a traffic weight")
            if self.canary is not None and self.shadow.version == self.canary.version:
                raise ValueError("the shadow version cannot also be the canary")
        return self


CORRID_TYPES = ("TYPE_UINT64", "TYPE_INT64", "TYPE_UINT32", "TYPE_INT32", "TYPE_STRING")


def _triton_type(value: str) -> str:
    """A datatype as Triton's configs spell it (TYPE_FP32) or as ours do (FP32): kept as TYPE_*."""
    return value if value.startswith("TYPE_") else f"TYPE_{value}"


class SequenceControl(Strict):
    """One control tensor's meaning and values (Triton's ``control``): the server fills it on every
    request of a sequence."""

    kind: Literal["CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_END", "CONTROL_SEQUENCE_READY", "CONTROL_SEQUENCE_CORRID"]
    int32_false_true: list[int] = Field(default_factory=list)
    fp32_false_true: list[float] = Field(default_factory=list)
    bool_false_true: list[bool] = Field(default_factory=list)
    data_type: str | None = None  # CORRID only: the correlation id's type in the tensor

    @field_validator("data_type")
    @classmethod
    def _spelling(cls, value: str | None) -> str | None:
        return None if value is None else _triton_type(value)

    @model_validator(mode="after")
    def _values(self) -> SequenceControl:
        given = [v for v in (self.int32_false_true, self.fp32_false_true, self.bool_false_true) if v]
        if self.kind == "CONTROL_SEQUENCE_CORRID":
            if given or self.data_type is None:
                raise ValueError("a CONTROL_SEQUENCE_CORRID control has a data_type and no false/true values")
            if self.data_type not in CORRID_TYPES:
                raise ValueError(f"CONTROL_SEQUENCE_CORRID data_type must be one of {', '.join(CORRID_TYPES)}")
            return self
        if len(given) != 1 or len(given[0]) != 2:
            raise ValueError(
                f"a {self.kind} control has exactly one of int32_false_true, fp32_false_true or "
                "bool_false_true, with two values (false, true)"
            )
        if self.data_type is not None:
            raise ValueError(f"data_type is for CONTROL_SEQUENCE_CORRID, not {self.kind}")
        return self


class ControlInput(Strict):
    name: str
    control: list[SequenceControl] = Field(min_length=1, max_length=1)


class InitialState(Strict):
    name: str = ""
    data_type: str
    dims: list[int]
    zero_data: bool = False
    data_file: str | None = None  # under the version's initial_state/ directory, raw little-endian values

    @field_validator("data_type")
    @classmethod
    def _spelling(cls, value: str) -> str:
        return _triton_type(value)

    @model_validator(mode="after")
    def _one_source(self) -> InitialState:
        if self.zero_data == (self.data_file is not None):
            raise ValueError("an initial_state has either zero_data: true or a data_file")
        if any(d < 1 for d in self.dims):
            raise ValueError("an initial_state's dims are all fixed (positive)")
        return self


class SequenceState(Strict):
    """Implicit state (Triton's ``state``): the model's output ``output_name`` of one request is
    its input ``input_name`` on the sequence's next request; neither is sent by the client."""

    input_name: str
    output_name: str
    data_type: str
    dims: list[int]  # without the batch dimension; -1 where the model changes it
    initial_state: list[InitialState] = Field(default_factory=list, max_length=1)

    @field_validator("data_type")
    @classmethod
    def _spelling(cls, value: str) -> str:
        return _triton_type(value)

    @field_validator("initial_state", mode="before")
    @classmethod
    def _one_or_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, dict) else value

    @model_validator(mode="after")
    def _shape(self) -> SequenceState:
        if not self.initial_state and any(d < 1 for d in self.dims):
            raise ValueError(
                f"state '{self.input_name}' has a dynamic dimension, so it needs an initial_state with fixed dims"
            )
        return self


class DirectStrategy(Strict):
    max_queue_delay_microseconds: int = Field(default=0, ge=0)
    minimum_slot_utilization: float = Field(default=0.0, ge=0, le=1)


class OldestStrategy(Strict):
    max_candidate_sequences: int = Field(default=1024, ge=1)
    preferred_batch_size: list[int] = Field(default_factory=list)
    max_queue_delay_microseconds: int = Field(default=0, ge=0)
    preserve_ordering: bool = False


class SequenceBatching(Strict):
    """Stateful sequences (Triton's ``sequence_batching``): requests that carry a ``sequence_id``
    with ``sequence_start`` / ``sequence_end`` flags; neither strategy given means ``direct``."""

    direct: DirectStrategy | None = None
    oldest: OldestStrategy | None = None
    # An idle sequence is ended and its state freed (Triton's default: one second).
    max_sequence_idle_microseconds: int = Field(default=1_000_000, ge=1)
    control_input: list[ControlInput] = Field(default_factory=list)
    state: list[SequenceState] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_strategy(self) -> SequenceBatching:
        if self.direct is not None and self.oldest is not None:
            raise ValueError("sequence_batching takes one strategy: direct or oldest")
        names = [c.name for c in self.control_input] + [s.input_name for s in self.state]
        if len(set(names)) != len(names):
            raise ValueError("control inputs and state inputs need distinct names")
        return self


class ModelConfig(Strict):
    """Everything optional: an ONNX model directory with no config.yaml serves with these defaults."""

    name: str | None = None
    backend: Literal["onnxruntime", "python", "torch", "llm", "pipeline"] | None = None
    max_batch_size: int | None = Field(default=None, ge=0)
    inputs: list[TensorConfig] | None = None
    outputs: list[TensorConfig] | None = None
    dynamic_batching: DynamicBatching | None = None
    sequence_batching: SequenceBatching | None = None
    instance_group: list[InstanceGroup] = Field(default_factory=lambda: [InstanceGroup()])
    warmup: list[WarmupSample] = Field(default_factory=list)
    version_policy: VersionPolicy = Field(default_factory=VersionPolicy)
    onnxruntime: OnnxRuntimeOptions = Field(default_factory=OnnxRuntimeOptions)
    torch: TorchOptions = Field(default_factory=TorchOptions)
    parameters: dict[str, str | int | float | bool] = Field(default_factory=dict)
    llm: LLMSettings | None = None
    traffic: TrafficConfig | None = None
    health_check: HealthCheck = Field(default_factory=HealthCheck)
    response_cache: ResponseCacheConfig = Field(default_factory=ResponseCacheConfig)
    steps: list[PipelineStep] | None = None  # backend: pipeline
    # resident: loaded at startup and kept; on_demand: loaded on its first request and evicted when
    # idle and the memory budget needs room (docs/model-residency.md). None: server.default_residency.
    model_residency: Literal["resident", "on_demand"] | None = None

    @model_validator(mode="after")
    def _pipeline(self) -> ModelConfig:
        if self.backend != "pipeline":
            if self.steps is not None:
                raise ValueError("steps are for backend: pipeline")
            return self
        if not self.steps or not self.inputs or not self.outputs:
            raise ValueError("a pipeline declares its inputs, outputs and steps")
        known = {t.name for t in self.inputs}
        for index, step in enumerate(self.steps, start=1):
            where = f"steps[{index}] ({step.model})"
            sources = list(step.inputs.values()) + ([step.when.input] if step.when is not None else [])
            for source in sources:
                if source not in known:
                    raise ValueError(
                        f"{where} reads {source!r}, which is neither a pipeline input nor an earlier step's output"
                    )
            known.update(step.outputs.values())
        missing = [t.name for t in self.outputs if t.name not in known]
        if missing:
            raise ValueError(f"no step produces the pipeline output(s) {', '.join(missing)}")
        return self

    @model_validator(mode="after")
    def _ragged(self) -> ModelConfig:
        ragged_inputs = {t.name for t in self.inputs or [] if t.ragged is not None}
        for tensor in self.inputs or []:
            if tensor.ragged is None:
                continue
            if tensor.ragged.input is not None:
                raise ValueError(f"input '{tensor.name}': ragged.input is for outputs (the input they follow)")
            if tensor.datatype.upper() in ("BYTES", "STRING", "TYPE_STRING"):
                raise ValueError(
                    f"input '{tensor.name}': a ragged input holds numbers (padding a BYTES tensor means nothing)"
                )
            if -1 not in tensor.shape[1:]:
                raise ValueError(f"input '{tensor.name}' is ragged but has no dynamic axis past the batch axis")
        for tensor in self.outputs or []:
            if tensor.ragged is None:
                continue
            if tensor.ragged.input not in ragged_inputs:
                raise ValueError(
                    f"output '{tensor.name}': ragged.input must name a ragged input "
                    f"(ragged inputs: {sorted(ragged_inputs) or 'none'})"
                )
        if ragged_inputs and self.backend == "pipeline":
            raise ValueError("ragged is for a model that batches; a pipeline's steps batch by their own configuration")
        return self

    def ragged_pads(self) -> dict[str, float]:
        """The ragged inputs and their pad values: what a batch pads shorter requests with."""
        return {t.name: t.ragged.pad_value for t in self.inputs or [] if t.ragged is not None}

    @model_validator(mode="after")
    def _no_cache_for_sampling(self) -> ModelConfig:
        if self.response_cache.enable and self.backend == "llm":
            raise ValueError(
                "response_cache cannot be enabled for the llm backend: generation samples, so equal "
                "requests may rightly get different answers"
            )
        return self

    @model_validator(mode="after")
    def _residency(self) -> ModelConfig:
        if self.model_residency == "on_demand" and self.backend in ALWAYS_RESIDENT:
            raise ValueError(f"model_residency on_demand is not for the {self.backend} backend: it stays resident")
        return self

    @model_validator(mode="after")
    def _one_scheduler(self) -> ModelConfig:
        if self.sequence_batching is not None:
            if self.dynamic_batching is not None:
                raise ValueError("a model has dynamic_batching or sequence_batching, not both")
            if self.backend in ("llm", "pipeline"):
                raise ValueError(
                    f"sequence_batching is not for the {self.backend} backend (a pipeline passes its "
                    "requests' sequence parameters on to its steps)"
                )
        return self

    @model_validator(mode="after")
    def _batch_limits(self) -> ModelConfig:
        batch_limit = self.dynamic_batching.max_batch_size if self.dynamic_batching else None
        if batch_limit is not None and self.max_batch_size is not None and batch_limit > self.max_batch_size:
            raise ValueError(
                f"dynamic_batching.max_batch_size {batch_limit} is above max_batch_size {self.max_batch_size}, "
                "the most rows one call of the model takes"
            )
        return self
