"""The order in which requests leave one priority level: fair between tenants, or earliest deadline first.

:class:`FairLevel` is start-time fair queuing (Goyal, Vin and Cheng, 1996): a request's start tag is
the later of the level's virtual time (the tag of the latest request dispatched) and the end of
its tenant's previous request (its start plus rows / weight), and requests leave in tag order.
A tenant sending ten times its share queues behind its own burst, while another tenant's request
takes the next turn; a tenant that was idle starts at the virtual time, with no credit saved up.
With one tenant waiting the order is plain FIFO, and costs one deque.

:class:`DeadlineLevel` orders by deadline (none: last), arrival breaking ties
(``dynamic_batching.order: deadline``): the request closest to missing its deadline goes first.

Pure: no clock, no I/O. ``pop`` takes the head of the order, so a batch taken from the front of
``iter()`` is removed item by item.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from collections.abc import Iterator

from tensorgate.scheduling.pending import Pending
from tensorgate.types import Tenant


class Level:
    """One priority level's waiting requests, in dispatch order."""

    def __len__(self) -> int:
        raise NotImplementedError

    def __iter__(self) -> Iterator[Pending]:
        raise NotImplementedError

    def push(self, item: Pending) -> None:
        """A new request joins at its place in the order."""
        raise NotImplementedError

    def push_front(self, item: Pending) -> None:
        """A request whose instance failed returns ahead of its tenant's later requests."""
        raise NotImplementedError

    def pop(self, item: Pending) -> None:
        """Remove ``item``, the head of the order (a batch leaves from the front)."""
        raise NotImplementedError

    def remove(self, item: Pending) -> bool:
        """Drop ``item`` wherever it is (its client left); False when it is not here."""
        raise NotImplementedError

    def drop_expired(self, now: float) -> list[Pending]:
        """Remove and return the requests whose deadline has passed."""
        raise NotImplementedError

    def newest_of(self, name: str) -> Pending | None:
        """The tenant's request that would leave last; None when it has none here."""
        raise NotImplementedError

    def count_of(self, name: str) -> int:
        """How many of the tenant's requests wait here."""
        raise NotImplementedError

    def counts(self) -> dict[str, int]:
        """How many requests each tenant with any has waiting here."""
        raise NotImplementedError

    def rows_ahead(self, tenant: Tenant, deadline: float | None) -> int:
        """How many waiting rows would leave before a request of ``tenant`` with ``deadline`` pushed now."""
        raise NotImplementedError


def _fair_key(item: Pending) -> tuple[float, float]:
    return (item.tag, item.arrival)


