"""The package's version: pyproject.toml's, the one place it is written.

Read from the installed package's metadata; a checkout run without installing reads its
pyproject.toml instead.
"""

from __future__ import annotations

import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

__all__ = ["__version__"]


def _version() -> str:
    try:
        return version("tensorgate")
    except PackageNotFoundError:
        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        try:
            project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "0+unknown"
        return str(project["version"]) if project.get("name") == "tensorgate" else "0+unknown"


__version__ = _version()
