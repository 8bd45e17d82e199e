"""Backends by name. Runtimes are imported only when a model needs them."""

from __future__ import annotations

from pathlib import Path

from tensorgate.backends.base import Backend, Device
from tensorgate.errors import ModelLoadError
from tensorgate.generation import GenerativeRunner

# Backends that generate text a step at a time (a continuous-batching engine drives them) rather
# than answer batches through instances.
GENERATIVE = frozenset({"llm"})

# The extra that installs what each backend imports beyond the core dependencies.
_EXTRAS = {"llm": "llm", "torch": "torch"}


def missing_runtime(backend: str, exc: ModuleNotFoundError) -> str:
    """Why a backend could not load when one of its optional packages is not installed."""
    extra = _EXTRAS.get(backend, "llm" if exc.name in ("torch", "transformers", "tokenizers", "safetensors") else None)
    install = f": pip install 'tensorgate[{extra}]'" if extra else ""
    return f"the {backend} backend needs the Python package '{exc.name}', which is not installed{install}"


def create_backend(name: str) -> Backend:
    if name == "onnxruntime":
        from tensorgate.backends.onnx_backend import OnnxBackend

        return OnnxBackend()
    if name == "python":
        from tensorgate.backends.python_backend import PythonBackend

        return PythonBackend()
    if name == "torch":
        from tensorgate.backends.torch_backend import TorchBackend

        return TorchBackend()
    if name == "om":
        raise ModelLoadError(
            ".om models are compiled for Ascend NPUs and need the Ascend CANN runtime (ACL, pyACL), "
            "which is not installed on this host; export the model to ONNX or install CANN"
        )
    raise ModelLoadError(f"unknown backend {name!r}; expected onnxruntime, python, torch or llm")


def load_generative(
    name: str, directory: Path, device: Device, dtype: str, threads: int, lean: bool
) -> GenerativeRunner:
    """Load a generative model (blocking: call it off the event loop)."""
    if name == "llm":
        from tensorgate.backends.llm.runner import load_causal_lm

        return load_causal_lm(directory, device, dtype, threads, lean)
    raise ModelLoadError(f"backend {name!r} does not generate text; expected one of {sorted(GENERATIVE)}")
