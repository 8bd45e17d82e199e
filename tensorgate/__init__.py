"""tensorgate: a production inference server (KServe V2 over HTTP and gRPC, dynamic batching)."""

from tensorgate.backends.base import Backend, Device, LoadSpec
from tensorgate.backends.python_model import ModelContext, ModelError, PythonModel
from tensorgate.clock import Clock, ManualClock, MonotonicClock
from tensorgate.config.model_config import ModelConfig
from tensorgate.config.server_config import ServerConfig
from tensorgate.errors import ErrorCode, TensorgateError
from tensorgate.server import Server
from tensorgate.types import DataType, InferRequest, InferResponse, TensorSpec

__all__ = [
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
    "Server",
    "ServerConfig",
    "TensorSpec",
    "TensorgateError",
]
