"""A canary that promotes itself or rolls back, judged on what it served against the stable version.

:func:`decide` is the policy, a pure function of the figures of the current step; :class:`Rollout`
is the thin driver that collects those figures as requests end (on the event loop, with the
injected clock), applies each decision, and reports it (log line, metrics, a callback to the
manager, which unloads the old version once the canary is promoted).

The rules: the canary takes the first step's share. Once it has served ``min_requests`` in a step,
a 5xx rate above ``max_error_rate`` rolls it back at once. Once the step has also lasted
``step_s``, its P99 is compared with the stable version's over the same step: above
``max_p99_ratio`` times it rolls back; otherwise the share moves to the next step, and reaching
100 % promotes the canary.
"""

from __future__ import annotations

import bisect
import enum
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from tensorgate.clock import Clock
from tensorgate.config.model_config import CanaryConfig

log = logging.getLogger(__name__)

# Latency buckets for a step's P99: geometric, 10 us to ~1000 s, each 5 % wider than the last, so
# a P99 read from them is within 5 % of the true one, in a fixed 380 counters per version.
_RATIO = 1.05
_BOUNDS = tuple(1e-5 * _RATIO**i for i in range(int(math.log(1e8) / math.log(_RATIO)) + 1))


class RolloutState(enum.Enum):
    STEPPING = "stepping"
    PROMOTED = "promoted"
    ROLLED_BACK = "rolled_back"


@dataclass(frozen=True, slots=True)
class StepFigures:
    """What one version served during the current step."""

    requests: int
    errors: int  # answered with a 5xx
    p99_s: float | None

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


@dataclass(frozen=True, slots=True)
class Decision:
    action: Literal["hold", "advance", "promote", "rollback"]
    reason: str = ""


def decide(config: CanaryConfig, step: int, elapsed_s: float, canary: StepFigures, stable: StepFigures) -> Decision:
    """What the rollout does now, at ``elapsed_s`` into step ``step`` (an index into ``config.steps``)."""
    if canary.requests < config.min_requests:
        return Decision("hold")
    if canary.error_rate > config.max_error_rate:
        return Decision(
            "rollback",
            f"error rate {canary.error_rate:.4f} ({canary.errors} of {canary.requests} requests) is above "
            f"max_error_rate {config.max_error_rate}",
        )
    if elapsed_s < config.step_s:
        return Decision("hold")
    if canary.p99_s is not None and stable.p99_s is not None and stable.p99_s > 0:
        ratio = canary.p99_s / stable.p99_s
        if ratio > config.max_p99_ratio:
            return Decision(
                "rollback",
                f"P99 {canary.p99_s * 1000:.1f} ms is {ratio:.2f}x the stable version's "
                f"{stable.p99_s * 1000:.1f} ms, above max_p99_ratio {config.max_p99_ratio}",
            )
    if step + 1 >= len(config.steps) or config.steps[step + 1] >= 100:
        return Decision("promote")
    return Decision("advance")


class StepWindow:
    """One version's requests, 5xx answers and latency histogram over the current step."""

    __slots__ = ("counts", "errors", "requests")

    def __init__(self) -> None:
        self.requests = 0
        self.errors = 0
        self.counts = [0] * (len(_BOUNDS) + 1)

    def add(self, seconds: float, failed: bool) -> None:
        self.requests += 1
        if failed:
            self.errors += 1
        self.counts[bisect.bisect_left(_BOUNDS, seconds)] += 1

    def p99(self) -> float | None:
        if not self.requests:
            return None
        rank = math.ceil(0.99 * self.requests)
        seen = 0
        for index, count in enumerate(self.counts):
            seen += count
            if seen >= rank:
                return _BOUNDS[min(index, len(_BOUNDS) - 1)]
        return _BOUNDS[-1]

    def figures(self) -> StepFigures:
        return StepFigures(self.requests, self.errors, self.p99())


