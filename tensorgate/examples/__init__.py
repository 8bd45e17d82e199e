"""The bundled example repository: small ONNX models generated deterministically on first use, and an
image pipeline over one of them (two small Python steps around the ONNX classifier)."""

from tensorgate.examples.build import EXAMPLE_MODELS, build_example_repository, default_example_repository

__all__ = ["EXAMPLE_MODELS", "build_example_repository", "default_example_repository"]
