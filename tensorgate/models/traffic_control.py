"""Traffic between a model's versions, kept in line with its configuration: the weights, the canary
rollout and the shadow, and the metrics that show them.

The manager calls :meth:`TrafficControl.configure` whenever a model's configuration is applied and
:meth:`TrafficControl.check_rollout` once its loads are done; the routing reads the resulting
:class:`~tensorgate.models.traffic.TrafficState` on the entry. A rollout that ends (promoted or
rolled back) hands the model back to the manager, which applies its version policy again.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

from tensorgate.clock import Clock
from tensorgate.models.entry import ModelEntry
from tensorgate.models.rollout import Rollout, RolloutState
from tensorgate.models.servable import VersionState
from tensorgate.models.shadow import Shadow
from tensorgate.models.traffic import TrafficState
from tensorgate.observability.metrics import Metrics
from tensorgate.repository.version_policy import canary_stable

log = logging.getLogger(__name__)


class TrafficControl:
    def __init__(
        self, clock: Clock, metrics: Metrics, rng: random.Random, rollout_ended: Callable[[ModelEntry], None]
    ) -> None:
        self._clock = clock
        self._metrics = metrics
        self._rng = rng
        self._rollout_ended = rollout_ended  # the manager re-applies the model's version policy

    def configure(self, entry: ModelEntry) -> None:
        """Build the model's traffic state from its configuration, keeping a rollout or shadow whose
        own settings did not change (a poll that finds the same canary does not restart it)."""
        config = entry.source.config.traffic
        old = entry.traffic
        if config is None:
            entry.traffic = None
            self.publish(entry)
            return
        rollout = None
        if config.canary is not None:
            kept = old.rollout if old is not None else None
            on_disk = [v.version for v in (entry.source.on_disk or entry.source.versions)]
            stable = canary_stable(config.canary, on_disk)
            if kept is not None and kept.config == config.canary and kept.stable == stable:
                rollout = kept
            elif stable is not None:
                rollout = Rollout(entry.source.name, config.canary, stable, self._clock, self._rollout_changed(entry))
            else:
                log.error(
                    "model %s: canary version %d has no earlier version on disk to be judged against; "
                    "set traffic.canary.stable",
                    entry.source.name,
                    config.canary.version,
                )
        shadow = None
        if config.shadow is not None:
            kept_shadow = old.shadow if old is not None else None
            if kept_shadow is not None and kept_shadow.config == config.shadow:
                shadow = kept_shadow
            else:
                shadow = Shadow(entry.source.name, config.shadow, self._metrics, self._rng)
        entry.traffic = TrafficState(config, rollout, shadow, self._rng)
        self.publish(entry)

    def _rollout_changed(self, entry: ModelEntry) -> Callable[[Rollout], None]:
        def changed(rollout: Rollout) -> None:
            self.publish(entry)
            if rollout.state is not RolloutState.STEPPING:
                self._rollout_ended(entry)

        return changed

    def check_rollout(self, entry: ModelEntry) -> None:
        """A canary that cannot serve (its load failed) is rolled back rather than left waiting."""
        rollout = entry.traffic.rollout if entry.traffic is not None else None
        if rollout is None or rollout.state is not RolloutState.STEPPING:
            return
        status = entry.statuses.get(rollout.canary)
        if status is None:  # nothing was loaded for it: its directory is not in the repository
            rollout.roll_back(f"canary version {rollout.canary} is not in the model repository")
        elif status.state is VersionState.FAILED:
            rollout.roll_back(f"canary version {rollout.canary} failed to load: {status.reason}")

    def publish(self, entry: ModelEntry) -> None:
        """The model's shares and rollout state as metrics (none for a rollout that is over)."""
        name = entry.source.name
        shares = entry.traffic.shares() if entry.traffic is not None else []
        total = sum(weight for _, weight in shares)
        numbers = set(entry.versions) | {v for v, _ in shares}
        for number in numbers:
            weight = dict(shares).get(number, 0.0)
            self._metrics.traffic_share.labels(name, str(number)).set(100.0 * weight / total if total else 0.0)
        rollout = entry.traffic.rollout if entry.traffic is not None else None
        for state in RolloutState:
            if rollout is not None:
                self._metrics.rollout_state.labels(name, state.value).set(1 if rollout.state is state else 0)
            else:  # no rollout (any more): no series, rather than the last one's state forever
                self._metrics.rollout_state.remove(name, state.value)
