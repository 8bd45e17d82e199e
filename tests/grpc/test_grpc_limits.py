"""gRPC message limits and models that cannot serve: RESOURCE_EXHAUSTED and UNAVAILABLE, as the table says."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tensorgate.testing import ServerProcess

LIMIT = 1 << 20  # 1 MiB for gRPC messages, while HTTP keeps its default 64 MiB

ECHO = """
    import numpy as np
    from tensorgate import PythonModel

    class Echo(PythonModel):
        def execute(self, inputs):
            return {"y": np.array(inputs["x"], copy=True)}
"""
GROW = """
    import numpy as np
    from tensorgate import PythonModel

    class Grow(PythonModel):
        def execute(self, inputs):
            return {"y": np.tile(inputs["x"], 4)}
"""
BROKEN = """
    from tensorgate import PythonModel

    class Broken(PythonModel):
        def load(self, context):
            raise RuntimeError("weights are missing")
"""
CONFIG = """
    backend: python
    max_batch_size: 0
    inputs: [{name: x, datatype: FP32, shape: [-1]}]
    outputs: [{name: y, datatype: FP32, shape: [-1]}]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo: Path = tmp_path_factory.mktemp("limits")
    for name, code in (("echo", ECHO), ("grow", GROW), ("broken", BROKEN)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(textwrap.dedent(code))
        (repo / name / "config.yaml").write_text(textwrap.dedent(CONFIG))
    args = ("--model-repository", str(repo), "--grpc-max-message-bytes", str(LIMIT))
    with ServerProcess(*args, wait_ready=False) as process:
        process.wait_loaded()  # never ready: one model fails to load
        yield process


@pytest.fixture()
def stub(server: ServerProcess) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    options = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
    with grpc.insecure_channel(server.grpc_address, options=options) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _echo(elements: int, model: str = "echo", version: str = "") -> service_pb2.ModelInferRequest:
    message = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    message.inputs.add(name="x", datatype="FP32", shape=[elements])
    message.raw_input_contents.append(np.arange(elements, dtype=np.float32).tobytes())
    return message


def test_a_message_over_the_configured_limit_is_resource_exhausted(
    server: ServerProcess, stub: service_pb2_grpc.GRPCInferenceServiceStub
) -> None:
    response = stub.ModelInfer(_echo(LIMIT // 4 - 1024), timeout=30)  # just under 1 MiB goes through
    assert response.outputs[0].shape == [LIMIT // 4 - 1024]
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(_echo(LIMIT // 4 + 1024), timeout=30)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # The same tensor over HTTP is under its own (default) limit.
    body = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [LIMIT // 4 + 1024], "data": [0.0] * (LIMIT // 4 + 1024)}]
    }
    assert httpx.post(f"{server.url}/v2/models/echo/infer", json=body, timeout=30).status_code == 200
    assert stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=30).live


def test_the_limit_bounds_requests_not_answers(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    """A request under the limit whose answer is over it is answered (as Triton, whose send limit is
    protobuf's): the limit bounds what a client makes the server allocate, not what a model returns."""
    elements = LIMIT // 8  # half the limit in; twice the limit out
    response = stub.ModelInfer(_echo(elements, "grow"), timeout=30)
    out = np.frombuffer(response.raw_output_contents[0], np.float32)
    np.testing.assert_array_equal(out, np.tile(np.arange(elements, dtype=np.float32), 4))


@pytest.mark.parametrize(
    ("version", "message"),
    [
        ("", "Request for unknown model: 'broken' has no available versions"),
        ("1", "Request for unknown model: 'broken' version 1 is not at ready state (FAILED)"),
    ],
)
def test_a_model_that_failed_to_load_is_unavailable(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, version: str, message: str
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(_echo(4, "broken", version), timeout=30)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert message in info.value.details()
    ready = stub.ModelReady(service_pb2.ModelReadyRequest(name="broken"), timeout=30)
    assert not ready.ready
    assert not stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=30).ready
