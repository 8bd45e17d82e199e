"""The order within a priority level: weighted fair between tenants (start-time fair queuing), or
earliest deadline first; per-tenant bounds; and the rows ahead that deadline admission counts."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgate.errors import QueueFull
from tensorgate.scheduling.pending import Pending
from tensorgate.scheduling.request_queue import RequestQueue
from tensorgate.types import InferRequest, Tenant

TENANTS = {name: Tenant(name) for name in "abcd"}


def pending(tenant: Tenant, arrival: float, rows: int = 1, deadline: float | None = None) -> Pending:
    return Pending(
        request=InferRequest(model="m", inputs={}, id=f"{tenant.name}{arrival}", tenant=tenant),
        rows=rows,
        shape_key=(),
        priority=1,
        arrival=arrival,
        deadline=deadline,
    )


def drain(queue: RequestQueue, count: int | None = None) -> list[Pending]:
    """Dispatch one request at a time from the head, as a batch of one leaves."""
    out: list[Pending] = []
    while len(queue) and (count is None or len(out) < count):
        head = next(queue.in_order())
        queue.take([head])
        out.append(head)
    return out


# An arrival sequence: (tenant, rows) pairs, interleaved with dispatches (None).
events = st.lists(st.one_of(st.none(), st.tuples(st.sampled_from("abcd"), st.integers(1, 4))), max_size=80)


@settings(max_examples=200)
@given(events)
def test_every_request_leaves_once_and_each_tenant_in_its_own_arrival_order(
    script: list[tuple[str, int] | None],
) -> None:
    queue = RequestQueue(priority_levels=1, max_size=1000)
    admitted: list[Pending] = []
    left: list[Pending] = []
    for step, event in enumerate(script):
        if event is None:
            left.extend(drain(queue, 1))
        else:
            item = pending(TENANTS[event[0]], float(step), event[1])
            queue.admit(item)
            admitted.append(item)
    left.extend(drain(queue))
    assert len(queue) == 0
    assert sorted(map(id, left)) == sorted(map(id, admitted))  # conservation
    for name in "abcd":
        mine = [p.arrival for p in left if p.request.tenant.name == name]
        assert mine == sorted(mine)  # FIFO within a tenant


@settings(max_examples=200)
@given(st.integers(1, 60), st.integers(1, 4), st.integers(1, 4))
def test_a_tenant_arriving_behind_a_burst_waits_one_turn_not_the_burst(burst: int, rows: int, late_rows: int) -> None:
    queue = RequestQueue(priority_levels=1, max_size=1000)
    for index in range(burst):
        queue.admit(pending(TENANTS["a"], float(index), rows))
    late = pending(TENANTS["b"], float(burst), late_rows)
    queue.admit(late)
    order = drain(queue)
    # Ahead of it: at most the flooder's request in service when it came, and one more turn.
    assert order.index(late) <= 1


@settings(max_examples=100)
@given(st.integers(1, 5), st.integers(1, 5), st.integers(10, 60))
def test_backlogged_tenants_are_served_in_proportion_to_their_weights(wa: int, wb: int, turns: int) -> None:
    a, b = Tenant("a", float(wa)), Tenant("b", float(wb))
    queue = RequestQueue(priority_levels=1, max_size=10_000)
    for index in range(200):
        queue.admit(pending(a, float(index)))
        queue.admit(pending(b, float(index)))
    served = Counter(p.request.tenant.name for p in drain(queue, turns))
    # Start-time fair queuing: each tenant's service stays within one request (over its weight)
    # of its share, so the counts differ from the proportion by at most a request or two.
    share_a = turns * wa / (wa + wb)
    assert abs(served["a"] - share_a) <= 2


def test_an_idle_tenant_saves_up_no_credit() -> None:
    queue = RequestQueue(priority_levels=1, max_size=100)
    for index in range(10):  # b is alone for a while: it is served, and gains nothing over a newcomer
        queue.admit(pending(TENANTS["b"], float(index)))
    drain(queue, 10)
    for index in range(10):
        queue.admit(pending(TENANTS["a"], 10.0 + index))
        queue.admit(pending(TENANTS["b"], 10.5 + index))
    first = [p.request.tenant.name for p in drain(queue, 10)]
    assert first.count("a") == first.count("b") == 5


def test_a_tenant_over_its_max_queued_is_refused_alone() -> None:
    bounded = Tenant("noisy", max_queued=2)
    queue = RequestQueue(priority_levels=1, max_size=100)
    queue.admit(pending(bounded, 0.0))
    queue.admit(pending(bounded, 1.0))
    with pytest.raises(QueueFull, match="tenant 'noisy' has 2 requests waiting") as refused:
        queue.admit(pending(bounded, 2.0))
    assert refused.value.http_status == 503 and refused.value.retry_after_s is not None
    queue.admit(pending(TENANTS["a"], 3.0))  # others still get in
    drain(queue, 1)
    queue.admit(pending(bounded, 4.0))  # and so does it again, once one of its own has left


@settings(max_examples=200)
@given(st.lists(st.tuples(st.one_of(st.none(), st.floats(0, 100)), st.integers(1, 3)), max_size=40))
def test_deadline_order_dispatches_earliest_deadline_first(entries: list[tuple[float | None, int]]) -> None:
    queue = RequestQueue(priority_levels=1, max_size=1000, order="deadline")
    for index, (deadline, rows) in enumerate(entries):
        queue.admit(pending(TENANTS["abcd"[index % 4]], float(index), rows, deadline))
    deadlines = [math.inf if p.deadline is None else p.deadline for p in drain(queue)]
    assert deadlines == sorted(deadlines)


@settings(max_examples=200)
@given(
    st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 4), st.floats(0, 50)), max_size=30),
    st.sampled_from(["fifo", "deadline"]),
    st.sampled_from("abc"),
    st.floats(0, 50),
)
def test_rows_ahead_is_what_leaves_before_the_request(
    queued: list[tuple[str, int, float]], order: str, name: str, deadline: float
) -> None:
    queue = RequestQueue(priority_levels=1, max_size=1000, order=order)
    for index, (tenant, rows, due) in enumerate(queued):
        queue.admit(pending(TENANTS[tenant], float(index), rows, due))
    expected = queue.rows_ahead(1, TENANTS[name], deadline)
    item = pending(TENANTS[name], 1000.0, 1, deadline)
    queue.admit(item)
    order_out = drain(queue)
    assert sum(p.rows for p in order_out[: order_out.index(item)]) == expected


def test_expiry_keeps_the_fair_order_of_the_rest() -> None:
    queue = RequestQueue(priority_levels=1, max_size=100)
    queue.admit(pending(TENANTS["a"], 0.0, deadline=5.0))
    queue.admit(pending(TENANTS["a"], 1.0))
    queue.admit(pending(TENANTS["b"], 2.0, deadline=50.0))
    expired = queue.expire(10.0)
    assert [p.arrival for p in expired] == [0.0]
    assert queue.next_deadline == 50.0
    # a's expired request had taken a's first turn: b's turn comes before a's second.
    assert [p.arrival for p in drain(queue)] == [2.0, 1.0]


def test_a_full_queue_gives_a_newcomer_the_newest_place_of_the_tenant_holding_most() -> None:
    queue = RequestQueue(priority_levels=1, max_size=4)
    flood = [pending(TENANTS["a"], float(i)) for i in range(4)]
    for item in flood:
        assert queue.admit(item) is None
    steady = pending(TENANTS["b"], 10.0)
    assert queue.admit(steady) is flood[-1]  # a's newest place goes to b
    assert queue.admit(pending(TENANTS["b"], 11.0)) is flood[-2]
    with pytest.raises(QueueFull, match="queue is full"):  # two each: nobody holds more than its share
        queue.admit(pending(TENANTS["b"], 12.0))
    with pytest.raises(QueueFull, match="queue is full"):
        queue.admit(pending(TENANTS["a"], 13.0))
    assert len(queue) == 4 and [p.arrival for p in drain(queue)] == [0.0, 10.0, 1.0, 11.0]


@settings(max_examples=200)
@given(st.lists(st.sampled_from("abc"), max_size=60), st.integers(1, 10))
def test_a_full_queue_never_holds_more_than_its_bound_and_no_tenant_is_shut_out(
    arrivals: list[str], bound: int
) -> None:
    queue = RequestQueue(priority_levels=1, max_size=bound)
    for index, name in enumerate(arrivals):
        counts = Counter(p.request.tenant.name for p in queue.in_order())
        try:
            displaced = queue.admit(pending(TENANTS[name], float(index)))
        except QueueFull:
            # Refused only when no tenant holds more than one place more than it does.
            assert len(queue) == bound and max(counts.values()) <= counts[name] + 1
            continue
        if displaced is not None:
            assert counts[displaced.request.tenant.name] == max(counts.values()) > counts[name] + 1
        assert len(queue) <= bound


def test_a_tenant_whose_newest_request_expired_gets_its_turn_back() -> None:
    queue = RequestQueue(priority_levels=1, max_size=100)
    queue.admit(pending(TENANTS["a"], 0.0))
    queue.admit(pending(TENANTS["a"], 1.0, deadline=5.0))  # a's second turn, then expired
    assert [p.arrival for p in queue.expire(10.0)] == [1.0]
    for arrival in (2.0, 3.0, 4.0):
        queue.admit(pending(TENANTS["b"], arrival))
    queue.admit(pending(TENANTS["a"], 5.0))
    # a's new request takes the turn its expired one gave up: beside b's second, ahead of b's third.
    assert [p.arrival for p in drain(queue)] == [0.0, 2.0, 3.0, 5.0, 4.0]


# Requests (tenant, rows, expires?) and then arrivals after the expiry.
_expiry_scripts = st.tuples(
    st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 3), st.booleans()), max_size=20),
    st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 3)), max_size=10),
)


@settings(max_examples=200)
@given(_expiry_scripts, st.integers(0, 5))
def test_expiry_leaves_the_order_that_removing_the_expired_requests_one_by_one_leaves(
    script: tuple[list[tuple[str, int, bool]], list[tuple[str, int]]], dispatched: int
) -> None:
    """Expiry is a batch of removals: each tenant's next turn is where removing its expired
    requests newest first with ``remove`` (a client leaving) would put it."""
    before, after = script
    expiring, removing = RequestQueue(1, 1000), RequestQueue(1, 1000)
    doomed: list[Pending] = []
    for index, (name, rows, expires) in enumerate(before):
        deadline = 5.0 if expires else None
        expiring.admit(pending(TENANTS[name], float(index), rows, deadline))
        twin = pending(TENANTS[name], float(index), rows, deadline)
        removing.admit(twin)
        if expires:
            doomed.append(twin)
    assert [p.arrival for p in drain(expiring, dispatched)] == [p.arrival for p in drain(removing, dispatched)]
    expired = expiring.expire(10.0)
    gone = [p for p in reversed(doomed) if removing.remove(p)]
    assert sorted(p.arrival for p in expired) == sorted(p.arrival for p in gone)
    for offset, (name, rows) in enumerate(after):
        for queue in (expiring, removing):
            queue.admit(pending(TENANTS[name], 100.0 + offset, rows))
    assert [p.arrival for p in drain(expiring)] == [p.arrival for p in drain(removing)]
