"""The last minute of each model version, for the status page (``GET /v2/status``).

Prometheus figures are cumulative since the start; someone looking at the page wants what is
happening now. :class:`MinuteWindow` keeps one slot per second in a ring of ``window_s`` slots;
each slot counts the outcomes, latencies, batch sizes and generated tokens that ended in its
second, so reading the window sums at most ``window_s`` small slots and old seconds fall out by
being overwritten. It is pure: every call takes ``now``, a reading of the injected clock.

Latencies are counted in geometric buckets 5 % wide from 10 us (as the canary's step windows in
``models/rollout.py``): a P50 or P99 read from them is the upper edge of the bucket holding the
true one, so at most 5 % above it, in a handful of counters per second whatever the traffic.

:class:`WindowFeed` is the thin adapter the metric children call (``loop_metrics``' listeners):
it reads the clock and hands the figure to the window. Everything runs on the event loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tensorgate.clock import Clock

WINDOW_S = 60  # what "the last minute" means: latencies, batch sizes and errors
RATE_SPAN_S = 10  # requests/s and tokens/s: a shorter span, so the figure follows a change of load
_FLOOR_S = 1e-5
_RATIO = 1.05
_LOG_RATIO = math.log(_RATIO)
_NEVER = -(2**62)


def latency_bucket(seconds: float) -> int:
    """The index of the bucket that holds ``seconds``: bucket ``i`` ends at ``1e-5 * 1.05**i``."""
    if seconds <= _FLOOR_S:
        return 0
    index = math.ceil(math.log(seconds / _FLOOR_S) / _LOG_RATIO)
    return index if bucket_upper(index) >= seconds else index + 1  # rounding in the logarithm


def bucket_upper(index: int) -> float:
    return float(_FLOOR_S * _RATIO**index)


class _Slot:
    """What ended in one second of the clock."""

    __slots__ = ("batches", "latency", "outcomes", "second", "tokens")

    def __init__(self, second: int) -> None:
        self.second = second
        self.outcomes: dict[str, int] = {}
        self.latency: dict[int, int] = {}  # bucket index -> requests
        self.batches: dict[int, int] = {}  # rows -> batches
        self.tokens = 0


@dataclass(frozen=True, slots=True)
class WindowFigures:
    """One version's last minute, as the status document reports it."""

    window_s: float  # the time the figures cover: WINDOW_S, less while the version is younger
    requests: int  # requests that ended, by any outcome
    requests_per_s: float  # over the last RATE_SPAN_S
    outcomes: dict[str, int]  # outcome -> requests (success included)
    p50_ms: float | None  # None: no request ended in the window
    p99_ms: float | None
    batch_sizes: dict[int, int]  # rows -> batches executed
    tokens: int  # generated tokens (generative models)
    tokens_per_s: float  # over the last RATE_SPAN_S

    @property
    def errors(self) -> dict[str, int]:
        """The outcomes other than success."""
        return {name: n for name, n in self.outcomes.items() if name != "success"}


class MinuteWindow:
    """Outcomes, latencies, batch sizes and tokens of one version over the last ``window_s`` seconds."""

    def __init__(self, now: float, window_s: int = WINDOW_S, rate_span_s: int = RATE_SPAN_S) -> None:
        if not 1 <= rate_span_s <= window_s:
            raise ValueError("the rate span must be between 1 second and the window")
        self._created = now
        self._window_s = window_s
        self._rate_span_s = rate_span_s
        self._slots = [_Slot(_NEVER) for _ in range(window_s)]

    def _slot(self, now: float) -> _Slot:
        second = math.floor(now)
        slot = self._slots[second % self._window_s]
        if slot.second != second:  # the second this slot held has left the window: start it afresh
            slot = self._slots[second % self._window_s] = _Slot(second)
        return slot

    # -- what the metric children report ---------------------------------------------------------

    def outcome(self, name: str, now: float, count: int = 1) -> None:
        outcomes = self._slot(now).outcomes
        outcomes[name] = outcomes.get(name, 0) + count

    def latency(self, seconds: float, now: float) -> None:
        latency = self._slot(now).latency
        index = latency_bucket(seconds)
        latency[index] = latency.get(index, 0) + 1

    def batch(self, rows: int, now: float) -> None:
        batches = self._slot(now).batches
        batches[rows] = batches.get(rows, 0) + 1

    def tokens(self, count: int, now: float) -> None:
        self._slot(now).tokens += count

    # -- what the status page reads --------------------------------------------------------------

    def figures(self, now: float) -> WindowFigures:
        return combined_figures((self,), now)

    @property
    def created(self) -> float:
        return self._created

    def _covered(self, now: float, span_s: int) -> float:
        """The length of the last ``span_s`` whole seconds (the current one up to ``now``), less
        whatever lies before this window began."""
        start = math.floor(now) - span_s + 1
        return max(0.0, now - max(start, self._created))


