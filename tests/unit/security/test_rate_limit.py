"""Per-identity rate limits: exact within one bucket, refilled at the rate, and a cap in flight."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgate.errors import RateLimited
from tensorgate.security.identity import Identity, Limits
from tensorgate.security.rate_limit import MAX_TRACKED, RateLimiter, TokenBucket


def _who(name: str = "a", **limits: float) -> Identity:
    return Identity(name, frozenset({"infer"}), limits=Limits(**limits))  # type: ignore[arg-type]


def _admitted(limiter: RateLimiter, identity: Identity, now: float, count: int) -> int:
    passed = 0
    for _ in range(count):
        try:
            limiter.admit(identity, now)
        except RateLimited:
            continue
        limiter.release(identity)
        passed += 1
    return passed


def test_a_full_bucket_admits_exactly_its_burst_then_one_per_refill() -> None:
    limiter, who = RateLimiter(), _who(requests_per_s=2.0, burst=5)
    assert _admitted(limiter, who, 100.0, 8) == 5
    with pytest.raises(RateLimited) as caught:
        limiter.admit(who, 100.0)
    assert caught.value.retry_after_s == 1.0  # half a second to the next token, said as 1 s
    assert "over its rate of 2 requests/s" in caught.value.message
    assert _admitted(limiter, who, 100.5, 3) == 1
    assert _admitted(limiter, who, 110.0, 9) == 5  # refilled, never past the burst


def test_without_a_burst_the_bucket_holds_one_seconds_worth() -> None:
    limiter = RateLimiter()
    assert _admitted(limiter, _who(requests_per_s=3.0), 0.0, 10) == 3
    assert _admitted(limiter, _who("slow", requests_per_s=0.1), 0.0, 10) == 1


def test_the_wait_is_said_in_whole_seconds_rounded_up() -> None:
    limiter, who = RateLimiter(), _who(requests_per_s=0.25, burst=1)
    limiter.admit(who, 0.0)
    with pytest.raises(RateLimited) as caught:
        limiter.admit(who, 1.0)
    assert caught.value.retry_after_s == 3.0


def test_identities_have_their_own_buckets() -> None:
    limiter = RateLimiter()
    noisy, quiet = _who("noisy", requests_per_s=1.0, burst=2), _who("quiet", requests_per_s=1.0, burst=2)
    assert _admitted(limiter, noisy, 0.0, 50) == 2
    assert _admitted(limiter, quiet, 0.0, 2) == 2


def test_requests_in_flight_are_capped_until_released() -> None:
    limiter, who = RateLimiter(), _who(max_inflight=2)
    limiter.admit(who, 0.0)
    limiter.admit(who, 0.0)
    with pytest.raises(RateLimited, match="2 requests in flight"):
        limiter.admit(who, 0.0)
    limiter.release(who)
    limiter.admit(who, 0.0)


def test_new_limits_for_a_name_take_effect_at_once() -> None:
    limiter = RateLimiter()
    assert _admitted(limiter, _who(requests_per_s=1.0, burst=1), 0.0, 5) == 1
    assert _admitted(limiter, _who(requests_per_s=1.0, burst=4), 0.0, 5) == 4  # its key line changed


def test_the_buckets_kept_are_bounded() -> None:
    limiter = RateLimiter()
    for n in range(MAX_TRACKED + 50):
        limiter.admit(_who(f"sub-{n}", requests_per_s=1.0), 0.0)
        limiter.release(_who(f"sub-{n}", requests_per_s=1.0))
    assert len(limiter._states) <= MAX_TRACKED


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(0.1, 1000.0),
    burst=st.integers(1, 50),
    gaps=st.lists(st.floats(0.0, 2.0), min_size=1, max_size=200),
)
def test_never_more_than_the_burst_plus_what_the_rate_refilled(rate: float, burst: int, gaps: list[float]) -> None:
    bucket, now, taken = TokenBucket.full(rate, float(burst), 0.0), 0.0, 0
    for gap in gaps:
        now += gap
        if bucket.take(now) == 0.0:
            taken += 1
        assert taken <= burst + rate * now + 1e-6
