"""An instance in a thread of the server process, for backends that release the GIL (onnxruntime)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from tensorgate.backends.base import Backend, LoadSpec
from tensorgate.instances.base import Instance, ModelFailed
from tensorgate.types import Array, TensorSpec


class ThreadInstance(Instance):
    def __init__(self, name: str, backend: Backend, spec: LoadSpec) -> None:
        super().__init__(name, spec.device)
        self._backend = backend
        self._spec = spec
        # One thread per instance: the backend is called from that thread only, one batch at a time.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"instance-{name}")
        self._closed = False

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._backend.load, self._spec)

    def input_specs(self) -> tuple[TensorSpec, ...]:
        return self._backend.inputs()

    def output_specs(self) -> tuple[TensorSpec, ...]:
        return self._backend.outputs()

    async def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self._backend.execute, inputs)
        except Exception as exc:
            raise ModelFailed(f"{type(exc).__name__}: {exc}") from exc

    @property
    def healthy(self) -> bool:
        return not self._closed

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._backend.close)
        self._executor.shutdown(wait=False)
