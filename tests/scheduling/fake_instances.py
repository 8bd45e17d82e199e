"""A stand-in instance for scheduler tests: everything but ``execute``, which each test's fake writes."""

from __future__ import annotations

from tensorgate.backends.base import Device
from tensorgate.instances.base import Instance
from tensorgate.types import DataType, TensorSpec


class FakeInstance(Instance):
    """One tensor ``x`` in and out; healthy while ``alive``."""

    def __init__(self, name: str, shape: tuple[int, ...] = (-1, 2)) -> None:
        super().__init__(name, Device())
        self.spec = TensorSpec("x", DataType.FP32, shape)
        self.alive = True

    async def start(self) -> None:
        return None

    def input_specs(self) -> tuple[TensorSpec, ...]:
        return (self.spec,)

    def output_specs(self) -> tuple[TensorSpec, ...]:
        return (self.spec,)

    @property
    def healthy(self) -> bool:
        return self.alive

    async def aclose(self) -> None:
        return None
