"""W3C trace context read on the request path (compiled: it runs for every request when tracing
is configured with sampling off)."""

from __future__ import annotations

# "00-" + 32 hex trace id + "-" + 16 hex parent id + "-" + 2 hex flags
_FLAGS = slice(53, 55)


def sampled(traceparent: str | None) -> bool:
    """Whether a ``traceparent`` (``00-<trace id>-<parent id>-<flags>``) carries the sampled flag."""
    if traceparent is None or len(traceparent) < 55:
        return False
    try:
        return bool(int(traceparent[_FLAGS], 16) & 1)
    except ValueError:
        return False
