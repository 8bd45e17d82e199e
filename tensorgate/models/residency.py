"""Which loaded models to evict so that another fits the memory budget: a pure policy.

The driver (:mod:`tensorgate.models.memory_budget`) describes every model that holds memory now as
a :class:`Held` (its measured bytes, when it was last used by the injected clock, whether anything
is using it now, whether it is pinned) and asks :func:`plan_room` how to make room for ``need``
more bytes. The plan evicts idle on-demand models least recently used first, and only as many as
it takes; a model that is busy (a request waiting for it, queued or running, or a load or change
in progress) or pinned (``model_residency: resident``) is never chosen. No I/O, no clock of its own:
the property tests in ``tests/unit/models/test_residency_policy.py`` drive it with a manual clock.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

MIB = 1 << 20


class Refusal(enum.Enum):
    """Why a plan cannot make room."""

    TOO_LARGE = "too_large"  # the model alone needs more than the whole budget: it can never fit
    NO_ROOM = "no_room"  # what holds the rest is pinned or busy now: it may fit later


@dataclass(frozen=True, slots=True)
class Held:
    """A model holding memory now, as the policy sees it."""

    name: str
    bytes: int  # measured at its load (every loaded or draining version of it)
    last_used: float  # the clock's time of its last request, or of its load
    busy: bool  # a request waiting for it, queued or running, or a load or change of it in progress
    pinned: bool  # model_residency: resident (never evicted)


@dataclass(frozen=True, slots=True)
class Plan:
    """What to evict (in order) so that the need fits, or why it cannot fit."""

    evict: tuple[str, ...] = ()
    refusal: Refusal | None = None
    used_bytes: int = 0  # what every held model holds now, before the evictions
    freed_bytes: int = 0  # what the evictions free

    @property
    def fits(self) -> bool:
        return self.refusal is None


def plan_room(held: Iterable[Held], need: int, budget: int | None) -> Plan:
    """The idle on-demand models to evict, least recently used first, so that ``need`` more bytes
    fit within ``budget`` (None: no budget, everything fits).

    Refuses with TOO_LARGE when ``need`` alone passes the budget (nothing is evicted for a model
    that could never fit), and with NO_ROOM when evicting every idle on-demand model would still
    not free enough. Ties in ``last_used`` go by name, so a plan is the same for the same state.
    """
    models = list(held)
    used = sum(h.bytes for h in models)
    if budget is None:
        return Plan(used_bytes=used)
    if need > budget:
        return Plan(refusal=Refusal.TOO_LARGE, used_bytes=used)
    free = budget - used
    if need <= free:
        return Plan(used_bytes=used)
    # Evicting a model that holds nothing frees nothing: it is left alone.
    candidates = sorted(
        (h for h in models if not h.busy and not h.pinned and h.bytes > 0), key=lambda h: (h.last_used, h.name)
    )
    chosen: list[str] = []
    freed = 0
    for candidate in candidates:
        if free + freed >= need:
            break
        chosen.append(candidate.name)
        freed += candidate.bytes
    if free + freed < need:
        return Plan(refusal=Refusal.NO_ROOM, used_bytes=used)
    return Plan(evict=tuple(chosen), used_bytes=used, freed_bytes=freed)


def describe_bytes(count: int) -> str:
    """Sizes in messages: MiB with one decimal (``8.0 MiB``), bytes under one MiB."""
    return f"{count / MIB:.1f} MiB" if count >= MIB else f"{count} bytes"
