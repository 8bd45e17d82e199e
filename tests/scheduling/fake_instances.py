"""Stand-in instances for scheduler tests: :class:`FakeInstance` is everything but ``execute``, which
each test's fake writes; :class:`GatedInstance` runs a batch when the test opens its gate."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import numpy as np

from tensorgate.backends.base import Device
from tensorgate.clock import ManualClock
from tensorgate.instances.base import Instance, InstanceDied
from tensorgate.types import Array, DataType, TensorSpec


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


class GatedInstance(FakeInstance):
    """Runs a batch when the test opens its gate; records every batch it saw."""

    def __init__(self, name: str, *, gated: bool = True, die: bool = False) -> None:
        super().__init__(name)
        self.gate = asyncio.Event()
        if not gated:
            self.gate.set()
        self.started = asyncio.Event()
        self.batches: list[Array] = []
        self.die = die

    async def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        self.batches.append(np.array(inputs["x"]))
        self.started.set()
        await self.gate.wait()
        if self.die:
            self.alive = False
            raise InstanceDied("killed by the test")
        return {"x": inputs["x"] * 10}


class TimedInstance(GatedInstance):
    """Each batch takes ``seconds`` on a manual clock, once its gate is open."""

    def __init__(self, name: str, clock: ManualClock, seconds: float) -> None:
        super().__init__(name)
        self.clock = clock
        self.seconds = seconds

    async def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        outputs = await super().execute(inputs)
        self.clock.advance(self.seconds)
        return outputs
