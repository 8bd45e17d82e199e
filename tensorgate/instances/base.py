"""An Instance: one backend loaded on one device, running one batch at a time.

Running one batch at a time is the per-device concurrency limit: however many requests arrive,
a device never holds more than one batch of activations per instance, so load cannot drive it out
of memory. The scheduler only hands a batch to an instance that the pool reports idle.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence

from tensorgate.backends.base import Device
from tensorgate.instances.batch_tensors import merge_inputs
from tensorgate.types import Array, TensorSpec


class InstanceDied(Exception):
    """The instance stopped (its worker process exited) while or before running a batch.

    Inference is idempotent, so the scheduler retries the batch once on another instance.
    """


class ModelFailed(Exception):
    """The model itself raised on a batch: because of one of its inputs, or because the instance is
    broken. The scheduler runs the batch's requests again to tell which (``Scheduler._isolate``).
    ``public``: the message the model meant for the client (it raised ``tensorgate.ModelError``, or
    Triton's ``TritonModelException``); None when it is for the server log only."""

    def __init__(self, message: str, public: str | None = None) -> None:
        super().__init__(message)
        self.public = public


# A batch running longer is taken as hung: it fails as InstanceDied (retried once elsewhere) and
# the instance leaves rotation until it answers (a thread) or is killed and restarted (a worker).
HUNG_BATCH_S = 120.0

HealthListener = Callable[["Instance", bool], None]
# How a batch ends: ``(outputs, None)`` or ``(None, error)``, called on the event loop.
BatchDone = Callable[[dict[str, Array] | None, BaseException | None], None]


class Instance(abc.ABC):
    def __init__(self, name: str, device: Device) -> None:
        self.name = name
        self.device = device
        # Set by the owner to hear when the instance leaves or rejoins rotation (restart, death).
        self.on_health_change: HealthListener | None = None
        self.on_restart: Callable[[Instance], None] | None = None
        # Called when the instance is out of rotation with no return in sight (a restart failed, a
        # thread hung): with nothing else healthy, what waits for it is answered rather than left.
        self.on_lost: Callable[[Instance], None] | None = None
        # Run on a restarted instance before it rejoins rotation (the version's warm-up samples), so
        # no client pays for a cold start after a crash either. Raises ModelLoadError to fail the restart.
        self.warm: Callable[[Instance], Awaitable[object]] | None = None
        self._batches: set[asyncio.Task[dict[str, Array]]] = set()  # referenced until done
        # Taken out of rotation by its health checks (instances/health.py), alive or not.
        self.ejected = False
        # The ragged inputs' pad values: a batch pads shorter requests' rows with them (batch_tensors).
        self.pads: Mapping[str, float] = {}

    @property
    def pid(self) -> int | None:
        """The worker process running this instance; None for an instance in the server's own process."""
        return None

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

    def run_batch(self, parts: Sequence[Mapping[str, Array]], on_done: BatchDone) -> None:
        """Start one batch: the requests' inputs, merged along axis 0, run through :meth:`execute`.

        The scheduler's entry point. This default runs ``execute`` as a task; an instance with a
        worker thread overrides it to merge on that thread and report in one event-loop callback,
        because every loop turn between two batches is time the device sits idle.
        """
        task = asyncio.get_running_loop().create_task(self._execute_parts(parts))
        self._batches.add(task)

        def report(done: asyncio.Task[dict[str, Array]]) -> None:
            self._batches.discard(done)
            if done.cancelled():
                on_done(None, InstanceDied(f"the batch on {self.name} was cancelled"))
            elif (error := done.exception()) is not None:
                on_done(None, error)
            else:
                on_done(done.result(), None)

        task.add_done_callback(report)

    async def _execute_parts(self, parts: Sequence[Mapping[str, Array]]) -> dict[str, Array]:
        """The batch the parts make; an instance that can merge them on the way to its device overrides it."""
        return await self.execute(merge_inputs(parts, self.pads))

    @property
    @abc.abstractmethod
    def healthy(self) -> bool:
        """False while the instance cannot take work (dead, restarting)."""

    @property
    def available(self) -> bool:
        """In rotation: alive, and not taken out by its health checks. The pool hands work only to these."""
        return self.healthy and not self.ejected

    def set_ejected(self, ejected: bool) -> None:
        """Take the instance out of rotation, or bring it back (the health monitor's call)."""
        if ejected != self.ejected:
            self.ejected = ejected
            if self.on_health_change is not None:
                self.on_health_change(self, self.available)

    @property
    def can_restart(self) -> bool:
        """Whether :meth:`restart` is implemented (a worker process, a thread instance's reload)."""
        return False

    async def restart(self) -> None:
        """Stop whatever the instance runs (its batch fails as InstanceDied, so the scheduler retries it
        elsewhere), start it afresh and warm it. Raises ModelLoadError or InstanceDied when it cannot.
        The instance stays as ejected as it was: the health monitor brings it back after good probes."""
        raise NotImplementedError(f"instance {self.name} cannot be restarted")

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Unload the model and stop threads or processes. Idempotent."""
