"""Instance health checks: take a bad instance out of rotation, restart it, bring it back.

The story this project started from ended with every request timing out because traffic kept going
to a broken accelerator. An instance that is alive but answers wrongly or slowly must leave.

- :class:`HealthRecord` is the policy, pure: consecutive failures take an instance out of rotation
  at ``failure_threshold`` (at once for a fatal one: a hang, a dead worker); while out, good probes
  bring it back at ``success_threshold``.
- :class:`HealthMonitor` is the thin driver for one model version. Every ``interval_s`` it probes
  each instance that has run nothing since the last look and is idle (so a probe never takes a slot
  from real work): the probe sample must answer within ``timeout_s`` with finite outputs wherever
  the reference gave finite ones. A probe only ever sends inputs this model has answered: the
  warm-up's first sample, or else the inputs of one real request it answered (the first, copied,
  when they hold at most ``MAX_LEARNED_SAMPLE_BYTES``; kept by this version's monitor only, so they
  never reach another model). Until it has such a sample an idle instance is not probed (invented
  inputs, such as zeros for a model that parses its BYTES as numbers, would fail a healthy
  instance); its real batches still count, and after a restart it rejoins without a probe.
  The reference is the warm-up's answer to the sample; without a warm-up, every good probe of any
  of the version's instances adds the outputs it found finite. So an instance that turns to NaN
  before its first probe is still caught once a healthy sibling has answered finite; a version
  whose only instance is bad from its first call cannot be told from a model that answers NaN.
  The scheduler reports real batches too: a success resets the count; an instance's own failure
  (it died, hung, or raised where the same batch then succeeded on another instance) counts.
- Taken out, an instance is restarted with exponential backoff (a worker process is killed and
  started again; a thread instance is reloaded on a new thread), which fails its batch in flight so
  the scheduler retries it elsewhere, and it rejoins after ``success_threshold`` good probes.
- A probe that runs past ``timeout_s`` leaves the instance held busy (the model may still be running
  it) until its restart, or, for an instance that cannot restart, until the model returns from it.

Every wait (the idle interval, a probe's timeout, the restart backoff) goes through the ``sleep``
the monitor is given, so a test can drive them by hand.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine, Mapping, Set
from typing import Any

import numpy as np

from tensorgate.config.model_config import HealthCheck
from tensorgate.instances.base import Instance, InstanceDied, ModelFailed
from tensorgate.instances.pool import InstancePool
from tensorgate.types import Array

log = logging.getLogger(__name__)

RESTART_BACKOFF_S = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
# A real request's inputs are kept as the probe sample only up to this size (a small request comes
# soon enough on any model that serves; an image batch is not worth holding for probes).
MAX_LEARNED_SAMPLE_BYTES = 1 << 20
# How often recovery looks again at an instance it cannot probe yet (a routine probe still finishing).
BUSY_RECHECK_S = 0.05


class HealthRecord:
    """One instance's run of failures and successes, and whether it is in rotation."""

    __slots__ = ("_failure_threshold", "_success_threshold", "failures", "in_rotation", "last_error", "successes")

    def __init__(self, failure_threshold: int, success_threshold: int) -> None:
        self._failure_threshold = failure_threshold
        self._success_threshold = success_threshold
        self.failures = 0
        self.successes = 0
        self.in_rotation = True
        self.last_error = ""

    def failed(self, error: str, *, fatal: bool = False) -> bool:
        """Count a failure; True when it takes the instance out of rotation."""
        self.failures += 1
        self.successes = 0
        self.last_error = error
        if self.in_rotation and (fatal or self.failures >= self._failure_threshold):
            self.in_rotation = False
            return True
        return False

    def succeeded(self) -> bool:
        """Count a success; True when it brings the instance back into rotation."""
        self.failures = 0
        if self.in_rotation:
            return False
        self.successes += 1
        if self.successes >= self._success_threshold:
            self.in_rotation = True
            self.successes = 0
            return True
        return False


def finite_outputs(outputs: Mapping[str, Array]) -> frozenset[str]:
    """The numeric outputs whose every element is finite (the ones a probe holds to that)."""
    return frozenset(
        name for name, array in outputs.items() if array.dtype.kind in "fc" and bool(np.isfinite(array).all())
    )


def probe_problem(outputs: Mapping[str, Array], finite: Set[str]) -> str:
    """Why a probe's outputs are bad ("" when they are good)."""
    for name in sorted(finite):
        array = outputs.get(name)
        if array is None:
            return f"the probe returned no output '{name}'"
        if not bool(np.isfinite(array).all()):
            return f"output '{name}' holds non-finite values where the reference's were finite"
    return ""


