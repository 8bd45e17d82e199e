"""Watching the model repository: what changed since the last look, once it has stopped changing.

A scan takes a fingerprint of every model directory: its ``config.yaml`` and, per version
directory, the names, sizes and modification times of the files in it. A model is reported only
when two scans one poll interval apart agree on its fingerprint and it differs from what was last
reported. So a model that ``cp`` or ``rsync`` is still writing is never loaded half-copied: its
sizes or times move between the scans. The watcher only reports; the ModelManager applies.

Every method here blocks on the file system: the poller runs them in a thread, off the event loop.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, replace
from pathlib import Path

from tensorgate.config.model_config import ModelConfig
from tensorgate.names import is_valid_model_name, is_valid_version
from tensorgate.repository.scanner import CONFIG_FILE, TRITON_CONFIG_FILE, scan_model
from tensorgate.repository.source import ModelSource


@dataclass(frozen=True, slots=True)
class ModelPrint:
    """One model directory's fingerprint: its config file's and each version directory's."""

    config: str
    versions: tuple[tuple[int, str], ...]

    def revision(self, version: int) -> str:
        return dict(self.versions).get(version, "")


@dataclass(frozen=True, slots=True)
class ModelChange:
    """A model whose files changed and then held still for a poll interval; ``source`` None: removed."""

    name: str
    source: ModelSource | None


def _stat_text(path: Path) -> str:
    try:
        st = path.stat()
    except OSError:
        return ""
    return f"{st.st_size}:{st.st_mtime_ns}"


def _directory_digest(directory: Path) -> str:
    """The names, sizes and modification times of every file under ``directory`` (links not followed)."""
    digest = hashlib.blake2b(digest_size=16)
    for parent, dirs, files in os.walk(directory):
        dirs.sort()
        for name in sorted(files):
            path = Path(parent, name)
            digest.update(f"{path.relative_to(directory)}\0{_stat_text(path)}\n".encode(errors="replace"))
    return digest.hexdigest()


def fingerprint_model(model_dir: Path) -> ModelPrint:
    versions = []
    try:
        children = sorted(model_dir.iterdir())
    except OSError:
        children = []
    for child in children:
        if is_valid_version(child.name) and child.is_dir():
            versions.append((int(child.name), _directory_digest(child)))
    configs = _stat_text(model_dir / CONFIG_FILE) + "|" + _stat_text(model_dir / TRITON_CONFIG_FILE)
    return ModelPrint(configs, tuple(versions))


def fingerprint_repository(root: Path) -> dict[str, ModelPrint]:
    prints = {}
    for model_dir in sorted(root.iterdir()):
        if model_dir.is_dir() and not model_dir.name.startswith(".") and is_valid_model_name(model_dir.name):
            prints[model_dir.name] = fingerprint_model(model_dir)
    return prints


def with_revisions(source: ModelSource, fingerprint: ModelPrint) -> ModelSource:
    """The source with each version's revision taken from the fingerprint the decision was made on."""
    return replace(
        source,
        versions=tuple(replace(v, revision=fingerprint.revision(v.version)) for v in source.versions),
        on_disk=tuple(replace(v, revision=fingerprint.revision(v.version)) for v in source.on_disk),
    )


def scan_with_revisions(root: Path, name: str, override: ModelConfig | None = None) -> ModelSource:
    """One model scanned now, its versions carrying their current revisions (the repository API's load)."""
    model_dir = root / name
    return with_revisions(scan_model(root, model_dir, override), fingerprint_model(model_dir))


class RepositoryWatcher:
    """Compares each scan with the one before it and with what it last reported."""

    def __init__(self, root: Path, baseline: dict[str, ModelPrint]) -> None:
        self._root = root.resolve()
        self._previous = dict(baseline)  # the last scan
        self._reported = dict(baseline)  # what the server runs (or chose not to run: a failed change)

    def poll(self) -> list[ModelChange]:
        """The models that changed and have held still since the last poll, each reported once."""
        current = fingerprint_repository(self._root)
        changes = []
        for name in sorted(current.keys() | self._reported.keys()):
            now = current.get(name)
            if now != self._previous.get(name) or now == self._reported.get(name):
                continue  # still being written (or just appeared or went), or nothing new
            if now is None:
                changes.append(ModelChange(name, None))
                del self._reported[name]
            else:
                changes.append(ModelChange(name, with_revisions(scan_model(self._root, self._root / name), now)))
                self._reported[name] = now
        self._previous = current
        return changes
