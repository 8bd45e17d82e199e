"""Which of the versions on disk to serve: a pure function of the policy and the version numbers."""

from __future__ import annotations

from collections.abc import Iterable

from tensorgate.config.model_config import VersionPolicy


def select_versions(policy: VersionPolicy, available: Iterable[int]) -> list[int]:
    versions = sorted(set(available))
    if policy.all:
        return versions
    if policy.specific is not None:
        wanted = set(policy.specific)
        return [v for v in versions if v in wanted]
    latest = policy.latest if policy.latest is not None else 1
    return versions[-latest:] if versions else []
