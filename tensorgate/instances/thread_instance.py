"""An instance in a thread of the server process, for backends that release the GIL (onnxruntime).

The instance owns one thread; the backend is only ever called from it, one batch at a time. The
hand-off is a SimpleQueue in and ``call_soon_threadsafe`` out: about half the cost of
``run_in_executor`` on a ThreadPoolExecutor, which matters when the model itself takes 20 µs.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tensorgate.backends.base import Backend, LoadSpec
from tensorgate.backends.python_model import ModelError
from tensorgate.instances.base import HUNG_BATCH_S, BatchDone, Instance, InstanceDied, ModelFailed
from tensorgate.instances.batch_tensors import merge_inputs
from tensorgate.types import Array, TensorSpec

log = logging.getLogger(__name__)

_Done = Callable[[Any, BaseException | None], None]
_Job = tuple[Callable[[Any], Any], Any, _Done, asyncio.AbstractEventLoop]


def _resolve(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class _Worker:
    """One thread running submitted calls in order; results come back on the submitting loop."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        # Not "_thread": mypyc names the C field after the attribute, and __thread is a C keyword.
        self._runner = threading.Thread(target=self._run, name=name, daemon=True)
        self._runner.start()

    def call(self, fn: Callable[[Any], Any], arg: Any, on_done: _Done) -> None:
        """Run ``fn(arg)`` on the thread; ``on_done(result, error)`` then runs on the calling loop."""
        self._jobs.put((fn, arg, on_done, asyncio.get_running_loop()))

    def submit(self, fn: Callable[[Any], Any], arg: Any) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.call(fn, arg, functools.partial(_resolve, future))
        return future

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, arg, on_done, loop = job
            try:
                result, error = fn(arg), None
            except BaseException as exc:  # handed to the awaiting coroutine, never lost
                result, error = None, exc
            try:
                loop.call_soon_threadsafe(on_done, result, error)
            except RuntimeError:  # the loop closed while the job ran: nobody is waiting
                pass

    def stop(self) -> None:
        self._jobs.put(None)


