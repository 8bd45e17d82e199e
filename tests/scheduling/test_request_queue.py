"""The pure request queue: bounded admission, priorities, FIFO, deadline expiry."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensorgate.errors import QueueFull
from tensorgate.scheduling.pending import Pending
from tensorgate.scheduling.request_queue import RequestQueue
from tensorgate.types import InferRequest


def pending(priority: int = 1, arrival: float = 0.0, deadline: float | None = None, tag: int = 0) -> Pending:
    return Pending(
        request=InferRequest(model="m", inputs={}, id=str(tag)),
        rows=1,
        shape_key=(),
        priority=priority,
        arrival=arrival,
        deadline=deadline,
    )


def test_full_queue_rejects_at_once_with_retry_after() -> None:
    queue = RequestQueue(priority_levels=1, max_size=2)
    queue.admit(pending())
    queue.admit(pending())
    with pytest.raises(QueueFull, match="queue is full") as info:
        queue.admit(pending())
    assert info.value.http_status == 503
    assert info.value.retry_after_s is not None
    assert len(queue) == 2


def test_removed_request_frees_its_slot() -> None:
    queue = RequestQueue(priority_levels=1, max_size=1)
    item = pending()
    queue.admit(item)
    assert queue.remove(item)
    assert not queue.remove(item)
    queue.admit(pending())


items = st.lists(st.tuples(st.integers(1, 3), st.one_of(st.none(), st.floats(0, 100, allow_nan=False))), max_size=40)


@given(items, st.integers(1, 50))
def test_admission_never_exceeds_the_bound(entries: list[tuple[int, float | None]], bound: int) -> None:
    queue = RequestQueue(priority_levels=3, max_size=bound)
    admitted = 0
    for index, (priority, deadline) in enumerate(entries):
        try:
            queue.admit(pending(priority, index, deadline, index))
            admitted += 1
        except QueueFull:
            assert len(queue) == bound
    assert len(queue) == admitted == min(bound, len(entries))


@given(items, st.floats(0, 120, allow_nan=False))
def test_order_is_priority_then_fifo_and_expiry_is_exact(entries: list[tuple[int, float | None]], now: float) -> None:
    queue = RequestQueue(priority_levels=3, max_size=1000)
    admitted = [pending(p, i, d, i) for i, (p, d) in enumerate(entries)]
    for item in admitted:
        queue.admit(item)
    expired = queue.expire(now)
    assert {id(p) for p in expired} == {id(p) for p in admitted if p.deadline is not None and p.deadline <= now}
    remaining = list(queue.in_order())
    assert len(remaining) == len(queue) == len(admitted) - len(expired)
    keys = [(p.priority, p.arrival) for p in remaining]
    assert keys == sorted(keys)  # higher level (lower number) first, FIFO (arrival) within a level
    assert all(p.deadline is None or p.deadline > now for p in remaining)
