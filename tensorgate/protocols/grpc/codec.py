"""KServe V2 gRPC messages to and from the core vocabulary.

Pure functions, like the HTTP codecs, so they can be tested and fuzzed without a server. Tensor
bytes go through the shared :mod:`tensorgate.protocols.tensor_codec`, so a tensor decodes the same
way over HTTP's binary extension and gRPC's ``raw_input_contents``; request parameters
(``priority``, ``timeout``) follow the HTTP rules exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from google.protobuf import json_format

from tensorgate.errors import InvalidInput, NotImplementedFeature
from tensorgate.names import check_model_name, parse_version
from tensorgate.protocols.grpc.generated import grpc_service_pb2 as pb
from tensorgate.protocols.grpc.generated import model_config_pb2 as mc

# The one definition of the V2 ``priority`` / ``timeout`` parameters, shared with HTTP so both
# protocols accept and reject the same values.
from tensorgate.protocols.parameters import MAX_INPUTS, priority_and_timeout
from tensorgate.protocols.shared_memory import NO_SHARED_MEMORY, SharedMemoryUse, uses_shared_memory
from tensorgate.protocols.tensor_codec import check_total_bytes, from_raw, parse_datatype, parse_shape, to_raw
from tensorgate.types import Array, DataType, InferRequest, InferResponse, ModelMetadata

# The typed ``contents`` field for each datatype (FP16 has none: it travels only as raw bytes).
_CONTENTS_FIELD: dict[DataType, str] = {
    DataType.BOOL: "bool_contents",
    DataType.UINT8: "uint_contents",
    DataType.UINT16: "uint_contents",
    DataType.UINT32: "uint_contents",
    DataType.UINT64: "uint64_contents",
    DataType.INT8: "int_contents",
    DataType.INT16: "int_contents",
    DataType.INT32: "int_contents",
    DataType.INT64: "int64_contents",
    DataType.FP32: "fp32_contents",
    DataType.FP64: "fp64_contents",
    DataType.BYTES: "bytes_contents",
}


@dataclass(frozen=True, slots=True)
class GrpcLimits:
    """Bounds on what one request may make the server allocate (the message size is bounded by gRPC)."""

    max_elements: int = 1 << 28
    max_tensor_bytes: int = 64 * 1024 * 1024


def optional_version(text: str) -> int | None:
    """A version field: empty lets the server choose, otherwise a positive integer."""
    return parse_version(text) if text else None


def parameters(params: Mapping[str, Any]) -> dict[str, Any]:
    """An ``InferParameter`` map as plain values, so request parameters read like HTTP's JSON ones."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        kind = value.WhichOneof("parameter_choice")
        out[key] = None if kind is None else getattr(value, kind)
    return out


def decode_infer(
    message: Any,
    limits: GrpcLimits,
    raw: Sequence[bytes | memoryview] | None = None,
    shared: SharedMemoryUse | None = None,
) -> InferRequest:
    """A ``ModelInferRequest`` as a validated :class:`InferRequest` (ids and deadline are set by the caller).

    ``raw`` is its ``raw_input_contents`` when the caller already holds them (``raw_inputs``);
    otherwise they are read from the message. Inputs in shared memory are read through ``shared``,
    which also takes note of the outputs to write there.
    """
    name = check_model_name(message.model_name)
    version = optional_version(message.model_version)
    count = len(message.inputs)  # none at all is the model's to refuse, naming the inputs it needs
    if count > MAX_INPUTS:
        raise InvalidInput(f"request has {count} inputs; at most {MAX_INPUTS} are allowed")
    if raw is None:  # with upb, each read of a repeated bytes field's element is a fresh copy
        raw = list(message.raw_input_contents)
    use = shared if shared is not None else NO_SHARED_MEMORY
    if raw:
        carried = 0
        for tensor in message.inputs:
            if uses_shared_memory(tensor.parameters):
                continue
            carried += 1
            if tensor.HasField("contents"):  # named before the count, as Triton does
                raise InvalidInput(
                    f"contents field must not be specified when using raw_input_contents for '{tensor.name}' "
                    f"for model '{name}'"
                )
        if len(raw) != carried:
            raise InvalidInput(
                f"raw_input_contents holds {len(raw)} entries but the request has {carried} inputs outside "
                "shared memory; send one entry per such input, in order"
            )
    check_total_bytes([len(r) for r in raw], limits.max_tensor_bytes)
    inputs: dict[str, Array] = {}
    next_raw = 0  # raw_input_contents holds the inputs that are not in shared memory, in order
    for index, tensor in enumerate(message.inputs):
        input_name = tensor.name
        if not input_name:
            raise InvalidInput(f"inputs[{index}] needs a name")
        if input_name in inputs:
            raise InvalidInput(f"input '{input_name}' appears more than once")
        datatype = parse_datatype(tensor.datatype, input_name)
        shape, elements = parse_shape(list(tensor.shape), input_name, limits.max_elements)
        if uses_shared_memory(tensor.parameters):
            if tensor.HasField("contents"):
                raise InvalidInput(
                    f"unexpected 'content' provided when using shared memory for input tensor '{input_name}' "
                    f"for model '{name}'"
                )
            inputs[input_name] = use.read(parameters(tensor.parameters), datatype, shape, elements, input_name)
        elif raw:
            inputs[input_name] = from_raw(raw[next_raw], datatype, shape, elements, input_name)
            next_raw += 1
        else:
            inputs[input_name] = _from_contents(tensor, datatype, shape, elements)
    params = parameters(message.parameters)
    priority, timeout = priority_and_timeout(params)
    return InferRequest(
        model=name,
        version=version,
        inputs=inputs,
        outputs=_requested_outputs(message, use),
        parameters=params,
        priority=priority,
        timeout_s=timeout,
        id=message.id,
    )


