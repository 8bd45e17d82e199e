"""SIGTERM with a gRPC call in flight: GOAWAY for new calls, the running call finishes, exit 0."""

from __future__ import annotations

import signal
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_helpers import build_python_repository, open_stub, wait_inflight
from tritonclient.grpc import service_pb2

from tensorgate.testing import ServerProcess


def test_in_flight_call_finishes_on_sigterm(tmp_path: Path) -> None:
    repo = build_python_repository(tmp_path)
    with ServerProcess("--model-repository", str(repo), "--exit-timeout", "20") as server:
        channel, stub = open_stub(server)
        try:
            message = service_pb2.ModelInferRequest(model_name="slow")
            message.inputs.add(name="x", datatype="FP32", shape=[1, 4])
            message.raw_input_contents.append(np.ones((1, 4), np.float32).tobytes())
            health = health_pb2_grpc.HealthStub(channel)
            assert (
                health.Check(health_pb2.HealthCheckRequest(), timeout=10).status
                == health_pb2.HealthCheckResponse.SERVING
            )
            call = stub.ModelInfer.future(message, timeout=30)
            wait_inflight(server, "slow", 1)
            server.signal(signal.SIGTERM)
            try:
                response = call.result()
            except grpc.RpcError as exc:  # seen once in a parallel run, never reproduced: keep the evidence
                pytest.fail(f"the in-flight call failed: {exc}\nserver log:\n{server.log()[-4000:]}")
            assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [2.0] * 4
            assert call.code() == grpc.StatusCode.OK
        finally:
            channel.close()
        assert server.stop() == 0, server.log()[-4000:]
        assert '"level":"error"' not in server.log(), server.log()[-4000:]
