"""Model control modes, as Triton names them, and the repository API they open.

- ``none``: the repository as it was at startup.
- ``poll``: a task rescans the repository every ``poll_s`` and hands each change to the manager
  (scanning runs in a thread, so no poll ever holds up the event loop or a request).
- ``explicit``: the repository API (index, load, unload) changes what serves; it needs an admin key
  (the protocols' gate asks for one: :mod:`tensorgate.security.gate`).
  In poll mode the API's index (which changes nothing) answers too, to an admin key.

The API never takes a path, a URL or a file from the request: it loads only what the repository
holds, with an optional configuration override given as JSON.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Literal

import orjson

from tensorgate.config.loading import validate
from tensorgate.config.model_config import ModelConfig
from tensorgate.errors import ConfigError, InvalidInput, ModelLoadError, NotFound, PermissionDenied
from tensorgate.models.manager import ModelManager
from tensorgate.models.servable import VersionState
from tensorgate.names import check_model_name, is_valid_model_name
from tensorgate.repository.watcher import ModelChange, ModelPrint, RepositoryWatcher, scan_with_revisions

log = logging.getLogger(__name__)

ControlMode = Literal["none", "poll", "explicit"]


def _model_names(root: Path) -> list[str]:
    return sorted(
        d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith(".") and is_valid_model_name(d.name)
    )


class RepositoryControl:
    """Owns the poll task (``start`` / ``aclose``) and answers the repository API."""

    def __init__(
        self,
        manager: ModelManager,
        mode: ControlMode,
        root: Path | None,
        *,
        poll_s: float = 5.0,
        pinned: frozenset[str] = frozenset(),
    ) -> None:
        self._manager = manager
        self.mode = mode
        self._root = root.resolve() if root is not None else None
        self._poll_s = poll_s
        self._pinned = pinned  # models from the config file's ``models:`` list: never the repository's
        self._task: asyncio.Task[None] | None = None
        self._watcher: RepositoryWatcher | None = None

    # -- poll mode -------------------------------------------------------------------------------

    def start(self, baseline: dict[str, ModelPrint]) -> None:
        """Start polling from the fingerprints the startup scan was made with."""
        if self.mode != "poll" or self._root is None:
            return
        self._watcher = RepositoryWatcher(self._root, baseline)
        self._task = asyncio.get_running_loop().create_task(self._poll_loop())
        log.info("polling the model repository every %g s", self._poll_s)

    async def _poll_loop(self) -> None:
        assert self._watcher is not None
        while True:
            await asyncio.sleep(self._poll_s)
            try:
                changes = await asyncio.to_thread(self._watcher.poll)
            except Exception:  # a repository that cannot be read this time: log, and look again later
                log.exception("scanning the model repository failed")
                continue
            await asyncio.gather(*(self._apply(change) for change in changes))

    async def _apply(self, change: ModelChange) -> None:
        if change.name in self._pinned:
            log.error("model %s is in the repository and in the config file's models list; ignored", change.name)
            return
        try:
            if change.source is None:
                log.info("model %s left the repository: unloading it", change.name)
                await self._manager.unload(change.name, forget=True)
            else:
                log.info("model %s changed in the repository: applying it", change.name)
                await self._manager.apply(change.source)
        except ModelLoadError:
            pass  # the manager logged it; what served keeps serving
        except Exception:  # the poll loop's boundary: one model's change must not stop the polling
            log.exception("applying the change to model %s failed", change.name)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    # -- the repository API (explicit mode) ------------------------------------------------------

    def authorize(self, *, changes: bool) -> None:
        """Before anything of a repository API request is read, and after the protocol's gate took
        an admin credential. Load and unload (``changes``) need explicit mode; the index, which
        changes nothing, is also open in poll mode."""
        allowed = ("explicit",) if changes else ("explicit", "poll")
        if self.mode not in allowed:
            needed = "explicit" if changes else "poll or explicit"
            raise PermissionDenied(
                f"the model repository API is disabled on this server (model control mode '{self.mode}'; "
                f"this call needs {needed})"
            )

    async def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """Every model in the repository or loaded, each version with its state and any failure's reason."""
        on_disk = await asyncio.to_thread(_model_names, self._root) if self._root is not None else []
        rows: list[dict[str, Any]] = []
        memory = self._manager.memory
        residency = memory.enabled  # with a memory budget or on-demand models, each row shows its model's
        for name in sorted(set(on_disk) | set(self._manager.models)):
            entry = self._manager.models.get(name)
            extra = {"residency": memory.status(entry)} if residency and entry is not None else {}
            if entry is not None and not entry.statuses and entry.residence.on_demand and not entry.problem:
                reason = "not resident: loads on its first request"
                rows.append({"name": name, "version": "", "state": "UNLOADED", "reason": reason, **extra})
                continue
            if entry is None or not entry.statuses:
                reason = "not loaded" if entry is None else (entry.problem or "unloaded")
                rows.append({"name": name, "version": "", "state": "UNAVAILABLE", "reason": reason, **extra})
                continue
            for version, status in sorted(entry.statuses.items()):
                rows.append(
                    {
                        "name": name,
                        "version": str(version),
                        "state": status.state.value,
                        "reason": status.reason,
                        **extra,
                    }
                )
        return [r for r in rows if r["state"] == VersionState.READY.value] if ready_only else rows

    async def load(self, name: str, config_json: str | None = None) -> None:
        """Load (or reload) a model from the repository; returns once it is READY."""
        check_model_name(name)
        root = self._model_root(name)
        override = None
        if config_json is not None:
            try:
                override = validate(ModelConfig, orjson.loads(config_json), "the load request's config")
            except orjson.JSONDecodeError as exc:
                raise InvalidInput(f"the load request's config is not valid JSON: {exc}") from None
            except ConfigError as exc:
                raise InvalidInput(str(exc)) from None
        source = await asyncio.to_thread(scan_with_revisions, root, name, override)
        try:
            await self._manager.apply(source, retry_failed=True)
        except ModelLoadError as exc:
            raise InvalidInput(f"failed to load model '{name}': {exc}") from None

    async def unload(self, name: str) -> None:
        """Drain and unload every version of a model; returns once they are unloaded."""
        check_model_name(name)
        if name not in self._manager.models:
            self._model_root(name)  # 404 for a model the repository does not hold
            return
        await self._manager.unload(name)

    def _model_root(self, name: str) -> Path:
        if name in self._pinned:
            raise InvalidInput(f"model '{name}' comes from the config file's models list, not the repository")
        root = self._root
        if root is None or not (root / name).is_dir():
            raise NotFound(f"model '{name}' is not in the model repository")
        return root
