"""Models named one by one in the single-file server config (``models:`` with ``model_path``)."""

from __future__ import annotations

from pathlib import Path

from tensorgate.config.model_config import InstanceGroup, ModelConfig, VersionPolicy
from tensorgate.config.server_config import FlatModelEntry
from tensorgate.errors import ConfigError
from tensorgate.names import is_valid_model_name
from tensorgate.repository.source import ModelSource, VersionSource

_BACKEND_BY_SUFFIX = {".onnx": "onnxruntime", ".py": "python", ".pt": "torch", ".pt2": "torch", ".om": "om"}


def from_flat_entries(entries: list[FlatModelEntry], base_dir: Path, source: str) -> list[ModelSource]:
    """Group entries by name (several versions of one model may be listed) into model sources."""
    grouped: dict[str, list[FlatModelEntry]] = {}
    for index, entry in enumerate(entries):
        if not is_valid_model_name(entry.name):
            raise ConfigError(f"{source}: key 'models.{index}.name': {entry.name!r} is not a valid model name")
        grouped.setdefault(entry.name, []).append(entry)

    sources = []
    for name, group in grouped.items():
        first = group[0]
        versions = []
        for entry in group:
            path = entry.model_path if entry.model_path.is_absolute() else base_dir / entry.model_path
            versions.append(VersionSource(entry.version, path, path.parent))
        if len({v.version for v in versions}) != len(versions):
            raise ConfigError(f"{source}: key 'models': model {name!r} lists a version twice")
        backend = first.backend or _BACKEND_BY_SUFFIX.get(first.model_path.suffix, "llm")
        devices = [first.device_id] if first.device_id is not None else []
        config = ModelConfig(
            backend=None if backend == "om" else backend,  # type: ignore[arg-type]
            dynamic_batching=first.dynamic_batching.to_dynamic_batching() if first.dynamic_batching else None,
            max_batch_size=first.dynamic_batching.max_batch_size if first.dynamic_batching else None,
            instance_group=[InstanceGroup(count=1, kind=first.device, devices=devices)],
            version_policy=VersionPolicy(all=True),  # every version the file lists is served
        )
        sources.append(
            ModelSource(
                name=name,
                backend=backend,
                config=config,
                versions=tuple(sorted(versions, key=lambda v: v.version)),
                request_input_shape=tuple(first.input_shape) if first.input_shape else None,
                device_id=first.device_id,
            )
        )
    return sources
