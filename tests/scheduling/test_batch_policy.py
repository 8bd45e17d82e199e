"""Batch formation, with a manual clock and a simulated pool (no asyncio, no sleeps)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgate.clock import ManualClock
from tensorgate.scheduling.batch_policy import BatchSettings, ReleaseReason, decide
from tensorgate.scheduling.pending import Pending
from tensorgate.scheduling.request_queue import RequestQueue
from tensorgate.types import InferRequest

BATCHING = BatchSettings(max_rows=8, batching=True, max_queue_delay_s=0.005, preferred_rows=(4,))


def item(
    clock: ManualClock,
    rows: int = 1,
    priority: int = 1,
    deadline: float | None = None,
    key: tuple[tuple[int, ...], ...] = ((4,),),
) -> Pending:
    return Pending(InferRequest(model="m", inputs={}), rows, key, priority, clock.now(), deadline)


def queue_of(*items: Pending, levels: int = 2) -> RequestQueue:
    queue = RequestQueue(levels, 100)
    for p in items:
        queue.admit(p)
    return queue


def test_lone_request_on_an_idle_pool_goes_at_once() -> None:
    clock = ManualClock()
    queue = queue_of(item(clock))
    decision = decide(queue, BATCHING, clock.now(), idle=1, busy=0)
    assert decision.batch is not None and decision.reason is ReleaseReason.IDLE


def test_requests_wait_for_the_window_while_an_instance_is_busy() -> None:
    clock = ManualClock()
    queue = queue_of(item(clock), item(clock))
    decision = decide(queue, BATCHING, clock.now(), idle=1, busy=1)
    assert decision.batch is None and decision.wake_at == clock.now() + 0.005
    clock.advance(0.005)
    decision = decide(queue, BATCHING, clock.now(), idle=1, busy=1)
    assert decision.reason is ReleaseReason.DELAY and decision.batch is not None and len(decision.batch) == 2


def test_no_window_while_holding_is_measured_not_to_pay() -> None:
    clock = ManualClock()
    queue = queue_of(item(clock), item(clock))
    decision = decide(queue, BATCHING, clock.now(), idle=1, busy=1, hold_below_rows=0.2)
    assert decision.reason is ReleaseReason.NO_GAIN and decision.batch is not None and len(decision.batch) == 2
    # A full batch or an idle pool keeps its own reason.
    assert decide(queue, BATCHING, clock.now(), idle=1, busy=0, hold_below_rows=0.2).reason is ReleaseReason.IDLE
    assert decide(queue, BATCHING, clock.now(), idle=0, busy=2, hold_below_rows=0.2).batch is None


def test_the_window_holds_a_batch_only_until_it_has_the_rows_that_pay() -> None:
    clock = ManualClock()
    queue = queue_of(item(clock, rows=2))
    held = decide(queue, BATCHING, clock.now(), idle=1, busy=1, hold_below_rows=3.5)
    assert held.batch is None and held.wake_at == clock.now() + 0.005
    queue.admit(item(clock, rows=2))  # 4 rows now: more than arrive during one fixed cost
    released = decide(queue, BATCHING, clock.now(), idle=1, busy=1, hold_below_rows=3.5)
    assert released.reason is ReleaseReason.NO_GAIN and released.batch is not None and len(released.batch) == 2


def test_window_is_timed_from_the_oldest_arrival() -> None:
    clock = ManualClock()
    first = item(clock)
    clock.advance(0.004)
    queue = queue_of(first, item(clock))
    decision = decide(queue, BATCHING, clock.now(), idle=1, busy=1)
    assert decision.wake_at == first.arrival + 0.005


def test_full_and_preferred_and_deadline_releases() -> None:
    clock = ManualClock()
    assert decide(queue_of(item(clock, rows=8)), BATCHING, clock.now(), 1, 1).reason is ReleaseReason.FULL
    assert decide(queue_of(*[item(clock) for _ in range(4)]), BATCHING, clock.now(), 1, 1).reason is (
        ReleaseReason.PREFERRED
    )
    soon = item(clock, deadline=clock.now() + 0.001)
    assert decide(queue_of(soon), BATCHING, clock.now(), 1, 1).reason is ReleaseReason.DEADLINE


def test_a_request_that_would_pass_the_max_ends_the_batch_as_full() -> None:
    clock = ManualClock()
    queue = queue_of(item(clock, rows=5), item(clock, rows=4))
    decision = decide(queue, BATCHING, clock.now(), 1, 1)
    assert decision.reason is ReleaseReason.FULL and decision.batch is not None and len(decision.batch) == 1


PREFERRED = BatchSettings(max_rows=16, batching=True, max_queue_delay_s=0.005, preferred_rows=(4, 8))


def _release(rows: list[int], settings: BatchSettings = PREFERRED) -> tuple[ReleaseReason | None, list[int]]:
    clock = ManualClock()
    decision = decide(queue_of(*[item(clock, rows=r) for r in rows]), settings, clock.now(), idle=1, busy=1)
    return decision.reason, [p.rows for p in decision.batch or []]


def test_a_batch_is_cut_at_the_largest_preferred_size_the_queue_makes() -> None:
    assert _release([1, 1, 1]) == (None, [])  # no preferred size yet: wait for the window
    assert _release([1, 1, 1, 1]) == (ReleaseReason.PREFERRED, [1, 1, 1, 1])
    assert _release([1, 1, 1, 1, 1, 1]) == (ReleaseReason.PREFERRED, [1, 1, 1, 1])  # 8 is not there: 4 goes
    assert _release([2, 2, 2, 2, 2]) == (ReleaseReason.PREFERRED, [2, 2, 2, 2])  # 8 of the 10 rows
    assert _release([3, 3, 3]) == (None, [])  # 3, 6, 9: no preferred size reached exactly
    assert _release([3, 1, 5]) == (ReleaseReason.PREFERRED, [3, 1])
    assert _release([16]) == (ReleaseReason.FULL, [16])


def test_only_matching_shapes_share_a_batch() -> None:
    clock = ManualClock()
    queue = queue_of(item(clock, key=((4,),)), item(clock, key=((5,),)), item(clock, key=((4,),)))
    decision = decide(queue, BATCHING, clock.now(), 1, 1)
    # The request of another shape blocks the batch (FIFO: the third request may not overtake it).
    assert decision.batch is not None and len(decision.batch) == 1 and decision.reason is ReleaseReason.SHAPE


def test_nothing_is_released_without_an_idle_instance() -> None:
    clock = ManualClock()
    queue = queue_of(item(clock, rows=8), item(clock, deadline=clock.now() + 1))
    decision = decide(queue, BATCHING, clock.now(), idle=0, busy=2)
    assert decision.batch is None and decision.wake_at == clock.now() + 1


@dataclass
class Simulation:
    clock: ManualClock = field(default_factory=ManualClock)
    queue: RequestQueue = field(default_factory=lambda: RequestQueue(3, 64))
    busy: list[float] = field(default_factory=list)  # completion times of running batches
    ended: dict[int, str] = field(default_factory=dict)
    dispatch_order: list[Pending] = field(default_factory=list)

    def end(self, p: Pending, how: str) -> None:
        assert id(p) not in self.ended, f"request ended twice: {self.ended[id(p)]}, then {how}"
        self.ended[id(p)] = how

    def step(self, config: BatchSettings, instances: int, pays: bool) -> None:
        """What the scheduler's pump does: expire, then dispatch every batch the policy releases."""
        now = self.clock.now()
        self.busy = [t for t in self.busy if t > now]
        for p in self.queue.expire(now):
            self.end(p, "expired")
        while True:
            waiting = list(self.queue.in_order())
            decision = decide(self.queue, config, now, instances - len(self.busy), len(self.busy), pays)
            if decision.batch is None:
                assert decision.wake_at is None or decision.wake_at > now  # never a timer for the past
                return
            batch = decision.batch
            assert batch, "a release carries at least one request"
            assert sum(p.rows for p in batch) <= config.max_rows or len(batch) == 1
            assert batch == waiting[: len(batch)]  # a prefix: priority first, FIFO within a level
            assert len({p.shape_key for p in batch}) == 1  # only matching shapes share a batch
            for p in batch:
                assert p.deadline is None or p.deadline > now  # no expired request is dispatched
                self.end(p, "dispatched")
            self.queue.take(batch)
            self.dispatch_order.extend(batch)
            self.busy.append(now + 0.003)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["arrive", "arrive", "tick", "cancel"]),
            st.integers(1, 3),  # priority
            st.integers(1, 4),  # rows
            st.one_of(st.none(), st.floats(0.0, 0.02)),  # relative deadline
            st.floats(0.0, 0.01),  # time step
            st.sampled_from([((4,),), ((4,),), ((5,),)]),  # non-batch shape
        ),
        max_size=60,
    ),
    st.integers(1, 3),
    st.booleans(),
    st.sampled_from([(), (4,), (2, 4)]),
)
def test_properties_under_random_traffic(
    events: list[tuple[str, int, int, float | None, float, tuple[tuple[int, ...], ...]]],
    instances: int,
    pays: bool,
    preferred: tuple[int, ...],
) -> None:
    sim = Simulation()
    config = BatchSettings(max_rows=6, batching=True, max_queue_delay_s=0.004, preferred_rows=preferred)
    admitted: list[Pending] = []
    for kind, priority, rows, deadline, step, key in events:
        if kind == "arrive":
            now = sim.clock.now()
            p = Pending(
                InferRequest(model="m", inputs={}),
                rows,
                key,
                priority,
                now,
                None if deadline is None else now + deadline,
            )
            sim.queue.admit(p)
            admitted.append(p)
        elif kind == "cancel":
            queued = list(sim.queue.in_order())
            if queued:
                gone = queued[rows % len(queued)]
                assert sim.queue.remove(gone)
                sim.end(gone, "cancelled")
        else:
            sim.clock.advance(step)
        sim.step(config, instances, pays)
    # Drain: time passes until everything has ended exactly once.
    for _ in range(1000):
        if len(sim.queue) == 0:
            break
        sim.clock.advance(0.001)
        sim.step(config, instances, pays)
    assert len(sim.queue) == 0
    assert set(sim.ended) == {id(p) for p in admitted}
    # Within a level, dispatch follows admission order (arrival times can tie; the order cannot).
    order = {id(p): index for index, p in enumerate(admitted)}
    for level in (1, 2, 3):
        dispatched = [order[id(p)] for p in sim.dispatch_order if p.priority == level]
        assert dispatched == sorted(dispatched)