class FairLevel(Level):
    __slots__ = ("_finish", "_queues", "_size", "_virtual")

    def __init__(self) -> None:
        self._queues: dict[str, deque[Pending]] = {}  # per tenant, in tag order; no empty ones
        self._finish: dict[str, float] = {}  # where each waiting tenant's next request starts
        self._virtual = 0.0
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[Pending]:
        queues = self._queues
        if len(queues) == 1:
            for only in queues.values():
                return iter(only)
        if not queues:
            return iter(())
        return heapq.merge(*queues.values(), key=_fair_key)

    def _start(self, name: str) -> float:
        finish = self._finish.get(name)
        return self._virtual if finish is None or finish < self._virtual else finish

    def push(self, item: Pending) -> None:
        tenant = item.request.tenant
        name = tenant.name
        queue = self._queues.get(name)
        if queue is None:  # nothing of its own waiting: it starts at the virtual time
            start = self._virtual
            self._queues[name] = queue = deque()
        else:  # behind its own last request
            start = self._finish[name]
        item.tag = start
        self._finish[name] = start + item.rows / tenant.weight
        queue.append(item)
        self._size += 1

    def push_front(self, item: Pending) -> None:
        tenant = item.request.tenant
        queue = self._queues.get(tenant.name)
        if queue is None:  # its tag is kept: it was that tenant's turn already
            self._queues[tenant.name] = queue = deque()
            self._finish[tenant.name] = item.tag + item.rows / tenant.weight
        queue.appendleft(item)
        self._size += 1

    def pop(self, item: Pending) -> None:
        name = item.request.tenant.name
        queue = self._queues[name]
        head = queue.popleft()
        assert head is item, "pop() takes the head of the order"
        if item.tag > self._virtual:
            self._virtual = item.tag
        self._size -= 1
        if not queue:
            self._forget(name)

    def remove(self, item: Pending) -> bool:
        name = item.request.tenant.name
        queue = self._queues.get(name)
        if queue is None:
            return False
        last = queue[-1] is item
        try:
            queue.remove(item)
        except ValueError:
            return False
        self._size -= 1
        if not queue:
            self._forget(name)
        elif last:  # its next request takes the turn this one gave up
            self._finish[name] = item.tag
        return True

    def newest_of(self, name: str) -> Pending | None:
        queue = self._queues.get(name)
        return None if queue is None else queue[-1]

    def count_of(self, name: str) -> int:
        queue = self._queues.get(name)
        return 0 if queue is None else len(queue)

    def counts(self) -> dict[str, int]:
        return {name: len(queue) for name, queue in self._queues.items()}

    def _forget(self, name: str) -> None:
        """A tenant with nothing waiting: its next request starts at the virtual time, as a newcomer."""
        del self._queues[name]
        del self._finish[name]

    def drop_expired(self, now: float) -> list[Pending]:
        expired: list[Pending] = []
        for name, queue in list(self._queues.items()):
            if not any(p.deadline is not None and p.deadline <= now for p in queue):
                continue
            kept: deque[Pending] = deque()
            trailing: float | None = None  # the tag of the first expired request after the last kept one
            for p in queue:
                if p.deadline is not None and p.deadline <= now:
                    expired.append(p)
                    if trailing is None:
                        trailing = p.tag
                else:
                    kept.append(p)
                    trailing = None
            if not kept:
                self._forget(name)
                continue
            self._queues[name] = kept
            if trailing is not None:  # its newest expired: its next request takes that turn (as remove())
                self._finish[name] = trailing
        self._size -= len(expired)
        return expired

    def rows_ahead(self, tenant: Tenant, deadline: float | None) -> int:
        start = self._start(tenant.name)
        rows = 0
        for name, queue in self._queues.items():
            if name == tenant.name:
                rows += sum(p.rows for p in queue)
                continue
            for p in queue:  # in tag order: stop at the first that would leave after it
                if p.tag > start:
                    break
                rows += p.rows
        return rows


def _deadline_key(item: Pending) -> tuple[float, float]:
    return (math.inf if item.deadline is None else item.deadline, item.arrival)


class DeadlineLevel(Level):
    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: list[Pending] = []  # sorted by (deadline, arrival); a queue holds ~1k at most

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Pending]:
        return iter(self._items)

    def push(self, item: Pending) -> None:
        bisect.insort(self._items, item, key=_deadline_key)

    def push_front(self, item: Pending) -> None:
        self.push(item)  # a retry keeps its deadline, and so its place

    def pop(self, item: Pending) -> None:
        head = self._items.pop(0)
        assert head is item, "pop() takes the head of the order"

    def remove(self, item: Pending) -> bool:
        try:
            self._items.remove(item)  # Pending compares by identity
        except ValueError:
            return False
        return True

    def newest_of(self, name: str) -> Pending | None:
        for p in reversed(self._items):
            if p.request.tenant.name == name:
                return p
        return None

    def count_of(self, name: str) -> int:
        return sum(1 for p in self._items if p.request.tenant.name == name)

    def counts(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for p in self._items:
            name = p.request.tenant.name
            found[name] = found.get(name, 0) + 1
        return found

    def drop_expired(self, now: float) -> list[Pending]:
        expired = [p for p in self._items if p.deadline is not None and p.deadline <= now]
        if expired:
            self._items = [p for p in self._items if p.deadline is None or p.deadline > now]
        return expired

    def rows_ahead(self, tenant: Tenant, deadline: float | None) -> int:
        limit = math.inf if deadline is None else deadline
        rows = 0
        for p in self._items:
            if _deadline_key(p)[0] > limit:
                break
            rows += p.rows
        return rows
