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
        # Batches each instance has finished (probes included): the health monitor's sign of activity.
        self.uses: dict[Instance, int] = {i: 0 for i in self.instances}

    def idle_count(self) -> int:
        return sum(1 for i in self.instances if i.available and i not in self._busy)

    def busy_count(self) -> int:
        return len(self._busy)

    def is_busy(self, instance: Instance) -> bool:
        return instance in self._busy

    def any_healthy(self) -> bool:
        """Whether any instance is in rotation (alive and not taken out by its health checks)."""
        for instance in self.instances:  # noqa: SIM110 - a plain loop: no generator per request
            if instance.available:
                return True
        return False

    def any_ejected(self) -> bool:
        return any(i.ejected for i in self.instances)

    def available_count(self) -> int:
        return sum(1 for i in self.instances if i.available)

    def acquire(self, avoid: Instance | None = None) -> Instance | None:
        """An idle instance in rotation (round-robin among them), marked busy; None when there is none.

        ``avoid`` (the instance a retried batch failed on) is taken only when no other instance is
        in rotation: while another is, busy or not, the retry waits for it. Taking the failed one
        because it happened to be the idle one failed the retry too, and the client saw a 500.
        """
        count = len(self.instances)
        fallback: Instance | None = None
        for step in range(count):
            candidate = self.instances[(self._next + step) % count]
            if candidate in self._busy or not candidate.available:
                continue
            if candidate is avoid:
                fallback = candidate
                continue
            self._next = (self._next + step + 1) % count
            self._busy.add(candidate)
            return candidate
        if fallback is None or any(i is not avoid and i.available for i in self.instances):
            return None
        self._busy.add(fallback)
        return fallback

    def take(self, instance: Instance) -> bool:
        """Take this one instance for work if it is idle and in rotation."""
        if instance in self._busy or not instance.available:
            return False
        self._busy.add(instance)
        return True

    def acquire_for_probe(self, instance: Instance) -> bool:
        """Take this one instance for a health probe if it is idle and alive, in rotation or not."""
        if instance in self._busy or not instance.healthy:
            return False
        self._busy.add(instance)
        return True

    def release(self, instance: Instance) -> None:
        self._busy.discard(instance)
        self.uses[instance] = self.uses.get(instance, 0) + 1
