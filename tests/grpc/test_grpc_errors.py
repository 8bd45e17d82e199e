"""Plain grpcio against a real server: each applicable row of the error table has its gRPC status."""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np
import pytest
from grpc_helpers import wait_inflight
from model_builders import metric, wait_until
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tensorgate.testing import ServerProcess

Stub = service_pb2_grpc.GRPCInferenceServiceStub


def _request(
    model: str = "mlp",
    shape: tuple[int, ...] = (2, 16),
    datatype: str = "FP32",
    raw: list[bytes] | None = None,
    **kwargs: Any,
) -> Any:
    message = service_pb2.ModelInferRequest(model_name=model, **kwargs)
    message.inputs.add(name="features" if model in ("mlp", "nope") else "x", datatype=datatype, shape=shape)
    if raw is None:
        raw = [np.zeros(shape, np.float32).tobytes()]
    message.raw_input_contents.extend(raw)
    return message


def _code(call: Any, *args: Any, **kwargs: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kwargs)
    return info.value.code(), info.value.details()


def _typed(model: str, name: str, datatype: str, shape: list[int], field: str, values: list[Any]) -> Any:
    message = service_pb2.ModelInferRequest(model_name=model)
    tensor = message.inputs.add(name=name, datatype=datatype, shape=shape)
    getattr(tensor.contents, field).extend(values)
    return message


