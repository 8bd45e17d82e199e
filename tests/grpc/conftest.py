"""gRPC fixtures. The tests speak to the server with ``tritonclient.grpc``'s own messages, not ours:
a field number that drifted from the protocol would fail here.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from grpc_helpers import build_python_repository, open_stub
from tritonclient.grpc import service_pb2_grpc

from tensorgate.testing import ServerProcess


@pytest.fixture(scope="module")
def python_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = build_python_repository(tmp_path_factory.mktemp("pyrepo"))
    with ServerProcess("--model-repository", str(repo), "--log-level", "warning") as server:
        yield server


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
