"""The per-version request queue: priority levels, bounded admission, deadline expiry.

Within a level the order is the level's own (``scheduling.queue_order``): fair between tenants
(``dynamic_batching.order: fifo``, which is FIFO for one tenant), or earliest deadline first
(``order: deadline``). A tenant with a ``max_queued`` is refused past it while others are not, and a full queue is
shared fairly: a newcomer takes the newest place of the tenant holding the most.

Pure: no I/O, no clock of its own (``now`` is an argument), no asyncio. Tested with hypothesis.
"""

from __future__ import annotations

from collections.abc import Iterator

from tensorgate.errors import QueueFull
from tensorgate.scheduling.pending import Pending
from tensorgate.scheduling.queue_order import DeadlineLevel, FairLevel, Level
from tensorgate.types import Tenant

RETRY_AFTER_S = 1.0
ORDERS = ("fifo", "deadline")


class RequestQueue:
    def __init__(self, priority_levels: int, max_size: int, order: str = "fifo") -> None:
        if priority_levels < 1 or max_size < 1:
            raise ValueError("priority_levels and max_size are positive")
        if order not in ORDERS:
            raise ValueError(f"order is one of {', '.join(ORDERS)}")
        level: type[Level] = DeadlineLevel if order == "deadline" else FairLevel
        self._levels: list[Level] = [level() for _ in range(priority_levels)]
        self.max_size = max_size
        self.order = order
        self._size = 0
        self._next_deadline: float | None = None

    def __len__(self) -> int:
        return self._size

    def depth(self, level: int) -> int:
        return len(self._levels[level - 1])

    @property
    def priority_levels(self) -> int:
        return len(self._levels)

    def admit(self, item: Pending) -> Pending | None:
        """Enqueue at its place in its level, or raise QueueFull at once (never block).

        A full queue is shared fairly too: a request of a tenant holding fewer places than the
        tenant that holds the most takes the newest place of that one, which is returned (to be
        answered 503, as if it had found the queue full); otherwise the new request is refused.
        """
        tenant = item.request.tenant
        if tenant.max_queued is not None:
            waiting = self._held_by(tenant.name)
            if waiting >= tenant.max_queued:
                raise QueueFull(
                    f"tenant '{tenant.name}' has {waiting} requests waiting for model '{item.request.model}', "
                    f"its max_queued; retry later",
                    retry_after_s=RETRY_AFTER_S,
                )
        displaced = None
        if self._size >= self.max_size:
            displaced = self._displace(tenant.name)
            if displaced is None:
                raise QueueFull(
                    f"model '{item.request.model}' queue is full ({self.max_size} requests waiting); retry later",
                    retry_after_s=RETRY_AFTER_S,
                )
        self._levels[item.priority - 1].push(item)
        self._joined(item)
        return displaced

    def _held_by(self, name: str) -> int:
        return sum(level.count_of(name) for level in self._levels)

    def _displace(self, name: str) -> Pending | None:
        """The newest request of the tenant holding the most places, when it holds more than one
        more than tenant ``name`` does; it leaves the queue. Only asked of a full queue."""
        counts: dict[str, int] = {}
        for level in self._levels:
            for tenant, count in level.counts().items():
                counts[tenant] = counts.get(tenant, 0) + count
        if not counts:
            return None
        most_name, most = max(counts.items(), key=lambda count: count[1])
        if most <= counts.get(name, 0) + 1:
            return None
        for level in reversed(self._levels):  # its lowest-priority place goes first
            newest = level.newest_of(most_name)
            if newest is not None:
                level.remove(newest)
                self._size -= 1
                return newest
        return None

    def requeue_front(self, item: Pending) -> None:
        """Put a request whose instance failed back ahead in its level (retries skip admission)."""
        self._levels[item.priority - 1].push_front(item)
        self._joined(item)

    def _joined(self, item: Pending) -> None:
        self._size += 1
        if item.deadline is not None and (self._next_deadline is None or item.deadline < self._next_deadline):
            self._next_deadline = item.deadline

    def remove(self, item: Pending) -> bool:
        """Drop a request (its client went away). False when it is no longer queued."""
        if not self._levels[item.priority - 1].remove(item):
            return False
        self._size -= 1
        return True

    def expire(self, now: float) -> list[Pending]:
        """Remove and return every request whose deadline has passed."""
        if self._next_deadline is None or now < self._next_deadline:
            return []
        expired: list[Pending] = []
        for level in self._levels:
            expired.extend(level.drop_expired(now))
        self._size -= len(expired)
        self._next_deadline = min(
            (p.deadline for p in self.in_order() if p.deadline is not None),
            default=None,
        )
        return expired

    @property
    def next_deadline(self) -> float | None:
        return self._next_deadline

    def in_order(self) -> Iterator[Pending]:
        """Highest priority first, each level in its own order: the order of dispatch."""
        for level in self._levels:
            yield from level

    def take(self, items: list[Pending]) -> None:
        """Remove ``items``, which are a prefix of ``in_order()``."""
        levels = self._levels
        for item in items:
            levels[item.priority - 1].pop(item)
        self._size -= len(items)

    def rows_ahead(self, priority: int, tenant: Tenant, deadline: float | None) -> int:
        """The waiting rows that would be dispatched before a request of ``tenant`` admitted now at
        ``priority`` with ``deadline``: every row of the levels above, and those ahead in its own."""
        above = sum(p.rows for level in self._levels[: priority - 1] for p in level)
        return above + self._levels[priority - 1].rows_ahead(tenant, deadline)
