"""The gRPC codec without a socket: typed and raw contents for every datatype, bounds, encoding."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest

from tensorgate.backends.base import Device
from tensorgate.errors import InvalidInput, NotImplementedFeature, PermissionDenied, TooLarge
from tensorgate.models.triton_config import triton_config
from tensorgate.protocols.grpc import codec
from tensorgate.protocols.grpc.generated import grpc_service_pb2 as pb
from tensorgate.protocols.grpc.generated import model_config_pb2 as mc
from tensorgate.protocols.grpc.raw_inputs import receive_infer_request
from tensorgate.scheduling.batch_policy import BatchSettings
from tensorgate.scheduling.scheduler import QueueSettings
from tensorgate.types import DataType, InferResponse, ModelMetadata, TensorSpec

LIMITS = codec.GrpcLimits(max_elements=1000, max_tensor_bytes=10_000)

TYPED = [
    ("BOOL", "bool_contents", [True, False, True, True]),
    ("UINT8", "uint_contents", [0, 1, 200, 255]),
    ("UINT16", "uint_contents", [0, 1, 2, 65535]),
    ("UINT32", "uint_contents", [0, 1, 2, 2**32 - 1]),
    ("UINT64", "uint64_contents", [0, 1, 2, 2**64 - 1]),
    ("INT8", "int_contents", [-128, 0, 1, 127]),
    ("INT16", "int_contents", [-5, 0, 1, 32767]),
    ("INT32", "int_contents", [-(2**31), 0, 1, 2**31 - 1]),
    ("INT64", "int64_contents", [-(2**63), 0, 1, 2**63 - 1]),
    ("FP32", "fp32_contents", [0.5, -1.0, 2.25, 3.0]),
    ("FP64", "fp64_contents", [0.1, -1.0, 2.5, 1e300]),
    ("BYTES", "bytes_contents", [b"a", b"", b"\xff\x00", b"long" * 10]),
]


def _message(datatype: str, shape: list[int], **kwargs: Any) -> Any:
    message = pb.ModelInferRequest(model_name="m", **kwargs)
    message.inputs.add(name="x", datatype=datatype, shape=shape)
    return message


@pytest.mark.parametrize(("datatype", "field", "values"), TYPED)
def test_typed_contents_decode(datatype: str, field: str, values: list[Any]) -> None:
    message = _message(datatype, [2, 2])
    getattr(message.inputs[0].contents, field).extend(values)
    request = codec.decode_infer(message, LIMITS)
    array = request.inputs["x"]
    assert array.shape == (2, 2)
    if datatype == "BYTES":
        assert array.reshape(-1).tolist() == values
    else:
        assert array.dtype == DataType(datatype).numpy
        np.testing.assert_array_equal(array.reshape(-1), np.array(values, dtype=DataType(datatype).numpy))


@pytest.mark.parametrize(("datatype", "field", "values"), TYPED)
def test_raw_contents_round_trip(datatype: str, field: str, values: list[Any]) -> None:
    dt = DataType(datatype)
    array = np.empty(4, dtype=object) if dt is DataType.BYTES else np.array(values, dtype=dt.numpy)
    if dt is DataType.BYTES:
        array[:] = values
    response = codec.encode_infer(InferResponse(model="m", version=3, outputs={"y": array.reshape(2, 2)}, id="i"))
    assert (response.model_name, response.model_version, response.id) == ("m", "3", "i")
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [("y", datatype, [2, 2])]
    message = _message(datatype, [2, 2])
    message.raw_input_contents.append(response.raw_output_contents[0])
    decoded = codec.decode_infer(message, LIMITS).inputs["x"]
    assert decoded.reshape(-1).tolist() == array.tolist()
    # The server's way in: the raw contents as views of the received bytes.
    received = receive_infer_request(message.SerializeToString())
    viewed = codec.decode_infer(received.message, LIMITS, received.raw).inputs["x"]
    assert viewed.dtype == decoded.dtype and viewed.reshape(-1).tolist() == array.tolist()


def test_bytes_raw_contents_are_length_prefixed() -> None:
    message = _message("BYTES", [2])
    message.raw_input_contents.append(struct.pack("<I", 2) + b"hi" + struct.pack("<I", 0))
    assert codec.decode_infer(message, LIMITS).inputs["x"].tolist() == [b"hi", b""]
    bad = _message("BYTES", [2])
    bad.raw_input_contents.append(struct.pack("<I", 9) + b"hi")
    with pytest.raises(InvalidInput, match="runs past the end"):
        codec.decode_infer(bad, LIMITS)


@pytest.mark.parametrize(
    ("datatype", "field", "values", "match"),
    [
        ("INT8", "int_contents", [1000, 0, 0, 0], "do not fit INT8"),
        ("UINT8", "uint_contents", [256, 0, 0, 0], "do not fit UINT8"),
        ("FP32", "fp32_contents", [1.0, 2.0, 3.0], "needs 4 elements"),
        ("FP32", "fp64_contents", [1.0, 2.0, 3.0, 4.0], "needs 4 elements, but fp32_contents holds 0"),
        ("FP16", "fp32_contents", [1.0, 2.0, 3.0, 4.0], "must be sent in raw_input_contents"),
    ],
)
def test_bad_typed_contents(datatype: str, field: str, values: list[Any], match: str) -> None:
    message = _message(datatype, [2, 2])
    getattr(message.inputs[0].contents, field).extend(values)
    with pytest.raises(InvalidInput, match=match):
        codec.decode_infer(message, LIMITS)


def test_request_level_checks() -> None:
    # No input at all decodes: the model refuses it, naming the inputs it needs (as over HTTP).
    assert codec.decode_infer(pb.ModelInferRequest(model_name="m"), LIMITS).inputs == {}
    twice = _message("FP32", [1])
    twice.inputs.add(name="x", datatype="FP32", shape=[1])
    twice.raw_input_contents.extend([b"\0" * 4, b"\0" * 4])
    with pytest.raises(InvalidInput, match="appears more than once"):
        codec.decode_infer(twice, LIMITS)
    both = _message("FP32", [1])
    both.inputs[0].contents.fp32_contents.append(1.0)
    both.raw_input_contents.append(b"\0" * 4)
    triton = "^contents field must not be specified when using raw_input_contents for 'x' for model 'm'$"
    with pytest.raises(InvalidInput, match=triton):
        codec.decode_infer(both, LIMITS)
    with pytest.raises(InvalidInput, match="exceed the maximum size of 1000 elements"):
        codec.decode_infer(_message("FP32", [100, 100]), LIMITS)
    with pytest.raises(InvalidInput, match="negative dimension"):
        codec.decode_infer(_message("FP32", [-1, 4]), LIMITS)
    big = _message("UINT8", [20_000])
    big.raw_input_contents.append(b"\0" * 20_000)
    with pytest.raises(TooLarge):
        codec.decode_infer(big, LIMITS)
    shm = _message("FP32", [1])
    shm.inputs[0].parameters["shared_memory_region"].string_param = "r"
    with pytest.raises(PermissionDenied, match="shared memory is off"):  # the server has none
        codec.decode_infer(shm, LIMITS)
    classify = _message("FP32", [1], outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="y")])
    classify.outputs[0].parameters["classification"].int64_param = 3
    classify.raw_input_contents.append(b"\0" * 4)
    with pytest.raises(NotImplementedFeature, match="classification"):
        codec.decode_infer(classify, LIMITS)


def test_parameters_map_like_http() -> None:
    message = _message("FP32", [1], id="req", model_version="2")
    message.raw_input_contents.append(b"\0" * 4)
    message.parameters["priority"].uint64_param = 2
    message.parameters["timeout"].int64_param = 250_000
    message.parameters["custom"].string_param = "v"
    message.outputs.add(name="y")
    request = codec.decode_infer(message, LIMITS)
    assert (request.priority, request.timeout_s, request.id, request.version) == (2, 0.25, "req", 2)
    assert request.outputs == ("y",)
    assert request.parameters["custom"] == "v"
    message.parameters["timeout"].int64_param = -1
    with pytest.raises(InvalidInput, match="timeout"):
        codec.decode_infer(message, LIMITS)


def test_model_config_leaves_out_the_batch_dimension() -> None:
    metadata = ModelMetadata(
        name="m",
        versions=(1,),
        platform="python",
        inputs=(TensorSpec("x", DataType.BYTES, (-1, 3)),),
        outputs=(TensorSpec("y", DataType.FP16, (-1, 2, 2)),),
        max_batch_size=8,
    )
    queue = QueueSettings(priority_levels=3, max_queue_size=64, default_timeout_s=0.25)
    devices = [Device("gpu", 1), Device("gpu", 0), Device("gpu", 1)]
    batched = triton_config(metadata, BatchSettings(8, True, 0.002, (4, 8)), queue, devices)
    config = codec.encode_config(batched).config
    assert (config.name, config.platform, config.backend, config.max_batch_size) == ("m", "python", "python", 8)
    assert (config.input[0].data_type, list(config.input[0].dims)) == (mc.TYPE_STRING, [3])
    assert (config.output[0].data_type, list(config.output[0].dims)) == (mc.TYPE_FP16, [2, 2])
    assert list(config.dynamic_batching.preferred_batch_size) == [4, 8]
    assert config.dynamic_batching.max_queue_delay_microseconds == 2000
    # The lowest of three levels is the default, as in the scheduler.
    assert (config.dynamic_batching.priority_levels, config.dynamic_batching.default_priority_level) == (3, 3)
    policy = config.dynamic_batching.default_queue_policy
    assert (policy.max_queue_size, policy.default_timeout_microseconds) == (64, 250_000)
    assert policy.timeout_action == mc.ModelQueuePolicy.REJECT and policy.allow_timeout_override
    [group] = config.instance_group
    assert (group.kind, group.count, list(group.gpus)) == (mc.ModelInstanceGroup.KIND_GPU, 3, [0, 1])
    plain = ModelMetadata("m", (1,), "onnxruntime_onnx", metadata.inputs, metadata.outputs, 0)
    unbatched = codec.encode_config(triton_config(plain, BatchSettings(0, False, 0.0), QueueSettings(), [Device()]))
    assert list(unbatched.config.input[0].dims) == [-1, 3]
    assert not unbatched.config.HasField("dynamic_batching")
    assert unbatched.config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU


def test_index_can_list_only_ready_versions() -> None:
    rows = [
        {"name": "a", "version": "1", "state": "READY", "reason": ""},
        {"name": "b", "version": "1", "state": "FAILED", "reason": "bad file"},
        {"name": "c", "state": "UNAVAILABLE", "reason": None},
    ]
    assert [m.name for m in codec.encode_index(rows, ready_only=False).models] == ["a", "b", "c"]
    assert [m.name for m in codec.encode_index(rows, ready_only=True).models] == ["a"]
