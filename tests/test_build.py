"""The build: the hot modules the tests exercise are the compiled ones that will be served."""

from __future__ import annotations

import importlib
from importlib.machinery import EXTENSION_SUFFIXES

from build_info import build_manifest, compiled_sources


def test_every_module_setup_compiled_is_loaded_compiled() -> None:
    compiled = compiled_sources()
    assert compiled or build_manifest()["pure"], "a compiled build that compiled nothing"
    for path in compiled:
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        assert module.__file__ is not None
        assert module.__file__.endswith(tuple(EXTENSION_SUFFIXES)), f"{path} runs uncompiled from {module.__file__}"
