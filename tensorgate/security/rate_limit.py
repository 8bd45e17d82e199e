"""Per-identity rate limits and in-flight caps, answered before a request is read.

A token bucket per identity: ``requests_per_s`` refill it, ``burst`` is its size. Pure arithmetic
over the times it is given, so tests drive it with an injected clock.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

from tensorgate.errors import RateLimited
from tensorgate.security.identity import Identity, Limits

# Buckets kept for this many identities at most (tokens name their subjects: unbounded); the one
# used longest ago goes first, and starts full if it comes back, as a new identity would.
MAX_TRACKED = 10_000


@dataclass(slots=True)
class TokenBucket:
    rate: float
    size: float
    tokens: float
    stamp: float

    @classmethod
    def full(cls, rate: float, size: float, now: float) -> TokenBucket:
        return cls(rate, size, size, now)

    def take(self, now: float) -> float:
        """Take one token: 0.0 when there was one, else the seconds until there will be."""
        self.tokens = min(self.size, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


@dataclass(slots=True)
class _State:
    limits: Limits
    bucket: TokenBucket | None
    inflight: int = 0


def _bucket(limits: Limits, now: float) -> TokenBucket | None:
    if limits.requests_per_s is None:
        return None
    size = float(limits.burst if limits.burst is not None else max(1.0, limits.requests_per_s))
    return TokenBucket.full(limits.requests_per_s, size, now)


class RateLimiter:
    def __init__(self) -> None:
        self._states: OrderedDict[str, _State] = OrderedDict()

    def admit(self, identity: Identity, now: float) -> None:
        """Count one request in, or raise RateLimited (429, RESOURCE_EXHAUSTED) with Retry-After.
        An admitted request must be ``release``d when it ends."""
        limits = identity.limits
        if limits.requests_per_s is None and limits.max_inflight is None:
            return
        state = self._state(identity.name, limits, now)
        if limits.max_inflight is not None and state.inflight >= limits.max_inflight:
            raise RateLimited(
                f"'{identity.name}' has {state.inflight} requests in flight, its limit", retry_after_s=1.0
            )
        if state.bucket is not None:
            wait = state.bucket.take(now)
            if wait > 0.0:
                raise RateLimited(
                    f"'{identity.name}' is over its rate of {limits.requests_per_s:g} requests/s",
                    retry_after_s=max(1.0, math.ceil(wait)),
                )
        state.inflight += 1

    def release(self, identity: Identity) -> None:
        state = self._states.get(identity.name)
        if state is not None and state.inflight > 0:
            state.inflight -= 1

    def _state(self, name: str, limits: Limits, now: float) -> _State:
        state = self._states.get(name)
        if state is None:
            state = self._states[name] = _State(limits, _bucket(limits, now))
            if len(self._states) > MAX_TRACKED:
                self._evict()
        else:
            self._states.move_to_end(name)
            if state.limits != limits:  # its key line changed: the new limits, from a full bucket
                state.limits, state.bucket = limits, _bucket(limits, now)
        return state

    def _evict(self) -> None:
        for name, state in self._states.items():
            if state.inflight == 0:
                del self._states[name]
                return
