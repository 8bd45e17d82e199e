"""The per-version request queue: priority levels, bounded admission, deadline expiry.

Pure: no I/O, no clock of its own (``now`` is an argument), no asyncio. Tested with hypothesis.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from tensorgate.errors import QueueFull
from tensorgate.scheduling.pending import Pending

RETRY_AFTER_S = 1.0


class RequestQueue:
    def __init__(self, priority_levels: int, max_size: int) -> None:
        if priority_levels < 1 or max_size < 1:
            raise ValueError("priority_levels and max_size are positive")
        self._levels: list[deque[Pending]] = [deque() for _ in range(priority_levels)]
        self.max_size = max_size
        self._size = 0
        self._next_deadline: float | None = None

    def __len__(self) -> int:
        return self._size

    def depth(self, level: int) -> int:
        return len(self._levels[level - 1])

    @property
    def priority_levels(self) -> int:
        return len(self._levels)

    def admit(self, item: Pending) -> None:
        """Enqueue at the back of its level, or raise QueueFull at once (never block)."""
        if self._size >= self.max_size:
            raise QueueFull(
                f"model '{item.request.model}' queue is full ({self.max_size} requests waiting); retry later",
                retry_after_s=RETRY_AFTER_S,
            )
        self._levels[item.priority - 1].append(item)
        self._size += 1
        if item.deadline is not None and (self._next_deadline is None or item.deadline < self._next_deadline):
            self._next_deadline = item.deadline

    def requeue_front(self, item: Pending) -> None:
        """Put a request whose instance failed back at the head of its level (retries skip admission)."""
        self._levels[item.priority - 1].appendleft(item)
        self._size += 1
        if item.deadline is not None and (self._next_deadline is None or item.deadline < self._next_deadline):
            self._next_deadline = item.deadline

    def remove(self, item: Pending) -> bool:
        """Drop a request (its client went away). False when it is no longer queued."""
        level = self._levels[item.priority - 1]
        try:
            level.remove(item)
        except ValueError:
            return False
        self._size -= 1
        return True

    def expire(self, now: float) -> list[Pending]:
        """Remove and return every request whose deadline has passed."""
        if self._next_deadline is None or now < self._next_deadline:
            return []
        expired: list[Pending] = []
        next_deadline: float | None = None
        for index, level in enumerate(self._levels):
            if not any(p.deadline is not None and p.deadline <= now for p in level):
                for p in level:
                    if p.deadline is not None and (next_deadline is None or p.deadline < next_deadline):
                        next_deadline = p.deadline
                continue
            kept: deque[Pending] = deque()
            for p in level:
                if p.deadline is not None and p.deadline <= now:
                    expired.append(p)
                else:
                    kept.append(p)
                    if p.deadline is not None and (next_deadline is None or p.deadline < next_deadline):
                        next_deadline = p.deadline
            self._levels[index] = kept
        self._size -= len(expired)
        self._next_deadline = next_deadline
        return expired

    @property
    def next_deadline(self) -> float | None:
        return self._next_deadline

    def in_order(self) -> Iterator[Pending]:
        """Highest priority first, FIFO within a level: the order of dispatch."""
        for level in self._levels:
            yield from level

    def take(self, items: list[Pending]) -> None:
        """Remove ``items``, which are a prefix of ``in_order()``."""
        for item in items:
            level = self._levels[item.priority - 1]
            head = level.popleft()
            assert head is item, "take() expects a prefix of in_order()"
        self._size -= len(items)
