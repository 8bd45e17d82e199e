"""Models in bounded memory: on-demand models load on their first request, idle ones make room.

The driver around the pure policy of :mod:`tensorgate.models.residency`. The ModelManager owns one
:class:`MemoryBudget` and hands it every version load it makes (:meth:`MemoryBudget.admit`), and
the service hands it the requests that find an on-demand model not loaded
(:meth:`MemoryBudget.ensure_loaded`). What it keeps per model lives on the model's entry
(:class:`Residence`).

- Every measured load runs under one lock: room is planned, idle on-demand models are evicted
  (drained and unloaded through the manager's own retire path), the version loads, and its size is
  measured, with no other load in between. The lock is also what makes an in-process measurement
  mean something: the process's growth during a load is that load's alone.
- A model's size is measured at its load: the resident size of its worker processes
  (``isolation: process``), else the growth of this process during the load (the larger of its
  resident size's and of what malloc handed out: see :func:`tensorgate.memory.allocated_bytes`).
  Before a model's first load its size is unknown: room is made for the size of its files (weights
  are read into memory), then the measurement is checked against the budget and more is evicted,
  or the version is unloaded again and fails.
- The first request for a model that is not loaded starts its load; every request that comes while
  it runs waits on the same load, each within its own deadline. A load that finds no room (what
  holds the memory is pinned or serving) waits for a model to go idle, and evicts it then, for as
  long as a request waits on it: until the last deadline among them has passed, or
  :data:`NO_ROOM_WAIT_S` for a request with no deadline (which then gets 503 with Retry-After; the
  next request tries again). A load no request waits for (the repository API's) is refused at once.
  A model measured larger than the whole budget fails (503, its reason naming the sizes) until its
  files change.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensorgate.clock import Clock
from tensorgate.config.model_config import ALWAYS_RESIDENT
from tensorgate.errors import DeadlineExceeded, ModelLoadError, Unavailable
from tensorgate.memory import allocated_bytes, resident_bytes
from tensorgate.models.residency import Held, Refusal, describe_bytes, plan_room
from tensorgate.models.servable import Servable
from tensorgate.observability.metrics import Metrics
from tensorgate.repository.source import ModelSource, VersionSource

if TYPE_CHECKING:
    from tensorgate.models.entry import ModelEntry

log = logging.getLogger(__name__)

# How long a client refused for want of room is asked to wait: about what a request to the models
# holding the memory takes to finish, after which they are idle and can be evicted.
NO_ROOM_RETRY_S = 1.0
# How long a load waits for room on behalf of a request with no deadline (MemoryBudget.room_wait_s).
NO_ROOM_WAIT_S = 30.0
# How often a load waiting for room looks again. A model goes idle when its last request, queued
# request or running batch ends: many places, none of which tells the budget; a look plans over the
# loaded models only, and bounds what the wait adds to a cold start.
ROOM_POLL_S = 0.02


class NoRoom(ModelLoadError):
    """The version cannot be loaded now: what holds the budget is pinned or serving. Not a lasting
    failure: the next request tries again."""


@dataclass(slots=True)
class Residence:
    """A model's memory residency, kept on its entry; read and written on the event loop only."""

    on_demand: bool = False
    # Should be loaded now: always for a resident model; for an on-demand one from the start of a
    # load (a request's, or the repository API's) until its eviction.
    wanted: bool = True
    active: int = 0  # the model's requests inside the service now: waiting for its load, queued or running
    last_used: float = 0.0
    cold_load: asyncio.Task[None] | None = None  # the load that requests for it wait on
    evicting: bool = False
    held: dict[Servable, int] = field(default_factory=dict)  # loaded or draining: bytes measured
    sizes: dict[tuple[int, str], int] = field(default_factory=dict)  # (version, revision) -> bytes measured
    measured_bytes: int | None = None  # what it held at its last load, kept across an eviction
    refusal: Refusal | None = None  # why its last load was refused (for the answer to the waiting requests)
    waiting: int = 0  # requests waiting on its cold load now
    # Until when its cold load may wait for room: a little past the latest deadline among the
    # requests that waited on it, or room_wait_s after one with no deadline came. None: no wait.
    room_until: float | None = None

    @property
    def held_bytes(self) -> int:
        return sum(self.held.values())


