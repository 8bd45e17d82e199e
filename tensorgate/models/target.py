"""One request's route, resolved once: the model it names and, when first needed, the version that serves it.

The protocols get a :class:`Target` from :meth:`InferenceService.resolve` before they read a body
(an unknown model or version is 404 at once), then use that one target for everything after:
decoding against its specs (:meth:`Target.servable`), running it (:meth:`Target.infer`), streaming
text from it (:meth:`Target.generator`). The version is picked once, so a request decoded against
one version of a traffic split never runs on another, and every way in (V2, V1, gRPC, generation)
meets the same traffic split, canary and shadow.

An on-demand model that is not loaded is loaded on the first need: within the request's deadline
for :meth:`Target.infer`, within the model's default timeout for a protocol that needs the specs
before decoding (V1 rows) or a generation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from tensorgate.clock import Clock
from tensorgate.errors import InvalidInput, TensorgateError
from tensorgate.generation import GenerationStream, SamplingParams
from tensorgate.models import router
from tensorgate.models.entry import ModelEntry
from tensorgate.models.servable import Servable, TextGenerator
from tensorgate.models.traffic import TrafficState
from tensorgate.types import InferRequest, InferResponse

if TYPE_CHECKING:
    from tensorgate.models.memory_budget import MemoryBudget

# isinstance() against a runtime-checkable Protocol looks up each of its members on every call; a
# servable's class does not change, so the answer is kept per class.
_GENERATES: dict[type, bool] = {}


def generates_text(servable: object) -> bool:
    kind = type(servable)
    known = _GENERATES.get(kind)
    if known is None:
        known = _GENERATES[kind] = isinstance(servable, TextGenerator)
    return known


class Target:
    __slots__ = ("_chosen", "_clock", "_entry", "_key", "_memory", "name", "version")

    def __init__(
        self, entry: ModelEntry, name: str, version: int | None, key: str | None, memory: MemoryBudget, clock: Clock
    ) -> None:
        self._entry = entry
        self.name = name
        self.version = version  # as the request named it (None: the server's choice)
        self._key = key  # the sticky key, for a model with a traffic split
        self._memory = memory
        self._clock = clock
        self._chosen: Servable | None = None

    def _pick(self) -> Servable:
        chosen = self._chosen
        if chosen is None:
            chosen = self._chosen = router.route(self._entry, self.name, self.version, self._key)
        return chosen

    async def servable(self) -> Servable:
        """The version that serves this request (loading an on-demand model first): picked once."""
        if self._chosen is None and self._needs_load():
            await self._memory.ensure_loaded(self._entry, None)
        return self._pick()

    def _needs_load(self) -> bool:
        entry = self._entry
        # A problem: its configuration is broken, or the repository API unloaded it.
        return entry.residence.on_demand and not entry.versions and not entry.problem

    async def infer(self, request: InferRequest) -> InferResponse:
        """Run the request on the target's version; the rollout sees how it ended and the shadow may
        get a copy of it."""
        residence = self._entry.residence
        if not residence.on_demand:
            return await self._run(self._pick(), request)
        # Counted as using the model throughout, so the memory budget never evicts it from under
        # its request, and the request's end is the model's last use.
        residence.active += 1
        residence.last_used = self._clock.now()
        try:
            if self._chosen is None and self._needs_load():
                remaining = await self._memory.ensure_loaded(self._entry, request.timeout_s)
                if remaining is not None:  # the deadline covers the wait for the load
                    request = request.with_timeout(remaining)
            return await self._run(self._pick(), request)
        finally:
            residence.active -= 1
            residence.last_used = self._clock.now()

    async def _run(self, servable: Servable, request: InferRequest) -> InferResponse:
        sequences = self._entry.sequences
        if sequences is not None and not request.parameters.get("sequence_start"):
            # A request that continues a sequence runs where the sequence began, on a version a
            # hot reload has retired too: only new sequences start on the newest.
            sequence_id = request.parameters.get("sequence_id")
            sequence = sequences.get(sequence_id) if isinstance(sequence_id, (int, str)) else None
            if sequence is not None:
                servable = sequence.servable
        traffic = self._entry.traffic
        if traffic is None:
            return await servable.infer(request)
        started = self._clock.now()
        try:
            response = await servable.infer(request)
        except TensorgateError as exc:
            traffic.observe(servable.version, self._clock.now() - started, exc.http_status >= 500)
            raise
        traffic.observe(servable.version, self._clock.now() - started, False)
        shadow = traffic.shadow
        if shadow is not None and servable.version != shadow.version:
            shadow.offer(request, response, self._entry.versions.get(shadow.version))
        return response

    async def generator(self) -> TextGenerator:
        """The target's version as a text generator (400 for a model that does not generate text);
        with a traffic split, each generation's end is observed as a request's would be."""
        servable = await self.servable()
        if not generates_text(servable):
            raise InvalidInput(f"model '{self.name}' does not generate text")
        generator = cast(TextGenerator, servable)
        traffic = self._entry.traffic
        return generator if traffic is None else _Observed(generator, traffic, self._clock)

    def count_failure(self, error: TensorgateError) -> None:
        """Count a request that failed before it could run (an undecodable body), against the
        version it would have run on, when one is loaded."""
        chosen = self._chosen
        if chosen is None and self._entry.versions:
            try:
                chosen = router.loaded(self._entry, self.name, self.version)
            except TensorgateError:
                return
        if chosen is not None:
            chosen.count_failure(error)


class _Observed:
    """A generator whose generations the model's traffic state observes as they end (a canary is
    judged by generations as by tensor requests)."""

    def __init__(self, generator: TextGenerator, traffic: TrafficState, clock: Clock) -> None:
        self._generator = generator
        self._traffic = traffic
        self._clock = clock
        self.name = generator.name
        self.version = generator.version
        self.max_model_len = generator.max_model_len

    def encode(self, text: str) -> list[int]:
        return self._generator.encode(text)

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        return self._generator.chat_prompt(messages)

    def token_text(self, token_id: int) -> str:
        return self._generator.token_text(token_id)

    def submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        priority: int | None = None,
        timeout_s: float | None = None,
        incremental: bool = True,
    ) -> GenerationStream:
        started = self._clock.now()
        try:
            stream = self._generator.submit(
                prompt_ids, params, priority=priority, timeout_s=timeout_s, incremental=incremental
            )
        except TensorgateError as exc:
            self._traffic.observe(self.version, self._clock.now() - started, exc.http_status >= 500)
            raise

        def ended(failed: bool) -> None:
            self._traffic.observe(self.version, self._clock.now() - started, failed)

        stream.on_end = ended
        return stream