class Rollout:
    """One canary rollout of ``config.version`` against ``stable``; state lives in this server only."""

    def __init__(
        self,
        model: str,
        config: CanaryConfig,
        stable: int,
        clock: Clock,
        on_change: Callable[[Rollout], None] | None = None,
    ) -> None:
        self.model = model
        self.config = config
        self.canary = config.version
        self.stable = stable
        self._clock = clock
        self._on_change = on_change
        self.state = RolloutState.STEPPING
        self.step = 0
        self.reason = ""
        self.history: list[dict[str, object]] = []
        self._started = clock.now()
        self._windows = {self.canary: StepWindow(), stable: StepWindow()}
        log.info(
            "model %s: canary rollout of version %d against version %d starts at %g %%",
            model,
            self.canary,
            stable,
            config.steps[0],
        )

    @property
    def share(self) -> float:
        """The canary's percentage of the traffic that names no version."""
        if self.state is RolloutState.PROMOTED:
            return 100.0
        if self.state is RolloutState.ROLLED_BACK:
            return 0.0
        return self.config.steps[self.step]

    def shares(self) -> list[tuple[int, float]]:
        share = self.share
        pairs = [(self.stable, 100.0 - share), (self.canary, share)]
        return sorted(p for p in pairs if p[1] > 0)

    def observe(self, version: int, seconds: float, failed: bool) -> None:
        if self.state is not RolloutState.STEPPING:
            return
        window = self._windows.get(version)
        if window is None:
            return
        window.add(seconds, failed)
        canary = self._windows[self.canary]
        # decide() is the rule; this only skips it (and its P99 walk) while it can only say "hold".
        if canary.requests < self.config.min_requests:
            return
        elapsed = self._clock.now() - self._started
        if elapsed < self.config.step_s and canary.errors <= self.config.max_error_rate * canary.requests:
            return
        self._apply(decide(self.config, self.step, elapsed, canary.figures(), self._windows[self.stable].figures()))

    def roll_back(self, reason: str) -> None:
        """End the rollout from outside the figures (the canary failed to load, or left the repository)."""
        if self.state is RolloutState.STEPPING:
            self._apply(Decision("rollback", reason))

    def _apply(self, decision: Decision) -> None:
        if decision.action == "hold":
            return
        self.history.append(self._record(decision))
        if decision.action == "rollback":
            self.state, self.reason = RolloutState.ROLLED_BACK, decision.reason
            log.warning(
                "model %s: canary version %d rolled back at %g %%: %s",
                self.model,
                self.canary,
                self.config.steps[self.step],
                decision.reason,
            )
        elif decision.action == "promote":
            self.state = RolloutState.PROMOTED
            log.info("model %s: canary version %d promoted to 100 %%", self.model, self.canary)
        else:
            self.step += 1
            log.info(
                "model %s: canary version %d moves to %g %%", self.model, self.canary, self.config.steps[self.step]
            )
        self._started = self._clock.now()
        self._windows = {self.canary: StepWindow(), self.stable: StepWindow()}
        if self._on_change is not None:
            self._on_change(self)

    def _record(self, decision: Decision) -> dict[str, object]:
        canary, stable = self._windows[self.canary].figures(), self._windows[self.stable].figures()
        return {
            "step": self.step,
            "share": self.config.steps[self.step],
            "action": decision.action,
            "reason": decision.reason,
            "canary": _figures(canary),
            "stable": _figures(stable),
        }

    def status(self) -> dict[str, object]:
        return {
            "canary": self.canary,
            "stable": self.stable,
            "state": self.state.value,
            "step": self.step,
            "share": self.share,
            "reason": self.reason,
            "current_step": {
                "canary": _figures(self._windows[self.canary].figures()),
                "stable": _figures(self._windows[self.stable].figures()),
                "elapsed_s": round(self._clock.now() - self._started, 3),
            },
            "history": self.history,
        }


def _figures(figures: StepFigures) -> dict[str, object]:
    return {
        "requests": figures.requests,
        "errors": figures.errors,
        "error_rate": round(figures.error_rate, 6),
        "p99_ms": None if figures.p99_s is None else round(figures.p99_s * 1000, 3),
    }
