"""The standard gRPC health service and server reflection, as grpcurl and Kubernetes probes use them."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from tensorgate.testing import ServerProcess


@pytest.fixture()
def channel(example_server: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(example_server.grpc_address) as c:
        yield c


def _check(channel: grpc.Channel, service: str) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return int(stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status)


def test_health_check_server_and_models(channel: grpc.Channel) -> None:
    assert _check(channel, "") == health_pb2.HealthCheckResponse.SERVING
    assert _check(channel, "mlp") == health_pb2.HealthCheckResponse.SERVING
    assert _check(channel, "cnn") == health_pb2.HealthCheckResponse.SERVING
    # The health convention's fully qualified service name is the server, as Triton answers it.
    assert _check(channel, "inference.GRPCInferenceService") == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as info:
        _check(channel, "nope")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_health_watch_reports_the_current_status(channel: grpc.Channel) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    stream = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
    try:
        assert next(stream).status == health_pb2.HealthCheckResponse.SERVING
    finally:
        stream.cancel()


def test_reflection_lists_and_describes_the_services(channel: grpc.Channel) -> None:
    database = ProtoReflectionDescriptorDatabase(channel)
    services = set(database.get_services())
    assert {"inference.GRPCInferenceService", "grpc.health.v1.Health"} <= services
    pool = DescriptorPool(database)  # a pool of its own: tritonclient holds the same names in the default one
    service = pool.FindServiceByName("inference.GRPCInferenceService")
    methods = {m.name for m in service.methods}
    assert {"ModelInfer", "ModelStreamInfer", "ModelConfig", "ModelStatistics", "ServerReady"} <= methods
    health = pool.FindServiceByName("grpc.health.v1.Health")
    assert {m.name for m in health.methods} >= {"Check", "Watch"}
