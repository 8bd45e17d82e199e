"""The public API is small and deliberate: this test pins it, so a change to it is a decision."""

from __future__ import annotations

import tensorgate


def test_public_api_is_pinned_and_sorted() -> None:
    assert tensorgate.__all__ == [
        "Backend",
        "Clock",
        "DataType",
        "Device",
        "ErrorCode",
        "InferRequest",
        "InferResponse",
        "LoadSpec",
        "ManualClock",
        "ModelConfig",
        "ModelContext",
        "ModelError",
        "MonotonicClock",
        "PythonModel",
        "ResponseSender",
        "Server",
        "ServerConfig",
        "TensorSpec",
        "TensorgateError",
    ]
    assert tensorgate.__all__ == sorted(tensorgate.__all__)
    for name in tensorgate.__all__:
        assert getattr(tensorgate, name) is not None


def test_the_testing_helper_is_importable() -> None:
    from tensorgate.testing import ServerProcess

    assert callable(ServerProcess)
