"""Which of the versions on disk to serve: pure functions of the configuration and the version numbers."""

from __future__ import annotations

from collections.abc import Iterable

from tensorgate.config.model_config import CanaryConfig, ModelConfig, VersionPolicy


def select_versions(policy: VersionPolicy, available: Iterable[int]) -> list[int]:
    versions = sorted(set(available))
    if policy.all:
        return versions
    if policy.specific is not None:
        wanted = set(policy.specific)
        return [v for v in versions if v in wanted]
    latest = policy.latest if policy.latest is not None else 1
    return versions[-latest:] if versions else []


def canary_stable(canary: CanaryConfig, available: Iterable[int]) -> int | None:
    """The version a canary is judged against: the one named, or the highest on disk below the canary."""
    on_disk = set(available)
    if canary.stable is not None:
        return canary.stable if canary.stable in on_disk else None
    below = [v for v in on_disk if v < canary.version]
    return max(below) if below else None


def served_versions(config: ModelConfig, available: Iterable[int], *, keep_stable: bool = True) -> list[int]:
    """The version policy's choice (among the versions that are not a shadow) plus every version that
    traffic names: the versions of a weighted split, a shadow, and a canary with the version it
    replaces (``keep_stable`` False once the canary was promoted: the old version then goes as the
    policy says)."""
    on_disk = sorted(set(available))
    traffic = config.traffic
    shadow = traffic.shadow.version if traffic is not None and traffic.shadow is not None else None
    # A shadow is not what the policy serves: "latest" means the latest version that takes traffic.
    chosen = set(select_versions(config.version_policy, [v for v in on_disk if v != shadow]))
    if traffic is not None:
        if traffic.weights is not None:
            chosen.update(traffic.weights)
        if traffic.shadow is not None:
            chosen.add(traffic.shadow.version)
        if traffic.canary is not None:
            chosen.add(traffic.canary.version)
            stable = canary_stable(traffic.canary, on_disk)
            if keep_stable and stable is not None:
                chosen.add(stable)
    return sorted(chosen.intersection(on_disk))
