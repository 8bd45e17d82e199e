"""The health monitor's timing, driven by hand: its every wait (the idle interval, a probe's timeout,
the restart backoff) is a sleep the test ends, so no test waits on the wall clock."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

import numpy as np

from tensorgate.backends.base import Device
from tensorgate.config.model_config import HealthCheck
from tensorgate.instances.base import Instance, InstanceDied, ModelFailed
from tensorgate.instances.health import BUSY_RECHECK_S, RESTART_BACKOFF_S, HealthMonitor
from tensorgate.instances.pool import InstancePool
from tensorgate.types import Array, DataType, TensorSpec

INTERVAL_S = 600.0
TIMEOUT_S = 0.25  # a length none of the backoff steps has, so the test can tell the waits apart
SAMPLE = {"x": np.zeros((1, 1), np.float32)}


class Timers:
    """The monitor's sleeps, each pending until the test ends it."""

    def __init__(self) -> None:
        self.asked: list[float] = []  # every sleep's length, in the order asked
        self._waiting: asyncio.Queue[tuple[float, asyncio.Future[None]]] = asyncio.Queue()
        self._held: list[tuple[float, asyncio.Future[None]]] = []

    async def sleep(self, seconds: float) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.asked.append(seconds)
        self._waiting.put_nowait((seconds, done))
        await done

    async def end(self, *lengths: float) -> float:
        """End the oldest pending sleep of one of these lengths, waiting for one to be asked; sleeps
        of other lengths stay pending. Returns the length ended."""
        while True:
            for entry in self._held:
                seconds, done = entry
                if seconds in lengths and not done.done():
                    self._held.remove(entry)
                    done.set_result(None)
                    return seconds
            self._held = [e for e in self._held if not e[1].done()]  # cancelled: the sleeper gave up
            self._held.append(await asyncio.wait_for(self._waiting.get(), 5))


class Fake(Instance):
    """An instance in the server's own loop: answers ones, raises while ``broken``, and while ``hang``
    is set holds every call until ``unhang`` is set (``holding`` is set once one is held). Counts
    calls, calls abandoned, restarts."""

    def __init__(self, name: str, *, restartable: bool = True) -> None:
        super().__init__(name, Device())
        self.restartable = restartable
        self.broken = False
        self.hang = False
        self.unhang = asyncio.Event()
        self.holding = asyncio.Event()
        self.calls = 0
        self.abandoned = 0  # calls cancelled while held
        self.restarts = 0
        self.last: Mapping[str, Array] = {}  # the inputs of the last call

    async def start(self) -> None:
        return None

    def input_specs(self) -> tuple[TensorSpec, ...]:
        return (TensorSpec("x", DataType.FP32, (-1, 1)),)

    output_specs = input_specs

    async def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        self.calls += 1
        self.last = inputs
        if self.hang:
            self.holding.set()
            try:
                await self.unhang.wait()
            except asyncio.CancelledError:
                self.abandoned += 1
                raise
        if self.broken:
            raise ModelFailed("device error")
        return {"x": np.ones((1, 1), np.float32)}

    @property
    def healthy(self) -> bool:
        return True

    @property
    def can_restart(self) -> bool:
        return self.restartable

    async def restart(self) -> None:
        self.restarts += 1

    async def aclose(self) -> None:
        return None


class Watched:
    """A monitor over ``instances`` on hand-driven timers, with events for ejection and return."""

    def __init__(
        self, *instances: Fake, failure_threshold: int = 3, sample: Mapping[str, Array] | None = SAMPLE
    ) -> None:
        self.timers = Timers()
        self.pool = InstancePool(instances)
        self.probes: list[tuple[str, bool]] = []
        self.probed = asyncio.Event()
        self.ejected = asyncio.Event()
        self.rejoined = asyncio.Event()
        settings = HealthCheck(interval_s=INTERVAL_S, timeout_s=TIMEOUT_S, failure_threshold=failure_threshold)
        self.monitor = HealthMonitor(
            "m/1", self.pool, settings, sample, None, lambda: None, on_probe=self._probe, sleep=self.timers.sleep
        )
        for instance in instances:
            instance.on_health_change = self._changed

    def _probe(self, instance: Instance, ok: bool) -> None:
        self.probes.append((instance.name, ok))
        self.probed.set()

    def _changed(self, instance: Instance, available: bool) -> None:
        (self.rejoined if available else self.ejected).set()

    async def until_probes(self, count: int) -> None:
        """Wait until ``count`` probes have ended, in all."""
        async with asyncio.timeout(5):
            while len(self.probes) < count:
                self.probed.clear()
                await self.probed.wait()


