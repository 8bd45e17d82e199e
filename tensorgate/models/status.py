"""The status document (``GET /v2/status``): the server's state on one page, as JSON.

The status page (``observability/status_page.html``) polls it every second, so building it is kept
cheap: it reads what the manager, the schedulers and the engines already hold, and each version's
last minute from its :class:`~tensorgate.observability.status_window.MinuteWindow` (a sum over 60
small slots). Nothing here waits, locks or changes state; it runs on the event loop.

Per model: its state, traffic (shares, canary rollout, shadow), memory residency, and per version
its state, instances (health, device), queue, the last minute's figures and, for generative
models, the engine's running and waiting sequences, KV cache use and tokens/s. Per tenant, once a
request names one: the busiest tenants' last minute across the models, and one row for the rest.
"""

from __future__ import annotations

from collections.abc import Set
from typing import Any

from tensorgate.clock import Clock
from tensorgate.models.entry import ModelEntry
from tensorgate.models.generative import GenerativeVersion
from tensorgate.models.servable import Servable, VersionState, VersionStatus
from tensorgate.models.service import SERVER_VERSION, InferenceService
from tensorgate.observability.status_window import RATE_SPAN_S, WINDOW_S, StatusWindows, WindowFigures
from tensorgate.observability.tenant_window import SHOWN, TenantRow, TenantWindows

_LOADING = frozenset({VersionState.LOADING, VersionState.WARMING})


class StatusReport:
    """Builds the status document from the service's state; made once with the HTTP app.

    ``windows``: the server's last-minute windows (``Metrics.status``); None reads each loaded
    version's through its metric children (the same object), leaving draining versions without.
    ``tenants``: the server's per-tenant windows (``Metrics.tenants``); None: no tenants section.
    """

    def __init__(
        self,
        service: InferenceService,
        clock: Clock,
        windows: StatusWindows | None = None,
        *,
        replica: str = "",
        tenants: TenantWindows | None = None,
    ) -> None:
        self._service = service
        self._clock = clock
        self._windows = windows
        self._tenants = tenants
        self._replica = replica
        self._started = clock.now()
        self._sequence = 0

    def document(self, models: Set[str] | None = None) -> dict[str, Any]:
        """The whole document; ``models``: the only models the caller may see (None: every one)."""
        service = self._service
        manager = service.manager
        self._sequence += 1
        rows = [
            self._model(name, entry)
            for name, entry in sorted(manager.models.items())
            if models is None or name in models
        ]
        memory = manager.memory
        return {
            "server": {
                "name": service.name,
                "version": SERVER_VERSION,
                "replica": self._replica,
                "live": service.live(),
                "ready": service.ready(),
                "starting": manager.starting or not service.started,
                "draining": service.draining,
                "uptime_s": round(self._clock.now() - self._started, 3),
                "sequence": self._sequence,  # one more on every document: the page shows it is live
                "window_s": WINDOW_S,
                "rate_span_s": RATE_SPAN_S,
                "models": len(rows),
                "models_ready": sum(1 for row in rows if row["state"] == "READY"),
                "requests_per_s": round(sum(row["requests_per_s"] for row in rows), 3),
                "memory": (
                    {
                        "budget_bytes": memory.budget_bytes,
                        "resident_bytes": sum(e.residence.held_bytes for e in manager.models.values()),
                    }
                    if memory.enabled
                    else None
                ),
            },
            "models": rows,
            # Across the models, so shown only to a caller who may see every model.
            "tenants": self._tenant_rows() if models is None else None,
        }

    def _tenant_rows(self) -> dict[str, Any] | None:
        """The busiest tenants of the last minute and one row for the rest; None until a request
        names a tenant (or without the server's tenant windows)."""
        if self._tenants is None or not self._tenants.active:
            return None
        rows = self._tenants.rows(SHOWN)
        named = [_tenant(row) for row in rows if row.name is not None]
        others = next((_tenant(row) for row in rows if row.name is None), None)
        return {"shown": SHOWN, "rows": named, "others": others}

    # -- one model -------------------------------------------------------------------------------

    def _model(self, name: str, entry: ModelEntry) -> dict[str, Any]:
        traffic = self._traffic(entry)
        shares: dict[str, float] = traffic["shares"]
        roles = _roles(traffic)
        numbers = sorted(set(entry.statuses) | set(entry.versions))
        versions = [
            self._version(
                name,
                number,
                entry.versions.get(number),
                entry.statuses.get(number),
                shares.get(str(number), 0.0),
                roles.get(number, ""),
            )
            for number in numbers
        ]
        state, reason = _model_state(entry, versions)
        memory = self._service.manager.memory
        return {
            "name": name,
            "state": state,
            "reason": reason,
            "backend": entry.source.backend,
            "platform": next((v["platform"] for v in versions if v["platform"]), ""),
            "generative": any(v["generation"] is not None for v in versions),
            "requests_per_s": round(sum(v["window"]["requests_per_s"] for v in versions if v["window"]), 3),
            "traffic": traffic,
            "residency": memory.status(entry) if memory.enabled else None,
            "versions": versions,
        }

    def _traffic(self, entry: ModelEntry) -> dict[str, Any]:
        if entry.traffic is not None:
            return entry.traffic.status()
        latest = entry.latest_ready()  # no split: requests that name no version go to the latest ready
        return {
            "shares": {} if latest is None else {str(latest.version): 100.0},
            "sticky_header": None,
            "rollout": None,
            "shadow": None,
        }

    # -- one version -----------------------------------------------------------------------------

    def _version(
        self,
        name: str,
        number: int,
        loaded: Servable | None,
        status: VersionStatus | None,
        share: float,
        role: str,
    ) -> dict[str, Any]:
        state = status.state if status is not None else (loaded.state if loaded is not None else VersionState.UNLOADED)
        reason = status.reason if status is not None else ""
        ready = loaded is not None and loaded.ready
        if state is VersionState.READY and loaded is not None and not ready:
            reason = reason or "no instance in rotation"
        windows = self._windows
        if windows is None and loaded is not None:
            windows = loaded.metrics.metrics.status
        figures = None if windows is None else windows.figures(name, str(number))
        return {
            "version": str(number),
            "state": state.value,
            "reason": reason,
            "ready": ready,
            "role": role,  # "canary", "stable" (of a rollout), "shadow", or ""
            "share": round(share, 3),  # percent of the requests that name no version
            "platform": "" if loaded is None else loaded.platform,
            "instances": [] if loaded is None else _instances(loaded),
            "queue": None if loaded is None else _queue(loaded),
            "window": None if figures is None else _window(figures),
            "generation": None if loaded is None else _generation(loaded, figures),
        }


