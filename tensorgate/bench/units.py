"""Reading and writing durations the way operators type them (``-z 5s``) and read them (``1.23 ms``)."""

from __future__ import annotations

import math
import re

_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(us|ms|s|m|h)?\s*")
_SCALE = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    """``5s``, ``500ms``, ``2m`` or a bare number of seconds (hey's ``-z`` form), as seconds."""
    match = _DURATION.fullmatch(text)
    if match is None:
        raise ValueError(f"cannot read duration {text!r}: write e.g. 5s, 500ms or 2m")
    value, unit = match.groups()
    return float(value) * _SCALE[unit]


def format_ms(seconds: float) -> str:
    """Seconds as milliseconds with three decimals; ``-`` when there is no value."""
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.3f}"