class Told(logging.Handler):
    """Hears the monitor's log lines that contain ``text``."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.WARNING)
        self.text = text
        self.records: list[logging.LogRecord] = []
        self.heard = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.records.append(record)
            self.heard.set()


async def test_restarts_back_off_exponentially_to_the_cap_and_start_over_on_the_next_ejection() -> None:
    bad = Fake("a")
    bad.broken = True  # every probe after a restart fails: it stays out and is restarted again
    watched = Watched(bad, Fake("b"))
    watched.monitor.start()
    watched.monitor.batch_failed(bad, InstanceDied("the worker exited"))
    waits = []
    for restarts in range(10):
        waits.append(await watched.timers.end(*RESTART_BACKOFF_S))
        assert bad.restarts == restarts  # each wait is followed by one restart, then the next wait
    assert waits == [0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert watched.probes == [("a", False)] * 9  # one failing probe after each restart so far
    bad.broken = False  # before the tenth restart's probe runs: that one passes
    await asyncio.wait_for(watched.rejoined.wait(), 5)
    assert bad.restarts == 10 and not bad.ejected
    assert watched.probes[-1] == ("a", True)
    bad.broken = True
    watched.monitor.batch_failed(bad, InstanceDied("the worker exited again"))
    assert await watched.timers.end(*RESTART_BACKOFF_S) == 0.0  # a new ejection starts from the first step
    await watched.monitor.aclose()


async def test_without_a_sample_the_model_answered_no_idle_instance_is_probed() -> None:
    instance = Fake("a")
    watched = Watched(instance, sample=None)
    watched.monitor.start()
    assert watched.monitor.wants_sample
    for _ in range(3):  # three idle intervals go by: nothing is sent to the model
        assert await watched.timers.end(INTERVAL_S) == INTERVAL_S
    await asyncio.sleep(0)
    assert instance.calls == 0 and watched.probes == []
    too_big = {"x": np.zeros((1 << 18, 2), np.float32)}  # 2 MiB: not kept as a probe sample
    watched.monitor.learn_sample(too_big)
    assert watched.monitor.wants_sample
    answered = {"x": np.full((1, 1), 7.0, np.float32)}
    watched.monitor.learn_sample(answered)
    answered["x"][0, 0] = -1.0  # the request's own array changes later: the sample is a copy
    assert not watched.monitor.wants_sample
    await watched.timers.end(INTERVAL_S)
    await watched.until_probes(1)
    assert watched.probes == [("a", True)] and instance.calls == 1
    assert instance.last["x"][0, 0] == 7.0  # what the model answered, not what the array became
    await watched.monitor.aclose()


async def test_without_a_sample_a_restarted_instance_rejoins_and_real_batches_judge_it() -> None:
    bad = Fake("a")
    watched = Watched(bad, Fake("b"), sample=None)
    watched.monitor.start()
    watched.monitor.batch_failed(bad, InstanceDied("the worker exited"))
    await asyncio.wait_for(watched.ejected.wait(), 5)
    assert await watched.timers.end(*RESTART_BACKOFF_S) == 0.0
    await asyncio.wait_for(watched.rejoined.wait(), 5)  # restarted: back without a probe of made-up inputs
    assert bad.restarts == 1 and watched.probes == [] and bad.calls == 0
    await watched.monitor.aclose()


async def test_a_probe_that_times_out_on_an_idle_instance_takes_it_out_until_its_restart() -> None:
    bad = Fake("a")
    watched = Watched(bad)
    watched.monitor.start()
    bad.hang = True
    await watched.timers.end(INTERVAL_S)  # idle for an interval: probed, and the probe hangs
    await watched.timers.end(TIMEOUT_S)
    await asyncio.wait_for(watched.ejected.wait(), 5)  # a hang is fatal: out at once
    assert "ran past its timeout" in watched.monitor.records[bad].last_error
    assert watched.pool.is_busy(bad)  # the model may still be running the probe: held until the restart
    bad.hang = False
    await watched.timers.end(RESTART_BACKOFF_S[0])
    await asyncio.wait_for(watched.rejoined.wait(), 5)
    assert bad.restarts == 1
    assert bad.abandoned == 1  # the hung probe went with the old instance: its late answer counts for nothing
    assert watched.probes == [("a", False), ("a", True)]
    assert watched.pool.acquire() is bad  # free again for real work
    await watched.monitor.aclose()


async def test_an_instance_that_cannot_restart_waits_for_its_hung_probe_without_polling() -> None:
    """It cannot be restarted, so nothing frees it but the model returning from the probe: recovery
    waits for that (logging once why), rather than trying to probe it every few milliseconds."""
    bad = Fake("a", restartable=False)
    watched = Watched(bad)
    told = Told("cannot be restarted")
    logger = logging.getLogger("tensorgate.instances.health")
    logger.addHandler(told)
    try:
        watched.monitor.start()
        bad.hang = True
        await watched.timers.end(INTERVAL_S)
        await watched.timers.end(TIMEOUT_S)
        await asyncio.wait_for(watched.ejected.wait(), 5)
        await watched.timers.end(RESTART_BACKOFF_S[0])
        await asyncio.wait_for(told.heard.wait(), 5)  # recovery now waits on the model
        assert watched.probes == [("a", False)] and watched.pool.is_busy(bad)
        bad.hang = False
        bad.unhang.set()  # the model returns from the hung probe at last
        await asyncio.wait_for(watched.rejoined.wait(), 5)
    finally:
        logger.removeHandler(told)
    assert bad.restarts == 0 and bad.abandoned == 0
    assert watched.probes == [("a", False), ("a", True)]
    assert BUSY_RECHECK_S not in watched.timers.asked
    assert len(told.records) == 1 and "instance a of m/1" in told.records[0].getMessage()
    assert watched.pool.acquire() is bad
    await watched.monitor.aclose()


async def test_probes_never_take_an_instance_from_real_work_and_come_every_idle_interval() -> None:
    busy, idle = Fake("a"), Fake("b")
    watched = Watched(busy, idle)
    watched.monitor.start()
    assert watched.pool.acquire() is busy  # a real batch runs on it
    assert not watched.pool.acquire_for_probe(busy)
    await watched.timers.end(INTERVAL_S)
    await watched.until_probes(1)
    assert watched.probes == [("b", True)]
    assert busy.calls == 0 and watched.pool.is_busy(busy)
    watched.pool.release(busy)  # its batch ends: it ran something since the last look
    await watched.timers.end(INTERVAL_S)
    await watched.until_probes(2)
    # The idle one is probed again (its own probe is no activity); the other ran work meanwhile.
    assert watched.probes == [("b", True), ("b", True)]
    await watched.timers.end(INTERVAL_S)
    await watched.until_probes(4)
    assert sorted(watched.probes[2:]) == [("a", True), ("b", True)]
    await watched.monitor.aclose()


async def test_a_probe_that_began_before_the_restart_and_hangs_is_freed_by_the_next_restart() -> None:
    """Taken out by a real batch's failure while its idle probe runs: the restart cannot free a probe
    that has not timed out yet, and when it does time out, the next restart frees the instance."""
    bad = Fake("a")
    watched = Watched(bad, failure_threshold=1)
    watched.monitor.start()
    bad.hang = True
    await watched.timers.end(INTERVAL_S)  # idle: probed, and the probe hangs
    await asyncio.wait_for(bad.holding.wait(), 5)
    bad.hang = False  # later calls answer
    watched.monitor.batch_failed(bad, ModelFailed("device error (another instance answered)"))
    await asyncio.wait_for(watched.ejected.wait(), 5)
    await watched.timers.end(RESTART_BACKOFF_S[0])  # restart 1; its probe finds the instance held
    await watched.timers.end(BUSY_RECHECK_S)
    await watched.timers.end(TIMEOUT_S)  # the old probe times out
    await watched.timers.end(BUSY_RECHECK_S)
    await watched.timers.end(RESTART_BACKOFF_S[1])  # restart 2 frees it
    await asyncio.wait_for(watched.rejoined.wait(), 5)
    assert bad.restarts == 2 and bad.abandoned == 1
    assert watched.probes == [("a", False), ("a", True)]
    await watched.monitor.aclose()
