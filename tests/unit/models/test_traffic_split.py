"""The split's pure parts: ``pick`` by cumulative shares and a sticky key's point (property tests)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from tensorgate.models.traffic import key_point, pick

shares = st.dictionaries(st.integers(1, 50), st.floats(0.01, 100), min_size=1, max_size=6).map(
    lambda d: sorted(d.items())
)
points = st.floats(0.0, 1.0, exclude_max=True)


@given(shares, points)
def test_pick_returns_a_listed_version(pairs: list[tuple[int, float]], point: float) -> None:
    assert pick(pairs, point) in {v for v, _ in pairs}


@given(shares, points, points)
def test_pick_is_monotonic_in_the_point(pairs: list[tuple[int, float]], a: float, b: float) -> None:
    low, high = sorted((a, b))
    order = [v for v, _ in pairs]
    assert order.index(pick(pairs, low)) <= order.index(pick(pairs, high))


@given(shares)
def test_each_version_gets_its_share_of_evenly_spread_points(pairs: list[tuple[int, float]]) -> None:
    n = 10_000
    counts = Counter(pick(pairs, (i + 0.5) / n) for i in range(n))
    total = sum(w for _, w in pairs)
    for version, weight in pairs:
        assert abs(counts[version] / n - weight / total) <= 2 / n * len(pairs)


@given(st.text(min_size=1, max_size=64))
def test_a_key_has_one_point_in_the_unit_interval(key: str) -> None:
    point = key_point(key)
    assert 0.0 <= point < 1.0
    assert key_point(key) == point


def test_a_growing_canary_share_keeps_the_keys_it_already_had() -> None:
    keys = [f"user-{i}" for i in range(2000)]
    previous: set[str] = set()
    for share in (10, 25, 50, 100):
        pairs = sorted([(1, 100.0 - share), (2, float(share))])
        pairs = [p for p in pairs if p[1] > 0]
        on_canary = {k for k in keys if pick(pairs, key_point(k)) == 2}
        assert previous <= on_canary
        assert abs(len(on_canary) / len(keys) - share / 100) < 0.05
        previous = on_canary
