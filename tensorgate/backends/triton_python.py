"""Triton Python-backend models served as they are: ``model.py`` with a ``TritonPythonModel`` class
that does ``import triton_python_backend_utils as pb_utils``.

This module is what that import finds (the Python backend registers it under Triton's name before
it runs a ``model.py``): the common surface of Triton's ``pb_utils`` (``Tensor``,
``InferenceRequest``, ``InferenceResponse``, ``TritonError``, ``TritonModelException``, the
``get_*_by_name`` helpers and the type conversions), written here against Triton's documented
behaviour. :class:`TritonModel` adapts such a class to :class:`~tensorgate.PythonModel`: the
``args`` of ``initialize``, then one ``InferenceRequest`` per batch the scheduler forms (its inputs
are the batch's rows, so a model that handles each request's rows as a batch, as Triton's examples
do, answers every request), and ``finalize`` at unload.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tensorgate.backends.python_model import ModelContext, ModelError, PythonModel
from tensorgate.config.model_config import ModelConfig
from tensorgate.types import Array, DataType

MODULE_NAME = "triton_python_backend_utils"

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1

# Triton's TRITONSERVER_DataType numbers (used by triton_to_numpy_type and numpy_to_triton_type).
_TYPE_NUMBERS = {
    "BOOL": 1, "UINT8": 2, "UINT16": 3, "UINT32": 4, "UINT64": 5, "INT8": 6, "INT16": 7, "INT32": 8,
    "INT64": 9, "FP16": 10, "FP32": 11, "FP64": 12, "BYTES": 13, "BF16": 14,
}  # fmt: skip
_BY_NUMBER = {number: name for name, number in _TYPE_NUMBERS.items()}


class TritonModelException(ModelError):
    """What a model raises to fail its requests (Triton's ``pb_utils.TritonModelException``)."""


class TritonError:
    """An error a model puts on a response (``InferenceResponse(error=...)``), with Triton's codes."""

    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

    def __init__(self, message: str, code: int = 1) -> None:
        if message is None:
            raise TypeError("TritonError needs a message")
        self._message = str(message)
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, {self._code})"


class Tensor:
    """A named tensor: a numpy array (BYTES as an object array of ``bytes``), always on the CPU here."""

    def __init__(self, name: str, numpy_array: Any) -> None:
        array = np.asarray(numpy_array)
        if array.dtype.kind in "US":  # Triton refuses these too: BYTES are object arrays of bytes
            raise TritonModelException(
                "Tensor dtype used for numpy_array is not support by Python backend. Please use np.object_ instead."
            )
        self._name = name
        self._array = array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> Array:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> int:
        return numpy_to_triton_type(self._array.dtype)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        return self._array.__dlpack__()

    def __dlpack__(self, stream: Any = None) -> Any:
        return self._array.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU, device 0

    @staticmethod
    def from_dlpack(name: str, capsule: Any) -> Tensor:
        return Tensor(name, np.from_dlpack(capsule))


class InferenceRequest:
    """A request as ``execute`` receives it."""

    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: Sequence[Tensor] = (),
        requested_output_names: Sequence[str] = (),
        model_name: str = "",
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        parameters: Mapping[str, Any] | str | None = None,
    ) -> None:
        if not isinstance(correlation_id, int | str):
            raise TritonModelException("Correlation ID must be integer or string")
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._inputs = list(inputs)
        self._requested = list(requested_output_names)
        self._model_name = model_name
        self._model_version = model_version
        self._flags = flags
        self._timeout = timeout
        self._parameters = parameters if isinstance(parameters, str) else json.dumps(dict(parameters or {}))

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        """The request's parameters as a JSON string, as in Triton."""
        return self._parameters

    def requested_output_names(self) -> list[str]:
        return self._requested

    def is_cancelled(self) -> bool:
        return False

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version


