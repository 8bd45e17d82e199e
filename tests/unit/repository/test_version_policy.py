"""Version policy: a pure function of the policy and the versions on disk (property tests)."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from tensorgate.config.model_config import ModelConfig, VersionPolicy
from tensorgate.repository.version_policy import select_versions, served_versions

versions = st.lists(st.integers(min_value=1, max_value=10_000), max_size=30)


@given(versions)
def test_default_is_the_latest_one(available: list[int]) -> None:
    chosen = select_versions(VersionPolicy(), available)
    assert chosen == ([max(available)] if available else [])


@given(versions, st.integers(min_value=1, max_value=40))
def test_latest_n(available: list[int], n: int) -> None:
    chosen = select_versions(VersionPolicy(latest=n), available)
    distinct = sorted(set(available))
    assert chosen == distinct[-n:] if distinct else chosen == []
    assert len(chosen) == min(n, len(distinct))
    assert all(v > u for u, v in itertools.pairwise(chosen))
    if chosen:
        assert max(chosen) == max(available)
        assert all(v < min(chosen) for v in set(available) - set(chosen))


@given(versions)
def test_all(available: list[int]) -> None:
    assert select_versions(VersionPolicy(all=True), available) == sorted(set(available))


@given(versions, st.lists(st.integers(min_value=1, max_value=10_000), max_size=10))
def test_specific(available: list[int], wanted: list[int]) -> None:
    chosen = select_versions(VersionPolicy(specific=wanted), available)
    assert chosen == sorted(set(available) & set(wanted))


@given(versions, st.integers(min_value=1, max_value=40))
def test_order_of_discovery_does_not_matter(available: list[int], n: int) -> None:
    policy = VersionPolicy(latest=n)
    assert select_versions(policy, available) == select_versions(policy, list(reversed(available)))


def _config(traffic: dict[str, object] | None = None, **policy: object) -> ModelConfig:
    return ModelConfig.model_validate({"version_policy": policy, "traffic": traffic})


def test_traffic_keeps_the_versions_it_names_loaded() -> None:
    assert served_versions(_config({"weights": {1: 90, 2: 10}}), [1, 2, 3]) == [1, 2, 3]
    assert served_versions(_config({"weights": {1: 90, 2: 10}}, latest=1), [1, 2]) == [1, 2]
    assert served_versions(_config({"weights": {1: 90, 7: 10}}), [1, 2]) == [1, 2]  # only what is on disk


def test_a_canary_keeps_the_version_below_it_until_promoted() -> None:
    config = _config({"canary": {"version": 3}})
    assert served_versions(config, [1, 2, 3]) == [2, 3]
    assert served_versions(config, [1, 2, 3], keep_stable=False) == [3]
    assert served_versions(_config({"canary": {"version": 3, "stable": 1}}), [1, 2, 3]) == [1, 3]


def test_a_shadow_is_served_beside_the_latest_of_the_others() -> None:
    assert served_versions(_config({"shadow": {"version": 2}}), [1, 2]) == [1, 2]
    assert served_versions(_config({"shadow": {"version": 2}}), [1, 2, 3]) == [2, 3]