class ThreadInstance(Instance):
    def __init__(
        self,
        name: str,
        backend: Backend,
        spec: LoadSpec,
        cpus: frozenset[int] | None = None,
        hung_after_s: float = HUNG_BATCH_S,
        backend_factory: Callable[[], Backend] | None = None,
    ) -> None:
        super().__init__(name, spec.device)
        self._backend = backend
        self._factory = backend_factory  # a fresh backend for a reload (restart); None: no restart
        self._spec = spec
        self._cpus = cpus
        self._worker = _Worker(f"instance-{name}")
        self._closed = False
        self._restarting = False
        self._hung_after_s = hung_after_s
        self._hung = False  # a batch outran hung_after_s and has not returned yet
        self._in_batch = 0  # batches handed to the thread and not yet returned
        self._generation = 0  # counts reloads: a batch of an abandoned thread that returns late is ignored
        self._watches: set[_HangWatch] = set()

    async def start(self) -> None:
        await self._worker.submit(self._load, self._spec)

    def _load(self, spec: LoadSpec) -> None:
        """On the worker thread: pin it first, so the runtime threads the load starts inherit the CPUs.

        Left to the OS scheduler, model threads are moved around the event loop's CPU and lose their
        caches each time; pinned, each keeps its CPU (``benchmarks/_ceiling.py`` says why the
        benchmarks serve one single-thread instance per CPU).
        """
        if self._cpus is not None:
            os.sched_setaffinity(0, self._cpus)  # 0: the calling thread
        self._backend.load(spec)

    def input_specs(self) -> tuple[TensorSpec, ...]:
        return self._backend.inputs()

    def output_specs(self) -> tuple[TensorSpec, ...]:
        return self._backend.outputs()

    async def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        """Run one batch (a warm-up or a probe). Counted as in the thread until the thread returns,
        even if the caller stops waiting (a probe's timeout): a reload must then not wait for it."""
        future: asyncio.Future[dict[str, Array]] = asyncio.get_running_loop().create_future()
        generation = self._generation
        self._in_batch += 1

        def returned(result: Any, error: BaseException | None) -> None:
            if generation == self._generation:
                self._in_batch -= 1
            _resolve(future, result, error)

        self._worker.call(self._run_model, inputs, returned)
        return await future

    def run_batch(self, parts: Sequence[Mapping[str, Array]], on_done: BatchDone) -> None:
        # One loop callback from the end of this batch to the scheduler starting the next; merging
        # on the worker keeps the copy off the event loop too.
        watch = _HangWatch(self, on_done)
        watch.timer = asyncio.get_running_loop().call_later(self._hung_after_s, watch.hung)
        self._in_batch += 1
        self._watches.add(watch)
        self._worker.call(self._merge_and_run, parts, watch.done)

    def _set_hung(self, hung: bool) -> None:
        if hung != self._hung and not self._closed:
            self._hung = hung
            if self.on_health_change is not None:
                self.on_health_change(self, self.available)

    def _merge_and_run(self, parts: Sequence[Mapping[str, Array]]) -> dict[str, Array]:
        return self._run_model(merge_inputs(parts, self.pads))

    def _run_model(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        """On the worker thread: the backend's own exceptions become ModelFailed."""
        try:
            return self._backend.execute(inputs)
        except Exception as exc:
            public = str(exc) if isinstance(exc, ModelError) else None
            raise ModelFailed(f"{type(exc).__name__}: {exc}", public) from exc

    @property
    def healthy(self) -> bool:
        return not self._closed and not self._hung and not self._restarting

    @property
    def can_restart(self) -> bool:
        return self._factory is not None

    async def restart(self) -> None:
        """Reload: the batch in flight fails as InstanceDied (retried elsewhere), a new thread loads a
        new backend and warms it; the old thread, if stuck in the model, is left behind (a daemon)."""
        if self._factory is None or self._closed:
            raise InstanceDied(f"instance {self.name} cannot be reloaded")
        self._restarting = True
        self._generation += 1
        for watch in list(self._watches):
            watch.abandon(f"instance {self.name} was restarted by its health checks")
        old_worker, old_backend, stuck = self._worker, self._backend, self._in_batch > 0
        if stuck:
            log.warning("instance %s is stuck in a batch; its thread is left behind", self.name)
            old_worker.stop()
        else:
            closing = old_worker.submit(lambda _: old_backend.close(), None)
            old_worker.stop()
            try:
                await closing
            except Exception:
                log.exception("closing instance %s before its reload", self.name)
        self._worker = _Worker(f"instance-{self.name}")
        self._backend = self._factory()
        self._in_batch = 0
        self._hung = False
        try:
            await self._worker.submit(self._load, self._spec)
            if self.warm is not None:
                await self.warm(self)
        finally:
            self._restarting = False
        if self.on_restart is not None:
            self.on_restart(self)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._hung or self._in_batch:
            # Still in the model after the scheduler stopped waiting for it (the exit timeout) or
            # past the hang limit: shutdown must not wait for it. The thread is a daemon.
            log.warning("instance %s is stuck in a batch; leaving its thread behind", self.name)
            self._worker.stop()
            return
        closed = self._worker.submit(lambda _: self._backend.close(), None)
        self._worker.stop()  # queued after the close, so the thread ends once the backend is closed
        await closed


class _HangWatch:
    """One batch's report, and what happens if it never comes.

    A thread cannot be killed, so a batch past ``hung_after_s`` is failed as ``InstanceDied`` (the
    scheduler retries it once on another instance) and the instance leaves rotation. If the model
    does return at last, its late result is dropped and the instance rejoins. A batch of a thread
    abandoned by a reload (``abandon``) is failed the same way, and whatever it returns is ignored.
    """

    __slots__ = ("_generation", "_instance", "_on_done", "timer")

    def __init__(self, instance: ThreadInstance, on_done: BatchDone) -> None:
        self._instance = instance
        self._generation = instance._generation
        self._on_done: BatchDone | None = on_done
        self.timer: asyncio.TimerHandle | None = None

    def done(self, outputs: Any, error: BaseException | None) -> None:
        instance = self._instance
        instance._watches.discard(self)
        if self.timer is not None:
            self.timer.cancel()
        if self._generation != instance._generation:  # from a thread a reload left behind
            return
        instance._in_batch -= 1
        if self._on_done is None:  # reported as hung already; the thread is free again
            instance._set_hung(False)
            return
        on_done, self._on_done = self._on_done, None
        on_done(outputs, error)

    def hung(self) -> None:
        self.timer = None
        if self._on_done is None:
            return
        on_done, self._on_done = self._on_done, None
        instance = self._instance
        instance._set_hung(True)
        on_done(None, InstanceDied(f"instance {instance.name} ran one batch past {instance._hung_after_s:g} s"))
        if instance.on_lost is not None:  # a thread has no restart to wait for
            instance.on_lost(instance)

    def abandon(self, reason: str) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self._instance._watches.discard(self)
        if self._on_done is not None:
            on_done, self._on_done = self._on_done, None
            on_done(None, InstanceDied(reason))
