"""The instances of one model version, and which of them are idle."""

from __future__ import annotations

from collections.abc import Sequence

from tensorgate.instances.base import Instance


class InstancePool:
    def __init__(self, instances: Sequence[Instance]) -> None:
        if not instances:
            raise ValueError("a pool needs at least one instance")
        self.instances = list(instances)
        self._busy: set[Instance] = set()
        self._next = 0

    def idle_count(self) -> int:
        return sum(1 for i in self.instances if i.healthy and i not in self._busy)

    def busy_count(self) -> int:
        return len(self._busy)

    def any_healthy(self) -> bool:
        for instance in self.instances:  # noqa: SIM110 - a plain loop: no generator per request
            if instance.healthy:
                return True
        return False

    def acquire(self, avoid: Instance | None = None) -> Instance | None:
        """An idle, healthy instance (round-robin among them), marked busy; None when there is none."""
        count = len(self.instances)
        fallback: Instance | None = None
        for step in range(count):
            candidate = self.instances[(self._next + step) % count]
            if candidate in self._busy or not candidate.healthy:
                continue
            if candidate is avoid:
                fallback = candidate
                continue
            self._next = (self._next + step + 1) % count
            self._busy.add(candidate)
            return candidate
        if fallback is not None:
            self._busy.add(fallback)
        return fallback

    def release(self, instance: Instance) -> None:
        self._busy.discard(instance)