class InferenceResponse:
    """What ``execute`` answers a request with: output tensors, or an error."""

    def __init__(
        self,
        output_tensors: Sequence[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> None:
        if output_tensors is not None and not isinstance(output_tensors, list | tuple):
            raise TritonModelException('"output_tensors" must be a list.')
        self._outputs = list(output_tensors or [])
        self._error = error
        self._parameters = json.dumps(dict(parameters or {}))

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return next((t for t in request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors() if t.name() == name), None)


def get_input_config_by_name(model_config: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    return next((dict(c) for c in model_config.get("input", []) if c.get("name") == name), None)


def get_output_config_by_name(model_config: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    return next((dict(c) for c in model_config.get("output", []) if c.get("name") == name), None)


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """``TYPE_FP32`` -> ``numpy.float32``; ``TYPE_STRING`` (BYTES) -> ``numpy.object_``."""
    name = triton_type_string.removeprefix("TYPE_")
    return DataType.parse("BYTES" if name == "STRING" else name).numpy


def triton_to_numpy_type(data_type: int) -> Any:
    return DataType.parse(_BY_NUMBER[data_type]).numpy


def numpy_to_triton_type(data_type: Any) -> int:
    return _TYPE_NUMBERS[DataType.from_numpy(np.dtype(data_type)).value]


# -- the adapter -------------------------------------------------------------------------------------


def model_config_json(config: ModelConfig, name: str, instances: int) -> dict[str, Any]:
    """The model's configuration as Triton hands it to ``initialize`` (``args["model_config"]``):
    the JSON form of its ModelConfig, with the fields Python models read."""
    batched = (config.max_batch_size or 0) > 0

    def tensors(declared: Any) -> list[dict[str, Any]]:
        out = []
        for tensor in declared or []:
            datatype = "STRING" if tensor.datatype == "BYTES" else tensor.datatype
            dims = tensor.shape[1:] if batched else tensor.shape
            out.append({"name": tensor.name, "data_type": f"TYPE_{datatype}", "dims": list(dims)})
        return out

    document: dict[str, Any] = {
        "name": name,
        "backend": "python",
        "max_batch_size": config.max_batch_size or 0,
        "input": tensors(config.inputs),
        "output": tensors(config.outputs),
        "instance_group": [{"kind": "KIND_CPU", "count": instances}],
        "parameters": {key: {"string_value": str(value)} for key, value in config.parameters.items()},
    }
    if config.dynamic_batching is not None:
        document["dynamic_batching"] = {}
    return document


class TritonModel(PythonModel):
    """A ``TritonPythonModel`` served as a tensorgate Python model."""

    def __init__(self, model: Any, config: ModelConfig, outputs: Sequence[str]) -> None:
        self._model = model
        self._config = config
        self._outputs = list(outputs)
        self._name = ""
        self._version = -1

    def load(self, context: ModelContext) -> None:
        self._name, self._version = context.name, context.version
        initialize = getattr(self._model, "initialize", None)
        if initialize is None:
            return
        count = sum(group.count for group in self._config.instance_group)
        args = {
            "model_config": json.dumps(model_config_json(self._config, context.name, count)),
            "model_instance_kind": "CPU",
            "model_instance_name": context.instance or f"{context.name}_0",
            "model_instance_device_id": "0",
            "model_repository": str(context.directory.parent),
            "model_version": str(context.version),
            "model_name": context.name,
        }
        initialize(args)

    def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        request = InferenceRequest(
            inputs=[Tensor(name, array) for name, array in inputs.items()],
            requested_output_names=self._outputs,
            model_name=self._name,
            model_version=self._version,
        )
        responses = self._model.execute([request])
        if not isinstance(responses, list | tuple) or len(responses) != 1:
            got = len(responses) if isinstance(responses, list | tuple) else type(responses).__name__
            raise TritonModelException(f"execute must return one InferenceResponse per request (1), got {got}")
        response = responses[0]
        if not isinstance(response, InferenceResponse):
            raise TritonModelException(f"execute returned {type(response).__name__}, not an InferenceResponse")
        error = response.error()
        if error is not None:
            raise TritonModelException(error.message())
        return {tensor.name(): tensor.as_numpy() for tensor in response.output_tensors()}

    def unload(self) -> None:
        finalize = getattr(self._model, "finalize", None)
        if finalize is not None:
            finalize()
