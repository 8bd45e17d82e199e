"""Backends by name. Runtimes are imported only when a model needs them."""

from __future__ import annotations

from tensorgate.backends.base import Backend
from tensorgate.errors import ModelLoadError


def create_backend(name: str) -> Backend:
    if name == "onnxruntime":
        from tensorgate.backends.onnx_backend import OnnxBackend

        return OnnxBackend()
    if name == "python":
        from tensorgate.backends.python_backend import PythonBackend

        return PythonBackend()
    if name == "om":
        raise ModelLoadError(
            ".om models are compiled for Ascend NPUs and need the Ascend CANN runtime (ACL, pyACL), "
            "which is not installed on this host; export the model to ONNX or install CANN"
        )
    raise ModelLoadError(f"unknown backend {name!r}; expected onnxruntime, python or llm")
