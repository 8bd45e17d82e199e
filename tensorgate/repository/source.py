"""What the repository says about one model: its configuration and where each version lives."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tensorgate.config.model_config import ModelConfig


@dataclass(frozen=True, slots=True)
class VersionSource:
    version: int
    artifact: Path  # model.onnx, model.py, or the directory of a language model
    directory: Path
    # A digest of the version directory's files (names, sizes, modification times) when the
    # repository is watched: a loaded version whose files change is loaded again. "" when unwatched.
    revision: str = ""


@dataclass(frozen=True, slots=True)
class ModelSource:
    name: str
    backend: str
    config: ModelConfig
    versions: tuple[VersionSource, ...]  # the versions to serve: the version policy's and traffic's choice
    # The single-file form's ``input_shape``: one request's shape, checked against the model at load.
    request_input_shape: tuple[int, ...] | None = None
    device_id: int | None = None
    problems: tuple[str, ...] = field(default=())
    # Every version directory that holds a model, served or not (a canary's promotion or rollback
    # changes which of them are served without a new scan).
    on_disk: tuple[VersionSource, ...] = field(default=())
