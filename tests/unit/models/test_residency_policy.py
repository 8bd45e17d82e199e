"""The memory residency policy (models/residency.py): a plan never passes the budget, never picks a
busy or pinned model, evicts least recently used first and no more than it needs, and refuses a
model larger than the whole budget. Times come from a manual clock, as the driver's come from the
server's."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tensorgate.clock import ManualClock
from tensorgate.models.residency import Held, Refusal, describe_bytes, plan_room

MIB = 1 << 20

# One model: its size, the seconds before its last use (from the previous model's), busy, pinned.
_model = st.tuples(
    st.integers(min_value=0, max_value=64 * MIB),
    st.floats(min_value=0.0, max_value=100.0, allow_nan=False),
    st.booleans(),
    st.booleans(),
)


def _held(models: list[tuple[int, float, bool, bool]]) -> list[Held]:
    clock = ManualClock()
    held = []
    for index, (size, gap, busy, pinned) in enumerate(models):
        clock.advance(gap)
        held.append(Held(f"m{index:02d}", size, clock.now(), busy, pinned))
    return held


@given(
    st.lists(_model, max_size=20),
    st.integers(min_value=0, max_value=128 * MIB),
    st.integers(min_value=1, max_value=512 * MIB),
)
def test_a_plan_keeps_the_budget_and_takes_only_idle_on_demand_models_oldest_first(
    models: list[tuple[int, float, bool, bool]], need: int, budget: int
) -> None:
    held = _held(models)
    by_name = {h.name: h for h in held}
    used = sum(h.bytes for h in held)
    plan = plan_room(held, need, budget)
    assert plan.used_bytes == used
    if need > budget:
        assert plan.refusal is Refusal.TOO_LARGE and plan.evict == ()
        return
    candidates = [h for h in held if not h.busy and not h.pinned and h.bytes > 0]
    if not plan.fits:
        assert plan.refusal is Refusal.NO_ROOM and plan.evict == ()
        # Refused only when even every idle on-demand model out would not make room.
        assert used - sum(h.bytes for h in candidates) + need > budget
        return
    evicted = [by_name[name] for name in plan.evict]
    assert len(set(plan.evict)) == len(plan.evict)
    assert plan.freed_bytes == sum(h.bytes for h in evicted)
    assert used - plan.freed_bytes + need <= budget  # the budget is never passed
    assert all(not h.busy and not h.pinned for h in evicted)  # busy and pinned models are never chosen
    # Least recently used first: in order of last use, and none left idle that was used earlier.
    assert [h.last_used for h in evicted] == sorted(h.last_used for h in evicted)
    kept = [h for h in candidates if h.name not in plan.evict]
    if evicted:
        assert all(h.last_used >= evicted[-1].last_used for h in kept)
        # No more than it takes: without the last one it would not fit.
        assert used - (plan.freed_bytes - evicted[-1].bytes) + need > budget
    else:
        assert used + need <= budget


@given(st.lists(_model, max_size=12), st.integers(min_value=0, max_value=128 * MIB))
def test_without_a_budget_everything_fits_and_nothing_is_evicted(
    models: list[tuple[int, float, bool, bool]], need: int
) -> None:
    plan = plan_room(_held(models), need, None)
    assert plan.fits and plan.evict == ()


@given(st.lists(_model, max_size=12), st.integers(min_value=1, max_value=64 * MIB), st.integers(min_value=1))
def test_a_model_larger_than_the_whole_budget_is_refused_whatever_is_idle(
    models: list[tuple[int, float, bool, bool]], budget: int, over: int
) -> None:
    plan = plan_room(_held(models), budget + over, budget)
    assert plan.refusal is Refusal.TOO_LARGE and not plan.fits and plan.evict == ()


def test_the_model_used_longest_ago_goes_first_as_the_clock_moves() -> None:
    clock = ManualClock()
    last_used = {}
    for name in ("a", "b", "c"):
        last_used[name] = clock.now()
        clock.advance(1.0)
    last_used["a"] = clock.now()  # a is used again: b is now the least recently used

    def held(busy: frozenset[str] = frozenset()) -> list[Held]:
        return [Held(n, 10 * MIB, t, n in busy, False) for n, t in last_used.items()]

    assert plan_room(held(), 10 * MIB, 30 * MIB).evict == ("b",)
    assert plan_room(held(), 20 * MIB, 30 * MIB).evict == ("b", "c")
    assert plan_room(held(frozenset({"b"})), 10 * MIB, 30 * MIB).evict == ("c",)  # b is serving
    assert plan_room(held(frozenset({"a", "b", "c"})), 10 * MIB, 30 * MIB).refusal is Refusal.NO_ROOM
    pinned = [Held("p", 25 * MIB, 0.0, False, True), *held()]
    assert plan_room(pinned, 10 * MIB, 40 * MIB).evict == ("b", "c", "a")  # the pinned one stays


def test_sizes_read_in_mebibytes() -> None:
    assert describe_bytes(8 * MIB) == "8.0 MiB"
    assert describe_bytes(512) == "512 bytes"
