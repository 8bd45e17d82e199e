"""Reading configuration files: safe YAML, schema validation, and messages that name file and key."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from tensorgate.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


def read_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the file ({exc.strerror})") from exc
    try:
        # safe_load only: a configuration file never constructs Python objects.
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc


def validate(schema: type[M], data: Any, source: str) -> M:
    """Validate ``data`` against ``schema``; a failure names the source, the key and the expectation."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {describe(exc)}") from exc


def describe(exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        key = ".".join(str(part) for part in err["loc"]) or "(top level)"
        message = err["msg"]
        if err["type"] == "extra_forbidden":
            message = "unknown key"
        problems.append(f"key '{key}': {message}")
    return "; ".join(problems)


def load_file(schema: type[M], path: Path) -> M:
    return validate(schema, read_yaml(path), str(path))
