"""The committed stubs are exactly what ``python -m tensorgate.protocols.grpc.generate`` writes."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import pytest

from tensorgate.protocols.grpc.generate import GENERATED, generate

pytest.importorskip("grpc_tools.protoc")

# The dev extra pins grpcio-tools (the bundled protoc decides the output byte for byte).
PINNED_TOOLS = "1.81.1"


def test_regenerating_changes_nothing(tmp_path: Path) -> None:
    if version("grpcio-tools") != PINNED_TOOLS:
        pytest.fail(f"grpcio-tools {version('grpcio-tools')} is installed; the stubs are made with {PINNED_TOOLS}")
    fresh = {path.name: path.read_text() for path in generate(tmp_path)}
    committed = {path.name: path.read_text() for path in GENERATED.iterdir() if path.name.endswith((".py", ".pyi"))}
    committed.pop("__init__.py")
    committed.pop("_pool.py")
    assert sorted(fresh) == sorted(committed)
    stale = [name for name, text in fresh.items() if committed[name] != text]
    assert not stale, f"run `python -m tensorgate.protocols.grpc.generate`: {stale} differ"
