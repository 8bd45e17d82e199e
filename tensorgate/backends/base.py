"""The Backend protocol: one loaded model on one device, executing batches.

A backend never sees HTTP, queues or threads. The instance that owns it calls ``load`` once,
``execute`` for each batch (one at a time, from one thread), and ``close`` at shutdown.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from tensorgate.config.model_config import ModelConfig, TensorConfig
from tensorgate.errors import ModelLoadError
from tensorgate.types import Array, DataType, TensorSpec

DeviceKind = Literal["cpu", "gpu", "npu"]


@dataclass(frozen=True, slots=True)
class Device:
    kind: DeviceKind = "cpu"
    index: int = 0

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"{self.kind}:{self.index}"


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """Everything a backend needs to load one model version on one device."""

    model: str
    version: int
    artifact: Path
    directory: Path
    config: ModelConfig
    device: Device
    instance: str = ""  # the instance's name (model_version_index), for logs and Python models


class ResponseSink(Protocol):
    """Where one request's responses go when its model is decoupled; the instance supplies one per
    request. Both methods may be called from any thread, also after ``execute_decoupled`` returned."""

    def send(self, outputs: Mapping[str, Array] | None, error: str | None, final: bool) -> None:
        """One response (``outputs``), an error response, the final flag, or a response with it."""

    def is_cancelled(self) -> bool:
        """True once the request is cancelled (the client left, its deadline passed)."""


class Backend(abc.ABC):
    """A model runtime behind one interface. Implementations live one per module in ``backends/``."""

    platform: str = "unknown"

    @abc.abstractmethod
    def load(self, spec: LoadSpec) -> None:
        """Load the model (once per instance, at startup, never per request). Raises ModelLoadError."""

    @abc.abstractmethod
    def inputs(self) -> tuple[TensorSpec, ...]:
        """The input specs as the model declares them (batch dimension included, -1 when dynamic)."""

    @abc.abstractmethod
    def outputs(self) -> tuple[TensorSpec, ...]:
        """The output specs, like ``inputs``."""

    @abc.abstractmethod
    def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        """Run one batch. Called from one thread at a time; may block; raises on model failure."""

    def execute_decoupled(self, parts: Sequence[Mapping[str, Array]], sinks: Sequence[ResponseSink]) -> None:
        """Run one batch of a decoupled model: each request's inputs (``parts``) with the sink its
        responses go to. Returns when the model's execute returns (the instance then takes its next
        batch); responses may still follow from threads the model started. Called like ``execute``:
        from one thread, one batch at a time; raises on model failure."""
        raise NotImplementedError(f"the {self.platform} backend does not serve decoupled models")

    def close(self) -> None:  # noqa: B027 - optional hook, most backends have nothing to free
        """Free the model. Called once, after the last ``execute``."""


def declared_specs(tensors: list[TensorConfig] | None, what: str, spec: LoadSpec, kind: str) -> tuple[TensorSpec, ...]:
    """The inputs or outputs ``config.yaml`` declares, for a model whose file does not say them."""
    if not tensors:
        raise ModelLoadError(f"{kind} declares its {what} in config.yaml; {spec.model} has none")
    try:
        return tuple(TensorSpec(t.name, DataType.parse(t.datatype), tuple(t.shape)) for t in tensors)
    except ValueError as exc:
        raise ModelLoadError(f"config.yaml {what}: {exc}") from exc
