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


@dataclass(frozen=True, slots=True)
class ModelSource:
    name: str
    backend: str
    config: ModelConfig
    versions: tuple[VersionSource, ...]
    # The single-file form's ``input_shape``: one request's shape, checked against the model at load.
    request_input_shape: tuple[int, ...] | None = None
    device_id: int | None = None
    problems: tuple[str, ...] = field(default=())
