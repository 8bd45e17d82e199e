"""The bundled example repository: small ONNX models generated deterministically on first use."""

from tensorgate.examples.build import build_example_repository, default_example_repository

__all__ = ["build_example_repository", "default_example_repository"]