def combined_figures(windows: Sequence[MinuteWindow], now: float) -> WindowFigures:
    """The figures of several windows of the same spans read as one (the status page's "others"
    row of tenants): counts add up, percentiles come from the merged buckets, and rates are over
    the span the oldest of them covers."""
    if not windows:
        raise ValueError("no window to read")
    current = math.floor(now)
    outcomes: dict[str, int] = {}
    latency: dict[int, int] = {}
    batches: dict[int, int] = {}
    tokens = recent_requests = recent_tokens = 0
    oldest = min(windows, key=lambda w: w.created)
    window_s, rate_span_s = oldest._window_s, oldest._rate_span_s
    for window in windows:
        if (window._window_s, window._rate_span_s) != (window_s, rate_span_s):
            raise ValueError("windows read as one must have the same spans")
        for slot in window._slots:
            age = current - slot.second
            if not 0 <= age < window_s:
                continue
            recent = age < rate_span_s
            for name, n in slot.outcomes.items():
                outcomes[name] = outcomes.get(name, 0) + n
                if recent:
                    recent_requests += n
            for index, n in slot.latency.items():
                latency[index] = latency.get(index, 0) + n
            for rows, n in slot.batches.items():
                batches[rows] = batches.get(rows, 0) + n
            tokens += slot.tokens
            if recent:
                recent_tokens += slot.tokens
    rate_s = oldest._covered(now, rate_span_s)
    return WindowFigures(
        window_s=round(oldest._covered(now, window_s), 3),
        requests=sum(outcomes.values()),
        requests_per_s=round(recent_requests / max(rate_s, 1.0), 3),
        outcomes=dict(sorted(outcomes.items())),
        p50_ms=_percentile_ms(latency, 0.50),
        p99_ms=_percentile_ms(latency, 0.99),
        batch_sizes=dict(sorted(batches.items())),
        tokens=tokens,
        tokens_per_s=round(recent_tokens / max(rate_s, 1.0), 3),
    )


def _percentile_ms(latency: dict[int, int], quantile: float) -> float | None:
    """The nearest-rank percentile, as the upper edge of its bucket, in milliseconds."""
    total = sum(latency.values())
    if total == 0:
        return None
    rank = max(1, math.ceil(quantile * total))
    seen = 0
    for index in sorted(latency):
        seen += latency[index]
        if seen >= rank:
            return round(bucket_upper(index) * 1000, 3)
    raise AssertionError("unreachable: the ranks add up to the total")


class WindowFeed:
    """A version's window fed from its metric children: each call reads the clock once."""

    __slots__ = ("_clock", "window")

    def __init__(self, window: MinuteWindow, clock: Clock) -> None:
        self.window = window
        self._clock = clock

    def outcome_listener(self, name: str) -> Callable[[float], None]:
        window, clock = self.window, self._clock

        def counted(amount: float) -> None:
            window.outcome(name, clock.now(), int(amount))

        return counted

    def latency(self, seconds: float) -> None:
        self.window.latency(seconds, self._clock.now())

    def batch(self, rows: float) -> None:
        self.window.batch(int(rows), self._clock.now())

    def tokens(self, count: float) -> None:
        self.window.tokens(int(count), self._clock.now())


class StatusWindows:
    """Every version's window, by model and version; owned by the server's :class:`Metrics`."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._feeds: dict[tuple[str, str], WindowFeed] = {}

    def feed(self, model: str, version: str) -> WindowFeed:
        """The version's feed, made on first use; a version loaded again keeps its window."""
        key = (model, version)
        found = self._feeds.get(key)
        if found is None:
            found = self._feeds[key] = WindowFeed(MinuteWindow(self.clock.now()), self.clock)
        return found

    def figures(self, model: str, version: str) -> WindowFigures | None:
        """The version's last minute; None for a version that never had metric children bound."""
        found = self._feeds.get((model, version))
        return None if found is None else found.window.figures(self.clock.now())
