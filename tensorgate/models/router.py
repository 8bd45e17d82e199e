"""Routing: a model name and an optional version -> the one loaded version that serves a request.

A version named in the request always wins. Otherwise a model with a traffic split (weights, or a
canary's step) picks among its READY versions by the split, the sticky key's point or a random one;
a model without one, or whose split names no READY version, gets its latest READY version (never a
shadow, which only receives copies). Pure functions of the manager's entries: the service calls
them once per request (:class:`~tensorgate.models.target.Target`).
"""

from __future__ import annotations

from tensorgate.errors import NotFound, Unavailable
from tensorgate.models.entry import ModelEntry
from tensorgate.models.manager import ModelManager
from tensorgate.models.servable import Servable
from tensorgate.models.traffic import TrafficState, pick
from tensorgate.names import check_model_name


def find_entry(manager: ModelManager, name: str) -> ModelEntry:
    """The model of that name: 400 for a name that could never exist, 404 for an unknown one, 503
    while the startup scan has not named every model yet."""
    entry = manager.models.get(name)
    if entry is None:
        check_model_name(name)
        if manager.starting:
            raise Unavailable("the server is starting: its models are not known yet", retry_after_s=1.0)
        raise NotFound(f"Request for unknown model: '{name}' is not found")
    return entry


def check_version(entry: ModelEntry, name: str, version: int | None) -> None:
    """404 for a version the model does not have (loaded, loading, failed, or on disk for an
    on-demand model that is not loaded): answered before any of a request's body is read."""
    if version is None or version in entry.versions or version in entry.statuses:
        return
    if entry.residence.on_demand and any(v.version == version for v in entry.source.versions):
        return
    raise NotFound(f"Request for unknown model: '{name}' version {version} is not found")


def loaded(entry: ModelEntry, name: str, version: int | None) -> Servable:
    """A loaded version for metadata and statistics (ready or not)."""
    if version is not None:
        return _explicit(entry, name, version)
    latest = entry.latest_ready()
    if latest is not None:
        return latest
    if entry.versions:
        return entry.versions[max(entry.versions)]
    reason = entry.problem or "; ".join(s.reason for s in entry.statuses.values() if s.reason)
    raise Unavailable(f"model '{name}' has no loaded version" + (f": {reason}" if reason else ""))


def route(entry: ModelEntry, name: str, version: int | None, traffic_key: str | None = None) -> Servable:
    """The version that takes a request: the one asked for, or the traffic split's choice."""
    if version is not None:
        return _explicit(entry, name, version)
    traffic = entry.traffic
    chosen = entry.latest_ready() if traffic is None else _by_traffic(entry, traffic, traffic_key)
    if chosen is None:
        if entry.versions:  # loaded but out of rotation (every instance down): counted on the newest
            entry.versions[max(entry.versions)].metrics.outcome("unavailable")
        raise Unavailable(
            f"Request for unknown model: '{name}' has no available versions" + _why(entry), retry_after_s=1.0
        )
    return chosen


def _why(entry: ModelEntry) -> str:
    """Why nothing serves, when loading is what failed (the same reasons the index shows)."""
    if entry.versions:
        return ""
    reason = entry.problem or "; ".join(f"version {v}: {s.reason}" for v, s in entry.statuses.items() if s.reason)
    return f" ({reason})" if reason and reason != "unloaded" else ""


def _by_traffic(entry: ModelEntry, traffic: TrafficState, key: str | None) -> Servable | None:
    candidates = []
    for number, weight in traffic.shares():
        found = entry.versions.get(number)
        if weight > 0 and found is not None and found.ready:
            candidates.append((number, weight))
    if candidates:
        return entry.versions[pick(candidates, traffic.point(key))]
    best: Servable | None = None  # no split, or none of its versions is ready
    for found in entry.versions.values():
        if found.ready and found.version not in traffic.excluded and (best is None or found.version > best.version):
            best = found
    return best


def _explicit(entry: ModelEntry, name: str, version: int) -> Servable:
    """A version the client named: loaded, or 503 while it loads or after it failed, or 404."""
    found = entry.versions.get(version)
    if found is not None:
        return found
    if version in entry.statuses:
        state = entry.statuses[version].state.value
        message = f"Request for unknown model: '{name}' version {version} is not at ready state ({state})"
        raise Unavailable(message, retry_after_s=1.0)
    raise NotFound(f"Request for unknown model: '{name}' version {version} is not found")
