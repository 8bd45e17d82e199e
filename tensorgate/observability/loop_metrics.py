"""Metric families updated from the event loop only, exported through a prometheus_client collector.

prometheus_client guards every value with a lock, because it cannot know which thread updates it:
about a microsecond per update, and a request makes several. The server's request metrics are only
ever updated on the event-loop thread (schedulers, protocol handlers and instance callbacks all run
there, and so does the ``/metrics`` scrape), so plain attributes are enough: an update is an
addition, a histogram observation a short scan of its bounds. ``collect`` builds the exposition at scrape time.

A counter or histogram child may have one ``listener``, told of every increment or observation:
the status page's last-minute window (``status_window``) is fed that way, from the same calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

Listener = Callable[[float], None]


class CounterChild:
    __slots__ = ("listener", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.listener: Listener | None = None

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount
        if self.listener is not None:
            self.listener(amount)


class GaugeChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = float(value)


class HistogramChild:
    __slots__ = ("bounds", "counts", "listener", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last slot is +Inf
        self.sum = 0.0
        self.listener: Listener | None = None

    def observe(self, value: float) -> None:
        # A scan from the smallest bucket, not a bisect: request durations land in the first few,
        # and compiled, the scan costs less than the call into ``bisect``.
        index = 0
        for bound in self.bounds:
            if value <= bound:
                break
            index += 1
        self.counts[index] += 1
        self.sum += value
        if self.listener is not None:
            self.listener(value)


class NullCounterChild(CounterChild):
    """A child of a family that records nothing (metrics off): the same type, so callers bind
    children once and call them directly either way. A listener still hears (the status page
    works without the metrics port)."""

    __slots__ = ()

    def inc(self, amount: float = 1.0) -> None:
        if self.listener is not None:
            self.listener(amount)


class NullGaugeChild(GaugeChild):
    __slots__ = ()

    def inc(self, amount: float = 1.0) -> None:
        pass

    def dec(self, amount: float = 1.0) -> None:
        pass

    def set(self, value: float) -> None:
        pass


class NullHistogramChild(HistogramChild):
    __slots__ = ()

    def observe(self, value: float) -> None:
        if self.listener is not None:
            self.listener(value)


Child = TypeVar("Child", CounterChild, GaugeChild, HistogramChild)


class _Family(Generic[Child]):
    """A metric family: its children by label values, each made on first use."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.children: dict[tuple[str, ...], Child] = {}
        self.recording = True  # False: children are the null kind (set before the first ``labels``)

    def labels(self, *values: str) -> Child:
        child = self.children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}")
            child = self.children[values] = self._new()
        return child

    def remove(self, *values: str) -> None:
        """Stop exporting the child with these label values (a series whose subject is gone)."""
        self.children.pop(values, None)

    def _new(self) -> Child:
        raise NotImplementedError

    def export(self) -> Any:
        raise NotImplementedError


Value = TypeVar("Value", CounterChild, GaugeChild)


class _ValueFamily(_Family[Value]):
    """A family whose children hold one number each (counters, gauges)."""

    exposition: type[CounterMetricFamily] | type[GaugeMetricFamily]

    def export(self) -> CounterMetricFamily | GaugeMetricFamily:
        family = self.exposition(self.name, self.documentation, labels=self.labelnames)
        for values, child in self.children.items():
            family.add_metric(values, child.value)
        return family


class Counter(_ValueFamily[CounterChild]):
    exposition = CounterMetricFamily

    def _new(self) -> CounterChild:
        return CounterChild() if self.recording else NullCounterChild()


class Gauge(_ValueFamily[GaugeChild]):
    exposition = GaugeMetricFamily

    def _new(self) -> GaugeChild:
        return GaugeChild() if self.recording else NullGaugeChild()


class Histogram(_Family[HistogramChild]):
    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]) -> None:
        super().__init__(name, documentation, labelnames)
        self.bounds = tuple(float(b) for b in buckets)

    def _new(self) -> HistogramChild:
        return HistogramChild(self.bounds) if self.recording else NullHistogramChild(self.bounds)

    def export(self) -> HistogramMetricFamily:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in self.children.items():
            cumulative = 0
            buckets = []
            for bound, count in zip((*self.bounds, float("inf")), child.counts, strict=True):
                cumulative += count
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
            family.add_metric(values, buckets, child.sum)
        return family


Family = TypeVar("Family", bound=_Family[Any])


class LoopCollector:
    """Registered on the server's registry; prometheus_client calls ``collect`` on every scrape."""

    def __init__(self) -> None:
        self.families: list[_Family[Any]] = []

    def add(self, family: Family) -> Family:
        self.families.append(family)
        return family

    def collect(self) -> Iterator[Any]:
        for family in self.families:
            yield family.export()
