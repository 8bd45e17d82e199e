"""Per-tenant figures: the status page's tenants table and ``tensorgate_tenant_requests_total``.

A tenant's name may come from a request header (``server.tenant_header``, when authentication is
off), so nothing kept per tenant may grow with the names clients send:

- Windows: at most :data:`MAX_TRACKED` tenants have a last-minute window of their own
  (:class:`~tensorgate.observability.status_window.MinuteWindow`); the requests of any other
  share one window, the "others". A tenant with nothing in its window for a minute is forgotten,
  which makes room for the next.
- Metric labels: the tenants named in ``server.tenants`` and the shared tenant (``-``) have their
  own label; a tenant not named there gets one once it has ended :data:`LABEL_AFTER` requests while
  tracked (the busy ones, not every name tried once), until :data:`MAX_LABELLED` such labels are
  given; everything else counts under ``other``. A label once given stays, so each series only
  ever grows, as a counter must.

Nothing is recorded until a request names a tenant (:attr:`TenantWindows.active`): a server whose
clients name none pays one identity check per request. Updated on the event loop only, like the
metric families it feeds (``loop_metrics``); every reading of time comes from the injected clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tensorgate.clock import Clock
from tensorgate.observability.loop_metrics import Counter, CounterChild
from tensorgate.observability.status_window import WINDOW_S, MinuteWindow, WindowFigures, combined_figures

MAX_TRACKED = 32  # tenants with a window of their own at once
MAX_LABELLED = 16  # tenants not named in server.tenants that may get a metric label of their own
LABEL_AFTER = 100  # requests a tracked tenant ends before it gets its own label
SHOWN = 8  # tenants the status page lists by name, busiest first; the rest make one row
OTHER_LABEL = "other"
SHARED_LABEL = "-"  # the shared tenant (a request that names none), as the refused-requests metric shows no caller
_RESERVED = frozenset({"", OTHER_LABEL, SHARED_LABEL})  # tenant names that never get a label of their own


class _Tracked:
    """One tenant with a window of its own (or the shared "others" window)."""

    __slots__ = ("children", "ended", "label", "last_used", "window")

    def __init__(self, window: MinuteWindow, label: str, children: dict[str, CounterChild]) -> None:
        self.window = window
        self.label = label  # its label in the metric
        self.children = children  # outcome -> that label's child
        self.ended = 0
        self.last_used = window.created


@dataclass(frozen=True, slots=True)
class TenantRow:
    """One row of the tenants table: a tenant, or (``name`` None) every tenant not shown by name."""

    name: str | None
    tenants: int  # tenants the row covers among those tracked (the others' row may hold more)
    figures: WindowFigures


class TenantWindows:
    """Every tenant's last minute and request counter; owned by the server's ``Metrics``."""

    def __init__(self, clock: Clock, family: Counter) -> None:
        self._clock = clock
        self._family = family  # tensorgate_tenant_requests: tenant, outcome
        self._labels: dict[str, dict[str, CounterChild]] = {}  # label -> outcome -> child
        self._named: set[str] = set()  # tenants with a label of their own
        self._given = 0  # labels given to tenants not named in the config
        self._tracked: dict[str, _Tracked] = {}
        self._others = _Tracked(MinuteWindow(clock.now()), OTHER_LABEL, self._children(OTHER_LABEL))
        self._pruned_second = -1
        self.active = False  # True once a request named a tenant: the shared one is recorded from then on

    def configure(self, names: Iterable[str]) -> None:
        """The tenants of ``server.tenants``: each has its own metric label from the start."""
        for name in names:
            if name in _RESERVED:
                continue
            self._named.add(name)
            tracked = self._tracked.get(name)
            if tracked is not None:
                self._relabel(tracked, name)

    def ended(self, name: str, outcome: str, seconds: float | None) -> None:
        """A request of tenant ``name`` ended with ``outcome`` after ``seconds`` in the scheduler
        (None: refused at admission). Called by the schedulers, on the event loop."""
        now = self._clock.now()
        tracked = self._tracked.get(name)
        if tracked is None:
            self.active = True
            tracked = self._track(name, now)
        window = tracked.window
        window.outcome(outcome, now)
        if seconds is not None:
            window.latency(seconds, now)
        tracked.last_used = now
        tracked.ended += 1
        child = tracked.children.get(outcome)
        if child is None:
            child = tracked.children[outcome] = self._family.labels(tracked.label, outcome)
        child.inc()
        if tracked.ended == LABEL_AFTER and tracked.label == OTHER_LABEL and tracked is not self._others:
            self._promote(name, tracked)

    def _track(self, name: str, now: float) -> _Tracked:
        """Give ``name`` a window of its own if there is room (forgetting the idle first), else the others'."""
        if len(self._tracked) >= MAX_TRACKED:
            second = int(now)
            if second == self._pruned_second:  # a flood of new names: look for idle ones once a second
                return self._others
            self._pruned_second = second
            self._prune(now)
            if len(self._tracked) >= MAX_TRACKED:
                return self._others
        if name == "":
            label = SHARED_LABEL
        elif name in self._named:
            label = name
        else:
            label = OTHER_LABEL
        tracked = self._tracked[name] = _Tracked(MinuteWindow(now), label, self._children(label))
        return tracked

    def _promote(self, name: str, tracked: _Tracked) -> None:
        if self._given < MAX_LABELLED and name not in _RESERVED:
            self._given += 1
            self._named.add(name)
            self._relabel(tracked, name)

    def _relabel(self, tracked: _Tracked, label: str) -> None:
        tracked.label = label
        tracked.children = self._children(label)

    def _children(self, label: str) -> dict[str, CounterChild]:
        found = self._labels.get(label)
        if found is None:
            found = self._labels[label] = {}
        return found

    def _prune(self, now: float) -> None:
        """Forget the tenants whose windows hold nothing any longer."""
        idle = [name for name, tracked in self._tracked.items() if now - tracked.last_used >= WINDOW_S]
        for name in idle:
            del self._tracked[name]

    # -- what the status page reads --------------------------------------------------------------

    def rows(self, shown: int = SHOWN) -> list[TenantRow]:
        """The ``shown`` busiest tenants of the last minute (by requests ended, then name) and, when
        there are more or requests were counted without a window of their own, one row for the rest.
        Empty until a request names a tenant."""
        if not self.active:
            return []
        now = self._clock.now()
        self._prune(now)
        read = [(name, tracked.window.figures(now)) for name, tracked in self._tracked.items()]
        read = [(name, figures) for name, figures in read if figures.requests]
        read.sort(key=lambda pair: (-pair[1].requests, pair[0]))
        rows = [TenantRow(name, 1, figures) for name, figures in read[:shown]]
        rest = [self._tracked[name].window for name, _ in read[shown:]]
        others = combined_figures([self._others.window, *rest], now)
        if others.requests:
            rows.append(TenantRow(None, len(rest), others))
        return rows
