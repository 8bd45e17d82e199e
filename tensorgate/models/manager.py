"""ModelManager: load, warm up, mark ready, switch, drain and unload model versions.

States of a version: LOADING -> WARMING -> READY -> DRAINING -> UNLOADED, or FAILED with a reason.
Only READY versions take traffic. Every change to a model, at startup, from a repository poll or
from the repository API, goes through :meth:`ModelManager.apply`, one change per model at a time:

- a version to serve that is new, or whose files or configuration changed, is loaded and warmed
  beside what serves; it takes traffic only once READY, in one step on the event loop, and the copy
  it replaces drains (finishes everything admitted to it) and unloads in the background;
- versions no longer served drain and unload, but only once some version to serve is READY: a
  failed load never disturbs the version that is serving;
- a version that failed is tried again only when its files or configuration change (or when the
  repository API asks);
- a change that only touches ``traffic`` moves traffic without loading anything.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Coroutine
from typing import Any

from tensorgate.clock import Clock
from tensorgate.config.model_config import ModelConfig, VersionPolicy
from tensorgate.errors import ModelLoadError
from tensorgate.models.entry import LoadedFrom, ModelEntry
from tensorgate.models.memory_budget import MemoryBudget, NoRoom, Residence
from tensorgate.models.model_version import ModelVersion
from tensorgate.models.pipeline import StepRunner
from tensorgate.models.response_cache import ResponseCache, VersionCache
from tensorgate.models.rollout import RolloutState
from tensorgate.models.servable import Servable, VersionState, VersionStatus
from tensorgate.models.traffic_control import TrafficControl
from tensorgate.models.version_loader import build_version
from tensorgate.observability.metrics import Metrics
from tensorgate.observability.tracing import NOOP_TRACER, Tracer
from tensorgate.repository.source import ModelSource, VersionSource
from tensorgate.repository.version_policy import served_versions
from tensorgate.scheduling.sequences import Sequence, SequenceTable

log = logging.getLogger(__name__)


def _load_config(config: ModelConfig) -> ModelConfig:
    """The configuration without what changes no loaded version (traffic, which versions to serve)."""
    return config.model_copy(update={"traffic": None, "version_policy": VersionPolicy()})


class ModelManager:
    def __init__(
        self,
        clock: Clock,
        metrics: Metrics,
        *,
        drain_timeout_s: float = 30.0,
        rng: random.Random | None = None,
        memory_budget_bytes: int | None = None,
        default_residency: str = "resident",
    ) -> None:
        self.tracer: Tracer = NOOP_TRACER  # the server sets its tracer here before load_all
        self.clock = clock
        self._metrics = metrics
        self._drain_timeout_s = drain_timeout_s
        rng = rng if rng is not None else random.Random()
        self._traffic = TrafficControl(clock, metrics, rng, self._rollout_ended)
        self.models: dict[str, ModelEntry] = {}
        # True until the startup scan has named every model: the listeners are up before it, and a
        # model not named yet is not unknown (503, retried elsewhere by a balancer, rather than 404).
        self.starting = True
        self._background: set[asyncio.Task[None]] = set()  # drains, and re-applies after a rollout's end
        self._closed = False
        # The server's response cache (server.response_cache_bytes); None: no model may use one.
        self.response_cache: ResponseCache | None = None
        # How a pipeline reaches its steps: the service's routing, set when the service is built.
        self.run_step: StepRunner | None = None
        # Loads on-demand models on their first request; every measured load makes room through it.
        self.memory = MemoryBudget(
            clock,
            metrics,
            memory_budget_bytes,
            default_residency,
            models=self.models,
            load=self._load_on_demand,
            retire=self._evict,
            spawn=self._spawn,
        )

    async def load_all(self, sources: list[ModelSource]) -> None:
        """Startup: every model found counts for readiness; models load side by side."""
        for source in sources:
            entry = self.models[source.name] = ModelEntry(source)
            if self.memory.on_demand(source):  # known, loaded by its first request: not counted for readiness
                entry.residence = Residence(on_demand=True, wanted=False)
                entry.wanted = False
        self.starting = False
        await asyncio.gather(*(self._apply_quietly(self.models[s.name], s) for s in sources))

    async def _apply_quietly(self, entry: ModelEntry, source: ModelSource) -> None:
        try:
            await self._apply(entry, source, retry_failed=True)
        except ModelLoadError:
            pass  # logged and recorded on the entry: this model fails alone

    async def apply(self, source: ModelSource, *, retry_failed: bool = False) -> None:
        """Bring one model in line with ``source`` (new, changed, or the same). Returns when what is
        to serve is READY; raises ModelLoadError naming what could not be loaded (what served
        before keeps serving)."""
        entry = self.models.get(source.name)
        if entry is None:
            entry = self.models[source.name] = ModelEntry(source, wanted=False)
            on_demand = self.memory.on_demand(source)
            entry.residence = Residence(on_demand=on_demand, wanted=not on_demand)
        if retry_failed:  # the repository API's load: an on-demand model loads now too (and may be evicted)
            entry.residence.wanted = True
        await self._apply(entry, source, retry_failed=retry_failed)

    async def _apply(self, entry: ModelEntry, source: ModelSource, *, retry_failed: bool) -> None:
        async with entry.lock:
            name = source.name
            if source.problems:
                message = "; ".join(source.problems)
                entry.problem = message
                if entry.versions:
                    self._metrics.config_errors.labels(name).inc()
                    log.error("model %s: the change is not applied; what serves keeps serving: %s", name, message)
                else:
                    entry.source = source
                    log.error("model %s cannot be loaded: %s", name, message)
                raise ModelLoadError(message)
            residence = entry.residence
            on_demand = self.memory.on_demand(source)
            if on_demand != residence.on_demand:  # the configuration changed the model's residency
                residence.on_demand = on_demand
                residence.wanted = not on_demand or bool(entry.versions)
            if not residence.wanted:  # on demand and not loaded: its first request loads it
                entry.source = source
                entry.problem = ""
                return
            reload_all = bool(entry.versions) and (
                source.backend != entry.source.backend
                or _load_config(source.config) != _load_config(entry.source.config)
            )
            if not reload_all:  # weights and the like take effect at once, before anything loads
                entry.source = source
                self._traffic.configure(entry)
            served = self._served(entry, source)
            failures = []
            for vsource in served:
                identity = (vsource.revision, _load_config(source.config))
                if vsource.version in entry.versions and entry.loaded.get(vsource.version) == identity:
                    continue
                if not retry_failed and entry.failed.get(vsource.version) == identity:
                    failures.append(entry.statuses[vsource.version].reason)
                    continue
                error = await self._load_and_switch(entry, source, vsource, identity)
                if error:
                    failures.append(error)
            if reload_all and not failures:  # else the copies with the old configuration serve on: it stays
                entry.source = source
                self._traffic.configure(entry)
            entry.problem = ""
            wanted = {v.version for v in served}
            if any(mv.ready for v, mv in entry.versions.items() if v in wanted):
                for version in sorted(set(entry.versions) - wanted):
                    self._retire(entry, version)
            for version in [v for v, s in entry.statuses.items() if v not in wanted and v not in entry.versions]:
                if entry.statuses[version].state is VersionState.FAILED:  # no longer asked for: forgotten
                    del entry.statuses[version]
                    entry.failed.pop(version, None)
            self._traffic.check_rollout(entry)
            if failures:
                raise ModelLoadError("; ".join(failures))
            if not any(mv.ready for mv in entry.versions.values()):
                raise ModelLoadError(f"model '{name}' has no version ready to serve")

    def _served(self, entry: ModelEntry, source: ModelSource) -> list[VersionSource]:
        """The versions to serve now: the policy's and traffic's, less a promoted canary's old version."""
        pool = source.on_disk or source.versions
        rollout = entry.traffic.rollout if entry.traffic is not None else None
        promoted = rollout is not None and rollout.state is RolloutState.PROMOTED
        numbers = set(served_versions(source.config, [v.version for v in pool], keep_stable=not promoted))
        return [v for v in pool if v.version in numbers]

    async def _load_and_switch(
        self, entry: ModelEntry, source: ModelSource, vsource: VersionSource, identity: LoadedFrom
    ) -> str:
        """Load one version beside what serves, then put it in service. Returns "" or why it failed."""
        name, number = source.name, vsource.version
        replacing = entry.versions.get(number)
        status = VersionStatus(name, number, VersionState.LOADING)
        if replacing is None:  # a reload keeps showing the serving copy's state until the switch
            entry.statuses[number] = status
        generation = entry.generations.get(number, 0)
        entry.generations[number] = generation + 1
        try:
            version = await self.memory.admit(
                entry,
                vsource,
                lambda: build_version(
                    source, vsource, status, self.clock, self._metrics, self.tracer, generation, self.run_step
                ),
            )
        except ModelLoadError as exc:
            if not isinstance(exc, NoRoom):  # no room now is tried again; a failure waits for a change
                entry.failed[number] = identity
            self._metrics.load_failures.labels(name, str(number)).inc()
            if replacing is None:
                status.state, status.reason = VersionState.FAILED, str(exc)
                log.error("model %s version %d failed to load: %s", name, number, exc)
            else:
                log.error("model %s version %d failed to reload (the loaded copy keeps serving): %s", name, number, exc)
            return str(exc)
        if self._closed:  # the server stopped while this loaded: it never serves
            await version.aclose(0.0)
            self.memory.release(entry, version)
            return "the server is shutting down"
        entry.failed.pop(number, None)
        if isinstance(version, ModelVersion) and version.sequencing is not None:
            if entry.sequences is None:
                entry.sequences = SequenceTable(name, self.clock, _sequence_ended)
            entry.sequences.idle_after(_idle_s)
            version.attach_sequences(entry.sequences)
        if source.config.response_cache.enable:
            self._attach_cache(version)
        version.state = status.state = VersionState.READY
        entry.versions[number] = version
        entry.statuses[number] = status
        entry.loaded[number] = identity
        entry.wanted = True
        version.serve()
        self._metrics.model_ready.labels(name, str(number)).set(1)
        log.info("model %s version %d is READY", name, number)
        if replacing is not None:
            self._drain(entry, replacing, None)
        return ""

    def _retire(self, entry: ModelEntry, number: int) -> asyncio.Task[None]:
        """Take a version out of service: it takes no new request, finishes what it has, and unloads."""
        version = entry.versions.pop(number)
        entry.loaded.pop(number, None)
        status = entry.statuses.get(number)
        if status is not None:
            status.state = VersionState.DRAINING
        log.info("model %s version %d is draining", version.name, number)
        return self._drain(entry, version, status)

    def _evict(self, entry: ModelEntry) -> list[asyncio.Task[None]]:
        """The memory budget's eviction of an idle on-demand model: every version out of service in
        this step, through the same drain as any retired version. Returns the drains."""
        entry.wanted = False
        return [self._retire(entry, number) for number in sorted(entry.versions)]

    async def _load_on_demand(self, entry: ModelEntry) -> None:
        """The memory budget's load of an on-demand model (its ``residence.wanted`` is set): the
        versions to serve, loaded as at startup; a version that failed waits for its files to change."""
        await self._apply(entry, entry.source, retry_failed=False)

    def _attach_cache(self, version: Servable) -> None:
        if self.response_cache is None or self.response_cache.capacity_bytes == 0:
            log.warning(
                "model %s enables response_cache, but server.response_cache_bytes is 0: no answer is cached",
                version.name,
            )
            return
        lookups = self._metrics.response_cache
        hit = lookups.labels(version.name, str(version.version), "hit")
        miss = lookups.labels(version.name, str(version.version), "miss")
        version.cache = VersionCache(self.response_cache, self.clock, lambda found: (hit if found else miss).inc())

    def _drain(self, entry: ModelEntry, version: Servable, status: VersionStatus | None) -> asyncio.Task[None]:
        version.state = VersionState.DRAINING  # not ready: a request that still holds it is refused

        async def drain() -> None:
            try:
                await version.aclose(self._drain_timeout_s)
            except Exception:
                log.exception("model %s version %d failed to unload", version.name, version.version)
            self.memory.release(entry, version)
            serving = entry.versions.get(version.version)
            self._metrics.model_ready.labels(version.name, str(version.version)).set(
                1 if serving is not None and serving.ready else 0
            )
            if status is not None and entry.statuses.get(version.version) is status:
                status.state = VersionState.UNLOADED
                del entry.statuses[version.version]
            log.info("model %s version %d is unloaded", version.name, version.version)

        return self._spawn(drain())

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def unload(self, name: str, *, forget: bool = False) -> None:
        """Drain and unload every version of a model; returns once they are unloaded. ``forget``: the
        model left the repository, so it is forgotten (404 from then on) rather than kept as unloaded."""
        entry = self.models.get(name)
        if entry is None:
            return
        async with entry.lock:
            entry.wanted = False
            if entry.residence.on_demand:  # not loaded again by a request (problem: "unloaded")
                entry.residence.wanted = False
            drains = [self._retire(entry, number) for number in sorted(entry.versions)]
            if entry.traffic is not None and entry.traffic.shadow is not None:
                await entry.traffic.shadow.aclose()
            entry.traffic = None
            self._traffic.publish(entry)
            entry.problem = "unloaded"
            if drains:
                await asyncio.gather(*drains)
            entry.statuses.clear()
            entry.failed.clear()
            if forget and self.models.get(name) is entry:
                del self.models[name]
        log.info("model %s is unloaded", name)

    def _rollout_ended(self, entry: ModelEntry) -> None:
        """Promoted or rolled back: the old version goes as the version policy says. Re-applied as
        its own task: this runs inside a request's completion."""
        if not self._closed:
            self._spawn(self._apply_quietly(entry, entry.source))

    # -- readiness and shutdown ------------------------------------------------------------------

    def all_ready(self) -> bool:
        """Every model that should serve has at least one READY version with a healthy instance."""
        return all(entry.latest_ready() is not None for entry in self.models.values() if entry.wanted)

    async def aclose(self, drain_timeout_s: float) -> None:
        self._closed = True
        deadline = self.clock.now() + drain_timeout_s
        versions = [v for entry in self.models.values() for v in entry.versions.values()]
        shadows = [e.traffic.shadow for e in self.models.values() if e.traffic is not None and e.traffic.shadow]
        await asyncio.gather(*(s.aclose() for s in shadows))
        await asyncio.gather(*(v.aclose(drain_timeout_s) for v in versions))
        if self._background:  # drains of replaced versions, bounded by what is left of the timeout
            await asyncio.wait(set(self._background), timeout=max(0.0, deadline - self.clock.now()))


def _sequence_ended(sequence: Sequence, reason: str) -> None:
    sequence.servable.metrics.sequence_ended(reason)


def _idle_s(sequence: Sequence) -> float:
    """How long a sequence may stay idle: its version's ``max_sequence_idle_microseconds``."""
    settings = getattr(sequence.servable, "sequencing", None)
    return float("inf") if settings is None else float(settings.idle_s)
