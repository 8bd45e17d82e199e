"""The build: the hot modules the tests exercise are the compiled ones that will be served."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from types import FunctionType
from typing import Any

import pytest
from build_info import build_manifest, compiled_sources

ROOT = Path(__file__).resolve().parents[1]


def test_every_module_setup_compiled_is_loaded_compiled() -> None:
    compiled = compiled_sources()
    assert compiled or build_manifest()["pure"], "a compiled build that compiled nothing"
    for path in compiled:
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        assert module.__file__ is not None
        assert module.__file__.endswith(tuple(EXTENSION_SUFFIXES)), f"{path} runs uncompiled from {module.__file__}"


def test_the_per_request_classes_are_built_by_compiled_code() -> None:
    """A dataclass compiled by mypyc keeps a generated __init__, which stays interpreted (several
    times slower); the classes a request builds write theirs out, and must keep doing so."""
    from tensorgate.protocols.http.exchange import Call
    from tensorgate.protocols.http.v2_codec import OutputPrefs
    from tensorgate.scheduling.batch_policy import Decision
    from tensorgate.scheduling.pending import Pending
    from tensorgate.types import InferRequest, InferResponse

    per_request = (Call, OutputPrefs, Decision, Pending, InferRequest, InferResponse)
    if build_manifest()["pure"]:
        for cls in per_request:  # uncompiled, the written-out __init__ is still the one used
            assert cls.__init__.__code__.co_filename != "<string>", f"{cls.__name__}.__init__ is generated"
        return
    for cls in per_request:
        assert not isinstance(cls.__dict__["__init__"], FunctionType), f"{cls.__name__}.__init__ is interpreted"


def _setup_module(monkeypatch: pytest.MonkeyPatch) -> Any:
    """setup.py loaded as a module, in its listing mode (so it does not run setuptools)."""
    monkeypatch.setenv("TENSORGATE_LIST_COMPILED", "1")
    spec = importlib.util.spec_from_file_location("tensorgate_setup", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with contextlib.redirect_stdout(io.StringIO()) as listed:
        spec.loader.exec_module(module)
    assert listed.getvalue().split() == module.COMPILED  # what the Makefile reads
    return module


def test_a_build_without_a_c_compiler_falls_back_to_pure_python(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    setup = _setup_module(monkeypatch)
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert not setup.have_c_compiler()
    monkeypatch.setattr(setup, "MANIFEST", tmp_path / "_build.json")
    monkeypatch.setattr(setup, "remove_built", lambda: None)  # leave this checkout's build alone
    monkeypatch.setattr(sys, "argv", ["setup.py", "editable_wheel"])
    monkeypatch.delenv("TENSORGATE_PURE_PYTHON", raising=False)
    assert setup.ext_modules() == []
    assert json.loads((tmp_path / "_build.json").read_text()) == {"compiled": {}, "pure": True}
