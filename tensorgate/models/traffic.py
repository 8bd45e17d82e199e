"""Traffic between the versions of one model: weighted splits, sticky keys, and the state behind them.

The choice itself is pure: :func:`pick` maps a point in [0, 1) to a version by cumulative shares,
and :func:`key_point` maps a sticky key to its point, so one key meets one version for as long as
the shares stand. Shares come from the configured weights, or from a canary's current step.
Versions are laid out in ascending order, so as a canary's share grows the points that reach it
only grow too: a user moved to the canary stays on it.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

from tensorgate.config.model_config import TrafficConfig
from tensorgate.models.rollout import Rollout
from tensorgate.models.shadow import Shadow


def key_point(key: str) -> float:
    """A sticky key's place in [0, 1): the same on every replica and across restarts."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def pick(shares: Sequence[tuple[int, float]], point: float) -> int:
    """The version whose stretch of [0, 1) holds ``point``; shares are (version, weight > 0), any total."""
    total = 0.0
    for _, weight in shares:
        total += weight
    target = point * total
    running = 0.0
    for version, weight in shares:
        running += weight
        if target < running:
            return version
    return shares[-1][0]  # point * total rounded up to the total


class TrafficState:
    """What one model's ``traffic`` section does now: its shares, its rollout and its shadow."""

    def __init__(self, config: TrafficConfig, rollout: Rollout | None, shadow: Shadow | None, rng: random.Random):
        self.config = config
        self.rollout = rollout
        self.shadow = shadow
        self.sticky_header = config.sticky_header.lower()
        self._rng = rng
        # Versions never chosen by default: a shadow only ever gets copies.
        self.excluded = frozenset(() if config.shadow is None else (config.shadow.version,))

    def shares(self) -> list[tuple[int, float]]:
        """(version, weight) in ascending version order; empty when no split is set (latest ready wins)."""
        if self.rollout is not None:
            return self.rollout.shares()
        if self.config.weights is not None:
            return sorted(self.config.weights.items())
        return []

    def point(self, key: str | None) -> float:
        return key_point(key) if key else self._rng.random()

    def observe(self, version: int, seconds: float, failed: bool) -> None:
        """A request to ``version`` ended (``failed``: with a 5xx): the rollout judges by these."""
        if self.rollout is not None:
            self.rollout.observe(version, seconds, failed)

    def status(self) -> dict[str, object]:
        shares = self.shares()
        total = sum(w for _, w in shares)
        return {
            "shares": {str(v): (100.0 * w / total if total else 0.0) for v, w in shares},
            "sticky_header": self.config.sticky_header,
            "rollout": None if self.rollout is None else self.rollout.status(),
            "shadow": None if self.shadow is None else self.shadow.status(),
        }
