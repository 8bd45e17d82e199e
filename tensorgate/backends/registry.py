"""Backends by name. Runtimes are imported only when a model needs them."""

from __future__ import annotations

from tensorgate.backends.base import Backend
from tensorgate.errors import ModelLoadError

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