class MemoryBudget:
    """Plans, loads on demand and evicts, for the ModelManager that built it."""

    def __init__(
        self,
        clock: Clock,
        metrics: Metrics,
        budget_bytes: int | None,
        default_residency: str,
        *,
        models: Mapping[str, ModelEntry],
        load: Callable[[ModelEntry], Awaitable[None]],
        retire: Callable[[ModelEntry], list[asyncio.Task[None]]],
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]],
    ) -> None:
        self.budget_bytes = budget_bytes
        self.default_residency = default_residency
        self._clock = clock
        self._metrics = metrics
        self._models = models  # the manager's, by name
        self._load = load  # bring a model in line with its source (the manager's apply)
        self._retire = retire  # take every version of a model out of service: the drains
        self._spawn = spawn
        self._lock = asyncio.Lock()
        self.room_wait_s = NO_ROOM_WAIT_S  # a load's wait for room for a request with no deadline
        if budget_bytes is not None:
            metrics.memory_budget_bytes.labels().set(budget_bytes)

    def on_demand(self, source: ModelSource) -> bool:
        """Whether the model loads on its first request (its config, else the server's default)."""
        if source.backend in ALWAYS_RESIDENT:  # the config refuses on_demand for these
            return False
        return (source.config.model_residency or self.default_residency) == "on_demand"

    @property
    def enabled(self) -> bool:
        """Whether residency is in play: a budget, or any on-demand model."""
        return self.budget_bytes is not None or any(e.residence.on_demand for e in self._models.values())

    def measures(self, entry: ModelEntry) -> bool:
        return self.budget_bytes is not None or entry.residence.on_demand

    # -- requests ----------------------------------------------------------------------------------

    async def ensure_loaded(self, entry: ModelEntry, timeout_s: float | None) -> float | None:
        """For a request to an on-demand model with no version loaded: start its load, or join the
        one running, and wait for it within the request's deadline (``timeout_s``, else the model's
        ``default_timeout_ms``). The load waits for room as long as this request may (see
        :attr:`Residence.room_until`). Returns what is left of that deadline (None: none). Raises
        Unavailable (the load failed or found no room) or DeadlineExceeded."""
        residence = entry.residence
        started = self._clock.now()
        batching = entry.source.config.dynamic_batching
        if timeout_s is None and batching is not None and batching.default_timeout_ms is not None:
            timeout_s = batching.default_timeout_ms / 1000.0
        # Past the deadline by one look: the request's own timer answers it 504 before the load
        # gives up on its behalf, so what it is told does not hang on which fires first.
        until = started + (self.room_wait_s if timeout_s is None else timeout_s + ROOM_POLL_S)
        if residence.room_until is None or until > residence.room_until:
            residence.room_until = until
        residence.waiting += 1  # before the load starts: it waits for room only while a request waits on it
        try:
            task = residence.cold_load
            if task is None:
                task = residence.cold_load = self._spawn(self._cold_load(entry))
                task.add_done_callback(_retrieve)
            if timeout_s is None:
                await asyncio.shield(task)
                return None
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout_s)
            except TimeoutError:
                raise _late(entry, timeout_s) from None
        finally:
            residence.waiting -= 1
        remaining = timeout_s - (self._clock.now() - started)
        if remaining <= 0:
            raise _late(entry, timeout_s)
        return remaining

    async def _cold_load(self, entry: ModelEntry) -> None:
        residence = entry.residence
        name = entry.source.name
        started = self._clock.now()
        residence.wanted = True
        residence.refusal = None
        try:
            await self._load(entry)
        except ModelLoadError as exc:
            residence.wanted = bool(entry.versions)  # a version that did load stays, evictable
            refusal = residence.refusal
            self._metrics.residency_loads.labels(name, "failed" if refusal is None else refusal.value).inc()
            retry = NO_ROOM_RETRY_S if refusal is Refusal.NO_ROOM else None
            raise Unavailable(f"model '{name}' could not be loaded: {exc}", retry_after_s=retry) from None
        finally:
            residence.cold_load = None
            residence.room_until = None
        elapsed = self._clock.now() - started
        self._metrics.residency_loads.labels(name, "loaded").inc()
        self._metrics.cold_start_seconds.labels(name).observe(elapsed)
        log.info(
            "model %s is resident (cold start %.0f ms, %s)",
            name,
            elapsed * 1000,
            describe_bytes(residence.held_bytes),
        )

    # -- loads -------------------------------------------------------------------------------------

    async def admit(
        self, entry: ModelEntry, vsource: VersionSource, build: Callable[[], Awaitable[Servable]]
    ) -> Servable:
        """Every version load of the manager: make room for it, load it with ``build``, measure it
        and keep the budget. With no room now it waits for some while a request waits on the load
        (:attr:`Residence.room_until`). Raises ModelLoadError (NoRoom: not now) and what ``build``
        raises."""
        if not self.measures(entry):
            return await build()
        residence = entry.residence
        started = self._clock.now()
        files: int | None = None
        waited_for_room = False
        while True:
            async with self._lock:
                known = residence.sizes.get((vsource.version, vsource.revision))
                if known is None and files is None:
                    files = await asyncio.to_thread(_files_bytes, vsource.directory)
                try:
                    return await self._admit_now(entry, vsource, build, known, files or 0)
                except NoRoom as exc:
                    now = self._clock.now()
                    until = residence.room_until
                    if until is None or residence.waiting == 0 or now >= until:
                        self._refuse(entry, Refusal.NO_ROOM)
                        if now - started < ROOM_POLL_S:
                            raise
                        waited = f"; waited {(now - started) * 1000:.0f} ms for one to go idle"
                        raise NoRoom(f"{exc}{waited}") from None
                    if not waited_for_room:
                        waited_for_room = True
                        log.info("model %s waits for room: %s", entry.source.name, exc)
            await asyncio.sleep(ROOM_POLL_S)

    async def _admit_now(
        self,
        entry: ModelEntry,
        vsource: VersionSource,
        build: Callable[[], Awaitable[Servable]],
        known: int | None,
        files: int,
    ) -> Servable:
        """One try at :meth:`admit`, under the lock: NoRoom when what holds the budget is busy."""
        name = entry.source.name
        budget = self.budget_bytes
        need = known if known is not None else files
        if budget is not None:
            if known is not None and known > budget:
                self._refuse(entry, Refusal.TOO_LARGE)
                raise ModelLoadError(_too_large(name, vsource.version, known, budget))
            # Never measured: room for its files where that can be had; else it loads, and its
            # measurement decides (more evictions, or it is unloaded again).
            await self._make_room(entry, vsource, min(need, budget), strict=known is not None)
        version, size = await self._measured_build(entry, build)
        entry.residence.sizes[(vsource.version, vsource.revision)] = size
        if budget is not None:
            try:
                if size > budget:
                    self._refuse(entry, Refusal.TOO_LARGE)
                    raise ModelLoadError(_too_large(name, vsource.version, size, budget))
                await self._make_room(entry, vsource, size)
            except ModelLoadError:
                await version.aclose(0.0)  # loaded, never served: nothing to drain
                raise
        self._hold(entry, version, size)
        return version

    async def _make_room(self, entry: ModelEntry, vsource: VersionSource, need: int, *, strict: bool = True) -> None:
        plan = plan_room(self._held(), need, self.budget_bytes)
        if not plan.fits and not strict:
            return
        if not plan.fits:
            raise NoRoom(
                f"no room within the memory budget of {describe_bytes(self.budget_bytes or 0)} for version "
                f"{vsource.version} ({describe_bytes(need)}): {describe_bytes(plan.used_bytes)} is held by "
                "models that are serving or resident"
            )
        if plan.evict:
            await self._evict(plan.evict, for_model=entry.source.name)

    async def _evict(self, names: tuple[str, ...], for_model: str) -> None:
        """Take the chosen models out of service in this step (no request can reach them after it),
        then wait until they have drained and unloaded, so their memory is free."""
        drains: list[asyncio.Task[None]] = []
        evicted: list[ModelEntry] = []
        for name in names:
            entry = self._models[name]
            residence = entry.residence
            residence.measured_bytes = residence.held_bytes
            residence.wanted = False
            residence.evicting = True
            drains.extend(self._retire(entry))
            evicted.append(entry)
            self._metrics.residency_evictions.labels(name).inc()
            log.info(
                "model %s is evicted to make room for %s (%s, idle for %.1f s)",
                name,
                for_model,
                describe_bytes(residence.measured_bytes),
                self._clock.now() - residence.last_used,
            )
        try:
            await asyncio.gather(*drains)
        finally:
            for entry in evicted:
                entry.residence.evicting = False

    async def _measured_build(
        self, entry: ModelEntry, build: Callable[[], Awaitable[Servable]]
    ) -> tuple[Servable, int]:
        groups = entry.source.config.instance_group
        if groups and all(group.isolation == "process" for group in groups):
            version = await build()  # each worker's resident size is its own: nothing else to subtract
            sizes = [resident_bytes(pid) for pid in version.worker_pids()]
            return version, sum(size for size in sizes if size is not None)
        before = _in_process()
        version = await build()
        after = _in_process()
        return version, max(0, after[0] - before[0], after[1] - before[1])

    def _hold(self, entry: ModelEntry, version: Servable, size: int) -> None:
        residence = entry.residence
        residence.held[version] = size
        residence.measured_bytes = residence.held_bytes
        residence.last_used = self._clock.now()
        self._publish(entry)

    def release(self, entry: ModelEntry, version: Servable) -> None:
        """A version's drain is over (the manager's call): its memory is free."""
        if entry.residence.held.pop(version, None) is not None:
            self._publish(entry)

    def _publish(self, entry: ModelEntry) -> None:
        self._metrics.resident_bytes.labels(entry.source.name).set(entry.residence.held_bytes)

    def _refuse(self, entry: ModelEntry, refusal: Refusal) -> None:
        entry.residence.refusal = refusal  # the cold load answers its waiting requests with it
        log.warning("model %s cannot be loaded within the memory budget (%s)", entry.source.name, refusal.value)

    def _held(self) -> list[Held]:
        held = []
        for name, entry in self._models.items():
            residence = entry.residence
            if not residence.held:
                continue
            busy = (
                residence.active > 0
                or residence.cold_load is not None
                or residence.evicting
                or entry.lock.locked()
                or any(v.queued or v.running for v in entry.versions.values())
            )
            held.append(Held(name, residence.held_bytes, residence.last_used, busy, not residence.on_demand))
        return held

    # -- what the index and metadata show ----------------------------------------------------------

    def status(self, entry: ModelEntry) -> dict[str, Any]:
        """The model's residency for the repository index and its metadata."""
        residence = entry.residence
        if residence.evicting:
            state = "EVICTING"
        elif residence.cold_load is not None or (entry.lock.locked() and not entry.versions):
            state = "LOADING"
        elif entry.versions:
            state = "RESIDENT"
        else:
            state = "NOT_RESIDENT"
        return {
            "mode": "on_demand" if residence.on_demand else "resident",
            "state": state,
            "resident_bytes": residence.held_bytes,
            "measured_bytes": residence.measured_bytes,
        }


def _late(entry: ModelEntry, timeout_s: float) -> DeadlineExceeded:
    return DeadlineExceeded(
        f"request to model '{entry.source.name}' exceeded its deadline of {timeout_s * 1000:.0f} ms "
        "while the model loaded"
    )


def _too_large(name: str, version: int, size: int, budget: int) -> str:
    return (
        f"model '{name}' version {version} measured {describe_bytes(size)} at its load, more than the whole "
        f"memory budget of {describe_bytes(budget)} (server.memory_budget_bytes)"
    )


def _in_process() -> tuple[int, int]:
    return resident_bytes() or 0, allocated_bytes() or 0


def _files_bytes(directory: Path) -> int:
    """What a version's files hold on disk: the estimate of its size before its first load."""
    total = 0
    for root, _dirs, files in os.walk(directory):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def _retrieve(task: asyncio.Task[None]) -> None:
    """A load whose waiters all gave up (deadlines) still ends with its error read, not logged as lost."""
    if not task.cancelled():
        task.exception()
