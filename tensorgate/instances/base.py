"""An Instance: one backend loaded on one device, running one batch at a time.

Running one batch at a time is the per-device concurrency limit: however many requests arrive,
a device never holds more than one batch of activations per instance, so load cannot drive it out
of memory. The scheduler only hands a batch to an instance that the pool reports idle.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping

from tensorgate.backends.base import Device
from tensorgate.types import Array, TensorSpec


class InstanceDied(Exception):
    """The instance stopped (its worker process exited) while or before running a batch.

    Inference is idempotent, so the scheduler retries the batch once on another instance.
    """


class ModelFailed(Exception):
    """The model itself raised on a batch. Not retried: the same inputs would fail again."""


HealthListener = Callable[["Instance", bool], None]


class Instance(abc.ABC):
    def __init__(self, name: str, device: Device) -> None:
        self.name = name
        self.device = device
        # Set by the owner to hear when the instance leaves or rejoins rotation (restart, death).
        self.on_health_change: HealthListener | None = None
        self.on_restart: Callable[[Instance], None] | None = None

    @abc.abstractmethod
    async def start(self) -> None:
        """Load the model. Raises ModelLoadError. Called once by the ModelManager."""

    @abc.abstractmethod
    def input_specs(self) -> tuple[TensorSpec, ...]: ...

    @abc.abstractmethod
    def output_specs(self) -> tuple[TensorSpec, ...]: ...

    @abc.abstractmethod
    async def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        """Run one batch. Raises ModelFailed when the model raised, InstanceDied when the instance is gone."""

    @property
    @abc.abstractmethod
    def healthy(self) -> bool:
        """False while the instance cannot take work (dead, restarting)."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Unload the model and stop threads or processes. Idempotent."""