def _from_contents(tensor: Any, datatype: DataType, shape: tuple[int, ...], elements: int) -> Array:
    field = _CONTENTS_FIELD.get(datatype)
    if field is None:
        raise InvalidInput(f"input '{tensor.name}': {datatype.value} data must be sent in raw_input_contents")
    values = getattr(tensor.contents, field)
    if len(values) != elements:
        raise InvalidInput(
            f"input '{tensor.name}': shape {list(shape)} needs {elements} elements, but {field} holds {len(values)}"
        )
    if datatype is DataType.BYTES:
        array = np.empty(elements, dtype=object)
        array[:] = list(values)
        return array.reshape(shape)
    try:
        return np.array(values, dtype=datatype.numpy).reshape(shape)
    except (OverflowError, ValueError) as exc:
        raise InvalidInput(f"input '{tensor.name}': {field} values do not fit {datatype.value}") from exc


def _requested_outputs(message: Any, shared: SharedMemoryUse) -> tuple[str, ...]:
    names: list[str] = []
    for index, output in enumerate(message.outputs):
        if not output.name:
            raise InvalidInput(f"outputs[{index}] needs a name")
        if output.name in names:
            raise InvalidInput(f"Duplicate output name '{output.name}' is not allowed in a request")
        if "classification" in output.parameters:
            raise NotImplementedFeature("the classification extension is not supported")
        if uses_shared_memory(output.parameters):
            shared.target(output.name, parameters(output.parameters))
        names.append(output.name)
    return tuple(names)


def encode_infer(response: InferResponse, shared: SharedMemoryUse | None = None) -> Any:
    """A ``ModelInferResponse`` with one ``raw_output_contents`` entry per output, in output order (what
    Triton's clients read, by position): the output's bytes, or an empty entry for an output written
    to shared memory (``shared``), which is answered with its name, datatype and shape only, as Triton
    answers it."""
    message = pb.ModelInferResponse(model_name=response.model, model_version=str(response.version), id=response.id)
    targets = shared.targets if shared is not None else {}
    for output_name, array in response.outputs.items():
        datatype = DataType.from_numpy(array.dtype)
        message.outputs.add(name=output_name, datatype=datatype.value, shape=array.shape)
        if output_name in targets:
            assert shared is not None
            shared.write(output_name, array, datatype)
            message.raw_output_contents.append(b"")
        else:
            message.raw_output_contents.append(to_raw(array, datatype))
    return message


def encode_metadata(metadata: ModelMetadata) -> Any:
    message = pb.ModelMetadataResponse(
        name=metadata.name, versions=[str(v) for v in metadata.versions], platform=metadata.platform
    )
    for spec in metadata.inputs:
        message.inputs.add(name=spec.name, datatype=spec.datatype.value, shape=spec.shape)
    for spec in metadata.outputs:
        message.outputs.add(name=spec.name, datatype=spec.datatype.value, shape=spec.shape)
    return message


def encode_config(config: dict[str, Any]) -> Any:
    """``InferenceService.config`` is already Triton's ``ModelConfig`` in its JSON form."""
    return pb.ModelConfigResponse(config=json_format.ParseDict(config, mc.ModelConfig()))


def encode_statistics(rows: list[dict[str, Any]]) -> Any:
    """``InferenceService.statistics`` rows already have the message's shape (Triton's extension)."""
    return json_format.ParseDict({"model_stats": rows}, pb.ModelStatisticsResponse())


def load_config(parameters: Any) -> str | None:
    """The ``config`` override of a RepositoryModelLoad; model files in the request (``file:``
    parameters) are refused, as over HTTP: only what the repository holds is loaded."""
    if any(key.startswith("file:") for key in parameters):
        raise InvalidInput("this server loads models only from its repository; 'file:' parameters are refused")
    if "config" not in parameters:
        return None
    value = parameters["config"]
    if value.WhichOneof("parameter_choice") != "string_param":
        raise InvalidInput("the 'config' parameter must be a string holding a JSON model configuration")
    return str(value.string_param)


def encode_index(rows: list[dict[str, Any]], ready_only: bool) -> Any:
    message = pb.RepositoryIndexResponse()
    for row in rows:
        if ready_only and row.get("state") != "READY":
            continue
        message.models.add(
            name=row["name"], version=row.get("version", ""), state=row["state"], reason=row.get("reason") or ""
        )
    return message