class HealthMonitor:
    """Probes, failure counts, ejection and recovery for the instances of one model version."""

    def __init__(
        self,
        label: str,
        pool: InstancePool,
        settings: HealthCheck,
        sample: Mapping[str, Array] | None,
        finite: frozenset[str] | None,
        poke: Callable[[], None],
        on_probe: Callable[[Instance, bool], None] | None = None,
        sleep: Callable[[float], Coroutine[Any, Any, None]] = asyncio.sleep,
    ) -> None:
        self._label = label  # "model/version", for the log
        self._pool = pool
        self._settings = settings
        self._sample = sample
        self._finite = set(finite or ())  # grows with what good probes find finite
        self._poke = poke  # the scheduler looks at its queue again once an instance is free
        self._on_probe = on_probe  # counts each probe's outcome (metrics)
        self._sleep = sleep  # every wait: the idle interval, a probe's timeout, the restart backoff
        self.records = {i: HealthRecord(settings.failure_threshold, settings.success_threshold) for i in pool.instances}
        self._tasks: set[asyncio.Task[None]] = set()
        self._probing: set[Instance] = set()
        # The pool counts every batch an instance finished; these many were probes, not work.
        self._probes_done = dict.fromkeys(pool.instances, 0)
        # A probe that ran past its timeout, still running in the model: the instance stays held
        # busy until it is restarted or the probe returns (whichever comes first releases it).
        self._stuck: dict[Instance, asyncio.Task[dict[str, Array]]] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self._closed = False

    def start(self) -> None:
        if self._settings.enabled:
            self._loop_task = asyncio.get_running_loop().create_task(self._watch())

    async def aclose(self) -> None:
        self._closed = True
        stuck, self._stuck = list(self._stuck.values()), {}
        tasks = [t for t in (self._loop_task, *self._tasks, *stuck) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- what the scheduler reports --------------------------------------------------------------

    @property
    def wants_sample(self) -> bool:
        """No probe sample yet: the scheduler offers the inputs of a request the model answered."""
        return self._sample is None and self._settings.enabled

    def learn_sample(self, inputs: Mapping[str, Array]) -> None:
        """Inputs the model answered (a request's, in a batch that succeeded), kept as the probe
        sample when they are small enough; copied, as a request's arrays may be views of a client's
        shared memory or of the body it came in."""
        if self._sample is not None or sum(int(a.nbytes) for a in inputs.values()) > MAX_LEARNED_SAMPLE_BYTES:
            return
        self._sample = {name: np.array(array, copy=True) for name, array in inputs.items()}

    def batch_ok(self, instance: Instance) -> None:
        record = self.records.get(instance)
        if record is not None and record.in_rotation:
            record.failures = 0

    def batch_failed(self, instance: Instance, error: BaseException) -> None:
        """A real batch failed for the instance's own reasons; a death or a hang takes it out at once."""
        record = self.records.get(instance)
        if record is None or self._closed or not self._settings.enabled:
            return
        if record.failed(_describe(error), fatal=isinstance(error, InstanceDied)):
            self._eject(instance, record)

    # -- probes ----------------------------------------------------------------------------------

    async def _watch(self) -> None:
        seen = self._work_done()
        while True:
            await self._sleep(self._settings.interval_s)
            done = self._work_done()
            for instance in self._pool.instances:
                record = self.records[instance]
                idle = done[instance] == seen[instance] and not self._pool.is_busy(instance)
                if record.in_rotation and idle and instance not in self._probing and self._sample is not None:
                    self._spawn(self._routine_probe(instance))
            seen = done

    def _work_done(self) -> dict[Instance, int]:
        """Batches of real work each instance has finished: its own probes are no sign of activity,
        so an idle instance is probed every ``interval_s``, not every other one."""
        uses = self._pool.uses
        return {i: uses.get(i, 0) - self._probes_done[i] for i in self._pool.instances}

    async def _routine_probe(self, instance: Instance) -> None:
        problem = await self._probe(instance)
        if problem is None:
            return  # not probed: work came first
        record = self.records[instance]
        if not problem:
            record.succeeded()
        elif record.failed(problem, fatal=instance in self._stuck):
            self._eject(instance, record)

    async def _probe(self, instance: Instance) -> str | None:
        """Run the probe sample on an idle instance: "" when good, the problem when not, None when
        the instance was busy (real work goes first)."""
        sample = self._sample
        assert sample is not None, "probed without a sample the model has answered"
        if instance in self._probing or not self._pool.acquire_for_probe(instance):
            return None
        self._probing.add(instance)
        problem = ""
        loop = asyncio.get_running_loop()
        run = loop.create_task(instance.execute(sample))
        timer = loop.create_task(self._sleep(self._settings.timeout_s))
        try:
            await asyncio.wait((run, timer), return_when=asyncio.FIRST_COMPLETED)
            if not run.done():
                problem = f"the probe ran past its timeout of {self._settings.timeout_s:g} s"
                # Not cancelled: a thread cannot be stopped, so the instance is held until the
                # model returns from it (released then, see _unstick) or the instance restarts.
                self._stuck[instance] = run
                run.add_done_callback(functools.partial(self._unstick, instance))
            elif run.cancelled():  # by the instance itself (a thread instance's reload abandons its work)
                problem = "the probe was cancelled"
            else:
                outputs = run.result()
                problem = probe_problem(outputs, self._finite)
                if not problem:
                    self._finite |= finite_outputs(outputs)
        except asyncio.CancelledError:  # the monitor closes
            run.cancel()
            raise
        except (ModelFailed, InstanceDied) as exc:
            problem = f"the probe failed: {exc}"
        except Exception as exc:  # the boundary of a background probe
            problem = f"the probe failed: {type(exc).__name__}: {exc}"
        finally:
            timer.cancel()
            self._probing.discard(instance)
            if self._stuck.get(instance) is not run:
                self._free(instance)
        if self._on_probe is not None:
            self._on_probe(instance, not problem)
        return problem

    def _unstick(self, instance: Instance, run: asyncio.Task[dict[str, Array]]) -> None:
        """A probe that ran past its timeout returned at last: the instance is free, unless a restart
        (or a later stuck probe) took over its hold meanwhile."""
        if not run.cancelled():
            run.exception()  # retrieved: the probe was already counted as failing
        if self._stuck.get(instance) is run:
            del self._stuck[instance]
            self._free(instance)

    def _release_stuck(self, instance: Instance) -> None:
        """The instance restarted: the probe that hung is gone with its old thread or process, and
        whatever it returns late is no answer of the new one."""
        run = self._stuck.pop(instance, None)
        if run is not None:
            run.cancel()
            self._free(instance)

    def _free(self, instance: Instance) -> None:
        """Give back an instance a probe held; the scheduler looks at its queue again."""
        self._probes_done[instance] += 1
        self._pool.release(instance)
        self._poke()

    # -- out of rotation and back ----------------------------------------------------------------

    def _eject(self, instance: Instance, record: HealthRecord) -> None:
        instance.set_ejected(True)
        log.warning(
            "instance %s of %s on %s is out of rotation after %d failure(s): %s",
            instance.name,
            self._label,
            instance.device,
            record.failures,
            record.last_error,
        )
        self._spawn(self._recover(instance, record))

    async def _recover(self, instance: Instance, record: HealthRecord) -> None:
        """Restart with backoff until ``success_threshold`` probes in a row pass, then rejoin."""
        attempt = 0
        told = False  # that an instance which cannot restart waits for its stuck probe (logged once)
        while not self._closed:
            await self._sleep(RESTART_BACKOFF_S[min(attempt, len(RESTART_BACKOFF_S) - 1)])
            attempt += 1
            if instance.can_restart:
                try:
                    await instance.restart()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.error("instance %s: restart %d failed: %s", instance.name, attempt, _describe(exc))
                    continue
                finally:
                    self._release_stuck(instance)
            if self._sample is None:  # nothing the model is known to answer: its real batches judge it
                record.in_rotation = True
                record.failures = record.successes = 0
            while not record.in_rotation:
                stuck = self._stuck.get(instance)
                if stuck is not None:  # a probe hung: nothing to probe until it ends
                    if instance.can_restart:
                        break  # it began before the restart (the instance was taken out meanwhile): the next frees it
                    if not told:
                        told = True
                        log.warning(
                            "instance %s of %s cannot be restarted: it stays out of rotation until the "
                            "model returns from the probe that ran past its timeout",
                            instance.name,
                            self._label,
                        )
                    await asyncio.wait((stuck,))
                    continue
                problem = await self._probe(instance)
                if problem is None:  # busy (a probe still finishing): look again shortly
                    await self._sleep(min(self._settings.interval_s, BUSY_RECHECK_S))
                    continue
                if problem:
                    record.failed(problem)
                    log.warning("instance %s: a probe after restart %d failed: %s", instance.name, attempt, problem)
                    break
                record.succeeded()
            if record.in_rotation:
                instance.set_ejected(False)
                log.info(
                    "instance %s of %s is back in rotation after %d restart(s)", instance.name, self._label, attempt
                )
                self._poke()
                return

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _describe(error: BaseException) -> str:
    text = str(error)
    return text if isinstance(error, ModelFailed | InstanceDied) else f"{type(error).__name__}: {text}"
