"""The build: the hot modules the tests exercise are the compiled ones that will be served."""

from __future__ import annotations

import importlib
from importlib.machinery import EXTENSION_SUFFIXES
from types import FunctionType

from build_info import build_manifest, compiled_sources


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
    from tensorgate.protocols.http.app import Call
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
