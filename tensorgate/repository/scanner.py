"""Scanning a model repository on disk into :class:`ModelSource` records.

Layout: ``<repo>/<model>/[config.yaml]`` and ``<repo>/<model>/<version>/model.onnx`` (or ``model.py``
for the Python backend, ``model.pt`` / ``model.pt2`` for torch, or a Hugging Face directory for
``llm``). Every resolved path must stay inside
the repository root: a symlink that escapes it makes that model fail, never the server.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tensorgate.config.loading import load_file, validate
from tensorgate.config.model_config import ModelConfig
from tensorgate.config.triton_pbtxt import triton_config
from tensorgate.errors import ConfigError
from tensorgate.names import is_valid_model_name, is_valid_version
from tensorgate.repository.source import ModelSource, VersionSource
from tensorgate.repository.version_policy import served_versions

log = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
TRITON_CONFIG_FILE = "config.pbtxt"  # Triton's, read where there is no config.yaml
# The files a version directory may hold for each backend, the first found being the model.
_ARTIFACTS = {"onnxruntime": ("model.onnx",), "python": ("model.py",), "torch": ("model.pt", "model.pt2")}


def _inside(root: Path, path: Path) -> bool:
    try:
        path.resolve(strict=True).relative_to(root)
    except (OSError, ValueError):
        return False
    return True


def _artifact(directory: Path, filenames: tuple[str, ...]) -> Path:
    """The version's model file: the first of ``filenames`` that exists (else the first, missing)."""
    return next((directory / f for f in filenames if (directory / f).exists()), directory / filenames[0])


def _detect_backend(version_dirs: list[Path]) -> str | None:
    for backend, filenames in _ARTIFACTS.items():
        if any((d / filename).is_file() for d in version_dirs for filename in filenames):
            return backend
    if any((d / "config.json").is_file() for d in version_dirs):
        return "llm"
    return None


def _read_config(path: Path, source: str) -> ModelConfig:
    if path.name == CONFIG_FILE:
        return load_file(ModelConfig, path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: cannot read the file ({exc})") from exc
    return validate(ModelConfig, triton_config(text, source), source)


def scan_model(root: Path, model_dir: Path, override: ModelConfig | None = None) -> ModelSource:
    """One model directory. Problems are recorded on the source, so one bad model fails alone.

    ``override`` replaces the directory's ``config.yaml`` (the repository API's ``config`` parameter).
    """
    name = model_dir.name
    problems: list[str] = []
    config = ModelConfig()
    config_path = model_dir / CONFIG_FILE
    if not config_path.exists() and (model_dir / TRITON_CONFIG_FILE).exists():
        config_path = model_dir / TRITON_CONFIG_FILE
    if override is not None:
        config = override
    elif config_path.exists():
        if not _inside(root, config_path):
            problems.append(f"{name}/{config_path.name} points outside the model repository")
        else:
            try:
                config = _read_config(config_path, f"{name}/{config_path.name}")
            except ConfigError as exc:
                problems.append(str(exc).replace(str(root) + "/", ""))
    if config.name is not None and config.name != name:
        problems.append(f"{name}/{config_path.name}: key 'name' is {config.name!r}, expected the directory name")

    version_dirs: dict[int, Path] = {}
    for child in sorted(model_dir.iterdir()):
        if not is_valid_version(child.name) or not child.is_dir():
            continue
        if not _inside(root, child):
            problems.append(f"{name}/{child.name} points outside the model repository")
            continue
        version_dirs[int(child.name)] = child

    backend = config.backend or _detect_backend(list(version_dirs.values()))
    on_disk: list[VersionSource] = []
    served: set[int] = set()
    if backend is None:
        if not problems:
            problems.append(
                f"{name}: no version directory holds a model (model.onnx, a Python backend model file, "
                "model.pt or model.pt2 for torch, or a Hugging Face config.json)"
            )
        backend = "unknown"
    else:
        served = set(served_versions(config, version_dirs))
        for version, directory in sorted(version_dirs.items()):
            artifact = _artifact(directory, _ARTIFACTS[backend]) if backend in _ARTIFACTS else directory
            if not _inside(root, artifact):
                if version in served:
                    problems.append(f"{name}/{version}: {artifact.name} is missing or points outside the repository")
                continue
            on_disk.append(VersionSource(version, artifact, directory))
        if not any(v.version in served for v in on_disk) and not problems:
            problems.append(f"{name}: the version policy selects no version on disk")
    if backend == "llm" and config.traffic is not None and config.traffic.shadow is not None:
        # A shadow compares tensors; a generative model samples, so equal requests may rightly answer
        # different texts, and a copy of every generation would double its cost for nothing.
        problems.append(
            f"{name}/{CONFIG_FILE}: traffic.shadow is not for the llm backend (its answers are sampled "
            "texts, which no comparison can judge); use traffic.weights or traffic.canary"
        )
    return ModelSource(
        name=name,
        backend=backend,
        config=config,
        versions=tuple(v for v in on_disk if v.version in served),
        problems=tuple(problems),
        on_disk=tuple(on_disk),
    )


def scan_repository(root: Path) -> list[ModelSource]:
    root = root.resolve(strict=True)
    sources = []
    for model_dir in sorted(root.iterdir()):
        if not model_dir.is_dir() or model_dir.name.startswith("."):
            continue
        if not is_valid_model_name(model_dir.name):
            log.warning("skipping %r: not a valid model name", model_dir.name)
            continue
        if not _inside(root, model_dir):
            sources.append(
                ModelSource(
                    name=model_dir.name,
                    backend="unknown",
                    config=ModelConfig(),
                    versions=(),
                    problems=(f"{model_dir.name} points outside the model repository",),
                )
            )
            continue
        sources.append(scan_model(root, model_dir))
    return sources
