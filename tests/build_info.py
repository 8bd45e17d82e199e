"""What setup.py built: read by the conftest's staleness guard and by tests/test_build.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import tensorgate

PACKAGE = Path(tensorgate.__file__).resolve().parent


def build_manifest() -> dict[str, object]:
    """The sources setup.py compiled with mypyc and their digests then, and whether the build was a
    pure-Python one (TENSORGATE_PURE_PYTHON)."""
    manifest = PACKAGE / "_build.json"
    return json.loads(manifest.read_text()) if manifest.exists() else {"compiled": {}, "pure": True}


def compiled_sources() -> dict[str, str]:
    compiled: dict[str, str] = build_manifest()["compiled"]  # type: ignore[assignment]
    return compiled


def stale_sources() -> list[str]:
    """Compiled modules whose source has changed since the build."""
    return [
        path
        for path, digest in compiled_sources().items()
        if hashlib.sha256((PACKAGE.parent / path).read_bytes()).hexdigest() != digest
    ]
