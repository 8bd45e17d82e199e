"""Tracing through a real server in this process, spans caught by an in-memory exporter.

An HTTP request and a gRPC request, each with a client's ``traceparent``: the server's spans join
the client's trace, the request span is the parent of queue, compute, encode and the batch, and
the batch carries its size.
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tensorgate.config.server_config import ServerConfig, ServerSection
from tensorgate.observability.tracing import build_tracer
from tensorgate.server import Server

TRACE_ID = "5c2a1f93b7e04d6a8f1e2d3c4b5a6978"
HTTP_PARENT = "1111111111111111"
GRPC_PARENT = "2222222222222222"


@pytest.fixture(params=[1.0])
async def traced(
    example_repo: Path, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[Server, InMemorySpanExporter]]:
    """A server tracing new traces at the ratio given as the parameter (1 unless a test says)."""
    exporter = InMemorySpanExporter()
    section = ServerSection(
        model_repository=example_repo, http_port=0, grpc_port=0, metrics_port=None, access_log=False
    )
    tracer = build_tracer("none", request.param, span_exporter=exporter)
    server = Server(ServerConfig(server=section), tracer=tracer)
    thresholds = gc.get_threshold()
    try:
        await server.start()
        yield server, exporter
    finally:
        await server.shutdown()
        gc.unfreeze()  # the server tunes the collector for serving; this process goes on testing
        gc.set_threshold(*thresholds)


def _trace(exporter: InMemorySpanExporter, parent: str) -> dict[str, ReadableSpan]:
    """The spans of the request whose client span is ``parent``, by name (its batch included)."""
    spans = [
        s for s in exporter.get_finished_spans() if s.context is not None and s.context.trace_id == int(TRACE_ID, 16)
    ]
    roots = [s for s in spans if s.parent is not None and s.parent.span_id == int(parent, 16)]
    assert len(roots) == 1, [s.name for s in spans]
    root = roots[0]
    assert root.context is not None
    children = {s.name: s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id}
    return {"request": root, **children}


async def test_http_and_grpc_requests_continue_the_callers_trace(
    traced: tuple[Server, InMemorySpanExporter],
) -> None:
    server, exporter = traced
    body = {"inputs": [{"name": "features", "shape": [2, 16], "datatype": "FP32", "data": [0.5] * 32}]}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.ports['http']}") as http:
        answer = await http.post(
            "/v2/models/mlp/infer", json=body, headers={"traceparent": f"00-{TRACE_ID}-{HTTP_PARENT}-01"}
        )
    assert answer.status_code == 200
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.ports['grpc']}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        message = service_pb2.ModelInferRequest(model_name="mlp")
        message.inputs.add(name="features", datatype="FP32", shape=[3, 16])
        message.raw_input_contents.append(np.ones((3, 16), np.float32).tobytes())
        await stub.ModelInfer(message, metadata=(("traceparent", f"00-{TRACE_ID}-{GRPC_PARENT}-01"),), timeout=30)
    # Every span has ended before its answer left: the batch's when the batch ended, the request's
    # (and its encode child) when the answer was encoded, and the exporter here is synchronous.

    for parent, name, rows in ((HTTP_PARENT, "POST infer", 2), (GRPC_PARENT, "ModelInfer", 3)):
        spans = _trace(exporter, parent)
        assert spans["request"].name == name and spans["request"].kind is SpanKind.SERVER
        assert {"queue", "compute", "encode", "batch"} <= set(spans), (name, sorted(spans))
        assert spans["batch"].attributes is not None and spans["batch"].attributes["tensorgate.batch_size"] == rows
        request, encode = spans["request"], spans["encode"]
        assert request.start_time is not None and request.end_time is not None
        assert encode.start_time is not None and encode.end_time is not None
        assert request.start_time <= encode.start_time <= encode.end_time <= request.end_time


@pytest.mark.parametrize("traced", [0.0], indirect=True)
async def test_with_sampling_off_only_a_sampled_callers_request_is_traced(
    traced: tuple[Server, InMemorySpanExporter],
) -> None:
    """Ratio 0: requests without a sampled traceparent leave no span at all (nor does their batch);
    one the caller marks sampled is traced end to end."""
    server, exporter = traced
    body = {"inputs": [{"name": "features", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.ports['http']}") as http:
        for headers in ({}, {"traceparent": f"00-{TRACE_ID}-{HTTP_PARENT}-00"}):
            assert (await http.post("/v2/models/mlp/infer", json=body, headers=headers)).status_code == 200
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.ports['grpc']}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            message = service_pb2.ModelInferRequest(model_name="mlp")
            message.inputs.add(name="features", datatype="FP32", shape=[1, 16])
            message.raw_input_contents.append(np.ones((1, 16), np.float32).tobytes())
            await stub.ModelInfer(message, timeout=30)
        assert exporter.get_finished_spans() == ()
        sampled = {"traceparent": f"00-{TRACE_ID}-{HTTP_PARENT}-01"}
        assert (await http.post("/v2/models/mlp/infer", json=body, headers=sampled)).status_code == 200
    spans = _trace(exporter, HTTP_PARENT)
    assert {"queue", "compute", "encode", "batch"} <= set(spans), sorted(spans)