CASES = {
    "bad datatype": (_request(datatype="FP33"), grpc.StatusCode.INVALID_ARGUMENT, "unknown datatype"),
    "unknown model": (
        _request(model="nope"),
        grpc.StatusCode.NOT_FOUND,
        "Request for unknown model: 'nope' is not found",
    ),
    "unknown version": (
        _request(model_version="7"),
        grpc.StatusCode.NOT_FOUND,
        "Request for unknown model: 'mlp' version 7 is not found",
    ),
    "bad version": (
        _request(model_version="x"),
        grpc.StatusCode.INVALID_ARGUMENT,
        "failed to get model version from specified version string 'x'",
    ),
    "bad model name": (_request(model="../etc"), grpc.StatusCode.INVALID_ARGUMENT, "invalid model name"),
    "wrong shape": (
        _request(shape=(2, 15), raw=[np.zeros((2, 15), np.float32).tobytes()]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "features",
    ),
    "raw contents count": (
        _request(raw=[np.zeros((2, 16), np.float32).tobytes()] * 2),
        grpc.StatusCode.INVALID_ARGUMENT,
        "raw_input_contents holds 2 entries",
    ),
    "byte size mismatch": (
        _request(raw=[b"\0" * 100]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "byte size mismatch",
    ),
    "typed count mismatch": (
        _typed("mlp", "features", "FP32", [2, 16], "fp32_contents", [1.0] * 31),
        grpc.StatusCode.INVALID_ARGUMENT,
        "needs 32 elements",
    ),
    "fp16 without raw": (
        _typed("mlp", "features", "FP16", [1, 16], "fp32_contents", [1.0] * 16),
        grpc.StatusCode.INVALID_ARGUMENT,
        "raw_input_contents",
    ),
    "bad priority": (
        _request(parameters={"priority": service_pb2.InferParameter(bool_param=True)}),
        grpc.StatusCode.INVALID_ARGUMENT,
        "priority",
    ),
    "unknown output": (
        _request(outputs=[service_pb2.ModelInferRequest.InferRequestedOutputTensor(name="nope")]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "nope",
    ),
    "shared memory": (
        _request(
            outputs=[
                service_pb2.ModelInferRequest.InferRequestedOutputTensor(
                    name="probabilities",
                    parameters={"shared_memory_region": service_pb2.InferParameter(string_param="r")},
                )
            ]
        ),
        grpc.StatusCode.PERMISSION_DENIED,  # off unless server.shared_memory: system
        "shared memory is off",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_infer_error_codes(stub: Stub, case: str) -> None:
    message, code, text = CASES[case]
    got, details = _code(stub.ModelInfer, message, timeout=30)
    assert got == code, details
    assert text in details
    assert "Traceback" not in details and "/" not in details.replace("../etc", "")


def test_typed_contents_are_accepted(stub: Stub) -> None:
    message = _typed("mlp", "features", "FP32", [1, 16], "fp32_contents", [0.5] * 16)
    response = stub.ModelInfer(message, timeout=30)
    probabilities = np.frombuffer(response.raw_output_contents[0], np.float32)
    assert probabilities.shape == (3,)
    assert abs(float(probabilities.sum()) - 1.0) < 1e-5


def test_request_id_comes_back_in_trailing_metadata(stub: Stub) -> None:
    _, call = stub.ModelInfer.with_call(_request(), metadata=(("x-request-id", "abc-123"),), timeout=30)
    assert ("x-request-id", "abc-123") in tuple(call.trailing_metadata())
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(_request(model="nope"), metadata=(("x-request-id", "err-1"),), timeout=30)
    assert ("x-request-id", "err-1") in tuple(info.value.trailing_metadata())


def test_metadata_errors(stub: Stub) -> None:
    code, _ = _code(stub.ModelMetadata, service_pb2.ModelMetadataRequest(name="nope"), timeout=30)
    assert code == grpc.StatusCode.NOT_FOUND
    code, _ = _code(stub.ModelConfig, service_pb2.ModelConfigRequest(name="mlp", version="9"), timeout=30)
    assert code == grpc.StatusCode.NOT_FOUND
    # As Triton (InferenceServer::ModelIsReady): an unknown model is not ready, which is no error.
    assert not stub.ModelReady(service_pb2.ModelReadyRequest(name="nope"), timeout=30).ready
    code, _ = _code(stub.ModelStatistics, service_pb2.ModelStatisticsRequest(name="nope"), timeout=30)
    assert code == grpc.StatusCode.NOT_FOUND


def test_repository_api_is_off_by_default(stub: Stub) -> None:
    load = service_pb2.RepositoryModelLoadRequest(model_name="mlp")
    unload = service_pb2.RepositoryModelUnloadRequest(model_name="mlp")
    for call, message in (
        (stub.RepositoryModelLoad, load),
        (stub.RepositoryModelUnload, unload),
        (stub.RepositoryIndex, service_pb2.RepositoryIndexRequest()),
    ):
        code, details = _code(call, message, timeout=30)
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert "disabled" in details


def test_unserved_triton_rpcs_are_unimplemented(stub: Stub) -> None:
    code, _ = _code(stub.TraceSetting, service_pb2.TraceSettingRequest(), timeout=30)
    assert code == grpc.StatusCode.UNIMPLEMENTED
    code, details = _code(
        stub.CudaSharedMemoryRegister, service_pb2.CudaSharedMemoryRegisterRequest(name="g"), timeout=30
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "GPUs not supported" in details
    # Served, and off unless the server is started with shared memory on.
    code, details = _code(stub.SystemSharedMemoryStatus, service_pb2.SystemSharedMemoryStatusRequest(), timeout=30)
    assert code == grpc.StatusCode.PERMISSION_DENIED and "server.shared_memory" in details


def test_tensor_over_4_mib_goes_through(py_stub: Stub) -> None:
    image = np.random.default_rng(0).standard_normal((1, 640, 640, 3)).astype(np.float32)  # 4.9 MB
    message = service_pb2.ModelInferRequest(model_name="identity")
    message.inputs.add(name="x", datatype="FP32", shape=image.shape)
    message.raw_input_contents.append(image.tobytes())
    response = py_stub.ModelInfer(message, timeout=60)
    assert list(response.outputs[0].shape) == [1, 640, 640, 3]
    np.testing.assert_array_equal(
        np.frombuffer(response.raw_output_contents[0], np.float32).reshape(image.shape), image
    )


def test_grpc_deadline_becomes_the_requests_deadline(python_server: ServerProcess, py_stub: Stub) -> None:
    """Not only the client's own timer: the server drops the request at the deadline, so it never
    reaches the model, and counts it as a timeout."""
    stats = service_pb2.ModelStatisticsRequest(name="slow")
    py_stub.ModelInfer(_x("slow", 0.0), timeout=30)  # runs after anything earlier tests left running
    runs = py_stub.ModelStatistics(stats, timeout=30).model_stats[0].inference_count
    timeouts = metric(python_server.metrics_url, "tensorgate_requests_total", model="slow", outcome="timeout")
    running = py_stub.ModelInfer.future(_x("slow", 1.0), timeout=30)  # occupies the only instance for 1 s
    wait_inflight(python_server, "slow", 1)
    code, _ = _code(py_stub.ModelInfer, _x("slow", 2.0), timeout=0.15)  # waits in the queue past 150 ms
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_until(
        lambda: (
            metric(python_server.metrics_url, "tensorgate_requests_total", model="slow", outcome="timeout")
            == timeouts + 1
        )
    )
    assert running.result().model_name == "slow"
    assert py_stub.ModelStatistics(stats, timeout=30).model_stats[0].inference_count == runs + 1


def test_v2_timeout_parameter_becomes_deadline_exceeded(py_stub: Stub) -> None:
    message = _request(
        model="slow",
        shape=(1, 4),
        raw=[np.ones((1, 4), np.float32).tobytes()],
        parameters={"timeout": service_pb2.InferParameter(int64_param=100_000)},  # 100 ms, in µs
    )
    code, details = _code(py_stub.ModelInfer, message, timeout=30)
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "model 'slow'" in details  # expired in the queue or while running: both are this status


def test_cancelled_call_leaves_the_queue(python_server: ServerProcess, py_stub: Stub) -> None:
    def slow_request(value: float) -> Any:
        return _request(model="slow", shape=(1, 4), raw=[np.full((1, 4), value, np.float32).tobytes()])

    stats = service_pb2.ModelStatisticsRequest(name="slow")
    py_stub.ModelInfer(slow_request(0.0), timeout=30)  # runs after anything earlier tests left running
    before = py_stub.ModelStatistics(stats, timeout=30).model_stats[0].inference_count
    running = py_stub.ModelInfer.future(slow_request(1.0), timeout=30)  # occupies the only instance
    queued = py_stub.ModelInfer.future(slow_request(2.0), timeout=30)
    wait_inflight(python_server, "slow", 2)  # both admitted: the second waits behind the first
    queued.cancel()
    assert running.result().model_name == "slow"
    assert py_stub.ModelInfer(slow_request(3.0), timeout=30).model_name == "slow"
    after = py_stub.ModelStatistics(stats, timeout=30).model_stats[0].inference_count
    assert after - before == 2  # the cancelled request never ran


def _x(model: str, value: float = 1.0) -> Any:
    return _request(model=model, shape=(1, 4), raw=[np.full((1, 4), value, np.float32).tobytes()])


def test_model_failure_is_internal_without_detail(py_stub: Stub) -> None:
    code, details = _code(py_stub.ModelInfer, _x("boom"), timeout=30)
    assert code == grpc.StatusCode.INTERNAL
    assert "boom" in details
    assert "secret" not in details and "/internal" not in details and "Traceback" not in details


def test_full_queue_is_unavailable(python_server: ServerProcess, py_stub: Stub) -> None:
    running = py_stub.ModelInfer.future(_x("narrow"), timeout=30)
    queued = py_stub.ModelInfer.future(_x("narrow"), timeout=30)
    wait_inflight(python_server, "narrow", 2)  # one running, one filling the queue of one
    with pytest.raises(grpc.RpcError) as info:
        py_stub.ModelInfer.with_call(_x("narrow"), timeout=30)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert ("retry-after", "1") in tuple(info.value.trailing_metadata())
    assert running.result().model_name == queued.result().model_name == "narrow"


def test_undecodable_request_bytes_fail_alone(example_server: ServerProcess, stub: Stub) -> None:
    # Bytes that are no ModelInferRequest (a raw_input_contents entry longer than the message) are
    # the client's error: INVALID_ARGUMENT saying so (grpc's own answer would be UNKNOWN and the
    # exception's class), and the next request is served.
    channel = grpc.insecure_channel(example_server.grpc_address)
    try:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        good = _request().SerializeToString()
        with pytest.raises(grpc.RpcError) as info:
            infer(good[:-1], timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not a valid ModelInferRequest" in (info.value.details() or "")
        assert "class" not in (info.value.details() or "")
        assert len(stub.ModelInfer(_request(), timeout=30).raw_output_contents) == 1
    finally:
        channel.close()
