"""Instance health checks: take a bad instance out of rotation, restart it, bring it back.

The story this project started from ended with every request timing out because traffic kept going
to a broken accelerator. An instance that is alive but answers wrongly or slowly must leave.

- :class:`HealthRecord` is the policy, pure: consecutive failures take an instance out of rotation
  at ``failure_threshold`` (at once for a fatal one: a hang, a dead worker); while out, good probes
  bring it back at ``success_threshold``.
- :class:`HealthMonitor` is the thin driver for one model version. Every ``interval_s`` it probes
  each instance that has run nothing since the last look and is idle (so a probe never takes a slot
  from real work): the probe sample (the warm-up's first sample, or zeros of the declared shapes)
  must answer within ``timeout_s`` with finite outputs wherever the reference gave finite ones.
  The reference is the warm-up's answer to the sample; without a warm-up, every good probe of any
  of the version's instances adds the outputs it found finite. So an instance that turns to NaN
  before its first probe is still caught once a healthy sibling has answered finite; a version
  whose only instance is bad from its first call cannot be told from a model that answers NaN.
  The scheduler reports real batches too: a success resets the count; an instance's own failure
  (it died, hung, or raised where the same batch then succeeded on another instance) counts.
- Taken out, an instance is restarted with exponential backoff (a worker process is killed and
  started again; a thread instance is reloaded on a new thread), which fails its batch in flight so
  the scheduler retries it elsewhere, and it rejoins after ``success_threshold`` good probes.
"""

from __future__ import annotations

import asyncio
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
        sample: Mapping[str, Array],
        finite: frozenset[str] | None,
        poke: Callable[[], None],
        on_probe: Callable[[Instance, bool], None] | None = None,
    ) -> None:
        self._label = label  # "model/version", for the log
        self._pool = pool
        self._settings = settings
        self._sample = sample
        self._finite = set(finite or ())  # grows with what good probes find finite
        self._poke = poke  # the scheduler looks at its queue again once an instance is free
        self._on_probe = on_probe  # counts each probe's outcome (metrics)
        self.records = {i: HealthRecord(settings.failure_threshold, settings.success_threshold) for i in pool.instances}
        self._tasks: set[asyncio.Task[None]] = set()
        self._probing: set[Instance] = set()
        self._stuck: set[Instance] = set()  # held by a probe that never returned, until restarted
        self._loop_task: asyncio.Task[None] | None = None
        self._closed = False

    def start(self) -> None:
        if self._settings.enabled:
            self._loop_task = asyncio.get_running_loop().create_task(self._watch())

    async def aclose(self) -> None:
        self._closed = True
        tasks = [t for t in (self._loop_task, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- what the scheduler reports --------------------------------------------------------------

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
        seen = dict(self._pool.uses)
        while True:
            await asyncio.sleep(self._settings.interval_s)
            for instance in self._pool.instances:
                record = self.records[instance]
                idle = self._pool.uses.get(instance) == seen.get(instance) and not self._pool.is_busy(instance)
                if record.in_rotation and idle and instance not in self._probing:
                    self._spawn(self._routine_probe(instance))
            seen = dict(self._pool.uses)

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
        if instance in self._probing or not self._pool.acquire_for_probe(instance):
            return None
        self._probing.add(instance)
        problem = ""
        try:
            outputs = await asyncio.wait_for(instance.execute(self._sample), self._settings.timeout_s)
            problem = probe_problem(outputs, self._finite)
            if not problem:
                self._finite |= finite_outputs(outputs)
        except TimeoutError:
            problem = f"the probe ran past its timeout of {self._settings.timeout_s:g} s"
            self._stuck.add(instance)  # still inside the model: held busy until its restart
        except (ModelFailed, InstanceDied) as exc:
            problem = f"the probe failed: {exc}"
        except Exception as exc:  # the boundary of a background probe
            problem = f"the probe failed: {type(exc).__name__}: {exc}"
        finally:
            self._probing.discard(instance)
            if instance not in self._stuck:
                self._pool.release(instance)
                self._poke()
        if self._on_probe is not None:
            self._on_probe(instance, not problem)
        return problem

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
        while not self._closed:
            await asyncio.sleep(RESTART_BACKOFF_S[min(attempt, len(RESTART_BACKOFF_S) - 1)])
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
                    if instance in self._stuck:  # the probe that hung is gone with the old thread or process
                        self._stuck.discard(instance)
                        self._pool.release(instance)
            while not record.in_rotation:
                problem = await self._probe(instance)
                if problem is None:  # busy (a probe still finishing): look again shortly
                    await asyncio.sleep(min(self._settings.interval_s, 0.05))
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
