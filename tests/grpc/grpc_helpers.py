"""Helpers for the gRPC tests: a repository of tiny Python models, stubs, waiting on server metrics."""

from __future__ import annotations

import re
import textwrap
import time
from pathlib import Path

import grpc
import httpx
from tritonclient.grpc import service_pb2_grpc

from tensorgate.testing import ServerProcess

MODEL_PY = {
    # Sleeps for the number of seconds in its config parameter "delay_s": a model that is slow on demand.
    "slow": """
        import time
        import numpy as np
        from tensorgate import PythonModel

        class Slow(PythonModel):
            def load(self, context):
                self.delay = float(context.parameters.get("delay_s", 1.0))

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
    "boom": """
        from tensorgate import PythonModel

        class Boom(PythonModel):
            def execute(self, inputs):
                raise RuntimeError("secret detail from /internal/path")
    """,
}
MODEL_PY["narrow"] = MODEL_PY["slow"]  # slow, with a queue of one

CONFIG_YAML = {
    "slow": """
        backend: python
        max_batch_size: 8
        parameters: {delay_s: 1.0}
        inputs: [{name: x, datatype: FP32, shape: [-1, 4]}]
        outputs: [{name: y, datatype: FP32, shape: [-1, 4]}]
    """,
    "narrow": """
        backend: python
        max_batch_size: 1
        parameters: {delay_s: 1.0}
        dynamic_batching: {max_queue_size: 1}
        inputs: [{name: x, datatype: FP32, shape: [-1, 4]}]
        outputs: [{name: y, datatype: FP32, shape: [-1, 4]}]
    """,
    "boom": """
        backend: python
        max_batch_size: 8
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


def wait_inflight(server: ServerProcess, model: str, count: int, timeout_s: float = 20.0) -> None:
    """Wait until the server has admitted ``count`` requests for ``model`` (its in-flight gauge), with a deadline."""
    pattern = re.compile(rf'^tensorgate_inflight_requests\{{[^}}]*model="{re.escape(model)}"[^}}]*\}} (\S+)$', re.M)
    deadline = time.monotonic() + timeout_s
    while True:
        match = pattern.search(httpx.get(server.metrics_url, timeout=5).text)
        if match is not None and float(match.group(1)) >= count:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{model} never had {count} requests in flight")
        time.sleep(0.01)


def open_stub(server: ServerProcess) -> tuple[grpc.Channel, service_pb2_grpc.GRPCInferenceServiceStub]:
    channel = grpc.insecure_channel(
        server.grpc_address,
        options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)],
    )
    return channel, service_pb2_grpc.GRPCInferenceServiceStub(channel)
