"""Request-level V2 parameters with a meaning in the core, read the same way on HTTP and gRPC."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tensorgate.errors import InvalidInput

# Inputs per request, on any protocol: bounded before any tensor is decoded.
MAX_INPUTS = 256


def priority_and_timeout(params: Mapping[str, Any]) -> tuple[int | None, float | None]:
    """Triton's schedule-policy parameters: ``priority`` (1 is highest) and ``timeout`` (µs)."""
    priority = params.get("priority")
    if priority is not None and (type(priority) is not int or priority < 0):
        raise InvalidInput("parameter 'priority' must be a non-negative integer (1 is the highest level)")
    timeout = params.get("timeout")
    if timeout is not None and (type(timeout) is not int or timeout < 0):
        raise InvalidInput("parameter 'timeout' must be a non-negative integer of microseconds")
    return priority, (None if not timeout else timeout / 1_000_000)
