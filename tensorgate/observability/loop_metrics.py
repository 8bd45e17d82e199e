"""Metric families updated from the event loop only, exported through a prometheus_client collector.

prometheus_client guards every value with a lock, because it cannot know which thread updates it:
about a microsecond per update, and a request makes several. The server's request metrics are only
ever updated on the event-loop thread (schedulers, protocol handlers and instance callbacks all run
there, and so does the ``/metrics`` scrape), so plain attributes are enough: an update is an
addition, a histogram observation a bisect. ``collect`` builds the exposition at scrape time.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily


class CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


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
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last slot is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


class _Family:
    kind = ""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.children: dict[tuple[str, ...], Any] = {}

    def labels(self, *values: str) -> Any:
        child = self.children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}")
            child = self.children[values] = self._new()
        return child

    def _new(self) -> Any:
        raise NotImplementedError

    def export(self) -> Any:
        raise NotImplementedError


class _ValueFamily(_Family):
    """A family whose children hold one number each (counters, gauges)."""

    exposition: type[CounterMetricFamily] | type[GaugeMetricFamily]

    def export(self) -> CounterMetricFamily | GaugeMetricFamily:
        family = self.exposition(self.name, self.documentation, labels=self.labelnames)
        for values, child in self.children.items():
            family.add_metric(values, child.value)
        return family


class Counter(_ValueFamily):
    exposition = CounterMetricFamily

    def _new(self) -> CounterChild:
        return CounterChild()


class Gauge(_ValueFamily):
    exposition = GaugeMetricFamily

    def _new(self) -> GaugeChild:
        return GaugeChild()


class Histogram(_Family):
    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]) -> None:
        super().__init__(name, documentation, labelnames)
        self.bounds = tuple(float(b) for b in buckets)

    def _new(self) -> HistogramChild:
        return HistogramChild(self.bounds)

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


class LoopCollector:
    """Registered on the server's registry; prometheus_client calls ``collect`` on every scrape."""

    def __init__(self) -> None:
        self.families: list[_Family] = []

    def add(self, family: _Family) -> Any:
        self.families.append(family)
        return family

    def collect(self) -> Iterator[Any]:
        for family in self.families:
            yield family.export()
