"""gRPC fixtures: Triton's generated stubs (tritonclient ships them), and a server over tiny Python models.

The tests speak to the server with ``tritonclient.grpc``'s own messages, not ours: a field number
that drifted from the protocol would fail here.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tensorgate.testing import ServerProcess

MODEL_PY = {
    # Sleeps for the number of seconds in its config parameter "delay_s": a model that is slow on demand.
    "slow": """
        import time
        import numpy as np
        from tensorgate import PythonModel

        class Slow(PythonModel):
            def load(self, context):
                self.delay = float(context.parameters.get("delay_s", 0.5))

            def execute(self, inputs):
                time.sleep(self.delay)
                return {"y": np.asarray(inputs["x"]) * 2}
    """,
    "identity": """
        import numpy as np
        from tensorgate import PythonModel

        class Identity(PythonModel):
            def execute(self, inputs):
                return {"y": np.array(inputs["x"], copy=True)}
    """,
}

CONFIG_YAML = {
    "slow": """
        backend: python
        max_batch_size: 8
        parameters: {delay_s: 0.5}
        inputs: [{name: x, datatype: FP32, shape: [-1, 4]}]
        outputs: [{name: y, datatype: FP32, shape: [-1, 4]}]
    """,
    "identity": """
        backend: python
        max_batch_size: 1
        inputs: [{name: x, datatype: FP32, shape: [-1, 640, 640, 3]}]
        outputs: [{name: y, datatype: FP32, shape: [-1, 640, 640, 3]}]
    """,
}


def build_python_repository(root: Path) -> Path:
    for name, source in MODEL_PY.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(textwrap.dedent(source))
        (root / name / "config.yaml").write_text(textwrap.dedent(CONFIG_YAML[name]))
    return root


@pytest.fixture(scope="module")
def python_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = build_python_repository(tmp_path_factory.mktemp("pyrepo"))
    with ServerProcess("--model-repository", str(repo), "--log-level", "warning") as server:
        yield server


def open_stub(server: ServerProcess) -> tuple[grpc.Channel, service_pb2_grpc.GRPCInferenceServiceStub]:
    channel = grpc.insecure_channel(
        server.grpc_address,
        options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)],
    )
    return channel, service_pb2_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture()
def stub(example_server: ServerProcess) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    channel, s = open_stub(example_server)
    yield s
    channel.close()


@pytest.fixture()
def py_stub(python_server: ServerProcess) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    channel, s = open_stub(python_server)
    yield s
    channel.close()


__all__ = ["service_pb2"]