def _roles(traffic: dict[str, Any]) -> dict[int, str]:
    roles: dict[int, str] = {}
    rollout = traffic.get("rollout")
    if isinstance(rollout, dict):
        roles[int(rollout["stable"])] = "stable"
        roles[int(rollout["canary"])] = "canary"
    shadow = traffic.get("shadow")
    if isinstance(shadow, dict):
        roles[int(shadow["version"])] = "shadow"
    return roles


def _model_state(entry: ModelEntry, versions: list[dict[str, Any]]) -> tuple[str, str]:
    """One word for the model: READY (a version serves), LOADING, NOT_RESIDENT (on demand, loads on
    its first request), FAILED, UNLOADED or UNAVAILABLE; with the reason where one is known."""
    if any(v["ready"] for v in versions):
        return "READY", ""
    if any(VersionState(v["state"]) in _LOADING for v in versions) or entry.residence.cold_load is not None:
        return "LOADING", ""
    if entry.problem and entry.problem != "unloaded":
        return "FAILED", entry.problem
    failed = [f"version {v['version']}: {v['reason']}" for v in versions if v["state"] == VersionState.FAILED.value]
    if failed:
        return "FAILED", "; ".join(failed)
    if entry.residence.on_demand and not entry.problem:
        return "NOT_RESIDENT", "loads on its first request"
    if entry.problem == "unloaded":
        return "UNLOADED", "unloaded"
    reasons = "; ".join(v["reason"] for v in versions if v["reason"])
    return "UNAVAILABLE", reasons or "no version ready"


def _instances(version: Servable) -> list[dict[str, Any]]:
    return [
        {
            "name": view.name,
            "device": str(view.device),
            "health": view.health,
            "busy": view.busy,
            "pid": view.pid,
            "last_error": view.last_error,
        }
        for view in version.instances()
    ]


def _queue(version: Servable) -> dict[str, Any]:
    return {
        "queued": version.queued,
        "running": version.running,  # batches on instances now (a generative model's: sequences)
        "max_queue_size": version.queue_settings.max_queue_size,
    }


def _window(figures: WindowFigures) -> dict[str, Any]:
    return {
        "window_s": figures.window_s,
        "requests": figures.requests,
        "requests_per_s": figures.requests_per_s,
        "p50_ms": figures.p50_ms,
        "p99_ms": figures.p99_ms,
        "outcomes": figures.outcomes,
        "errors": figures.errors,
        "batch_sizes": {str(rows): n for rows, n in figures.batch_sizes.items()},
        "tokens": figures.tokens,
        "tokens_per_s": figures.tokens_per_s,
    }


def _tenant(row: TenantRow) -> dict[str, Any]:
    figures = row.figures
    outcomes = figures.outcomes
    answered = outcomes.get("success", 0)
    refused = outcomes.get("queue_full", 0)  # its own max_queued, or its share of a full queue
    return {
        "name": row.name,  # None: the others; "": requests that name no tenant
        "tenants": row.tenants,
        "requests": figures.requests,
        "requests_per_s": figures.requests_per_s,
        "answered": answered,
        "refused": refused,
        "deadline_refused": outcomes.get("deadline_refused", 0),
        "errors": figures.requests - answered - refused - outcomes.get("deadline_refused", 0),
        "p50_ms": figures.p50_ms,
        "p99_ms": figures.p99_ms,
        "outcomes": outcomes,
    }


def _generation(version: Servable, figures: WindowFigures | None) -> dict[str, Any] | None:
    """The continuous-batching engine's state, for a generative version (None for the others).
    Read without a lock from the engine's thread's counters: a figure a step old is fine here."""
    if not isinstance(version, GenerativeVersion):
        return None
    scheduler = version.engine.scheduler
    kv = scheduler.kv
    return {
        "running": scheduler.num_running,
        "waiting": scheduler.num_waiting,
        "kv_cache_usage": round(kv.usage, 4),
        "kv_blocks_used": kv.used_blocks,
        "kv_blocks_total": kv.total_blocks,
        "tokens_per_s": 0.0 if figures is None else figures.tokens_per_s,
    }
