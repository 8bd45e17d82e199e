"""Tracing: W3C parentage from an incoming traceparent, sampling, error status, and the free no-op."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tensorgate.errors import InternalError, InvalidInput
from tensorgate.observability.tracing import NOOP_TRACER, Tracer, build_tracer
from tensorgate.types import InferRequest, InferResponse

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
SAMPLED = f"00-{TRACE_ID}-{PARENT_ID}-01"
NOT_SAMPLED = f"00-{TRACE_ID}-{PARENT_ID}-00"


@pytest.fixture()
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture()
def tracer(exporter: InMemorySpanExporter) -> Iterator[Tracer]:
    t = build_tracer("none", 1.0, span_exporter=exporter)
    yield t
    t.shutdown()


def _response() -> InferResponse:
    return InferResponse(model="m", version=1, outputs={"y": np.zeros(1)}, queue_s=0.002, compute_s=0.003)


def test_spans_follow_the_incoming_traceparent(tracer: Tracer, exporter: InMemorySpanExporter) -> None:
    with tracer.request("ModelInfer", SAMPLED, {"rpc.system": "grpc"}) as span:
        downstream = span.traceparent
        assert downstream is not None and downstream.startswith(f"00-{TRACE_ID}-")
        assert downstream.endswith("-01")
        span.record(_response())
        with span.child("encode"):
            pass
    with tracer.batch([InferRequest(model="m", inputs={}, traceparent=downstream)], rows=4):
        pass
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"ModelInfer", "queue", "compute", "encode", "batch"}
    root = spans["ModelInfer"]
    assert root.kind is SpanKind.SERVER
    assert root.context.trace_id == int(TRACE_ID, 16)
    assert root.parent is not None and root.parent.span_id == int(PARENT_ID, 16)
    assert downstream.split("-")[2] == format(root.context.span_id, "016x")
    for name in ("queue", "compute", "encode", "batch"):
        child = spans[name]
        assert child.context.trace_id == int(TRACE_ID, 16), name
        assert child.parent is not None and child.parent.span_id == root.context.span_id, name
    queue, compute = spans["queue"], spans["compute"]
    assert queue.end_time == compute.start_time  # reconstructed back to back from the response timings
    assert compute.end_time - compute.start_time == pytest.approx(3_000_000, abs=2)
    assert queue.end_time - queue.start_time == pytest.approx(2_000_000, abs=2)
    batch = spans["batch"]
    assert batch.attributes["tensorgate.batch_size"] == 4
    assert [link.context.span_id for link in batch.links] == [root.context.span_id]


def test_without_traceparent_a_new_trace_starts(tracer: Tracer, exporter: InMemorySpanExporter) -> None:
    with tracer.request("ModelInfer", None, {}) as span:
        assert span.traceparent is not None
    (root,) = exporter.get_finished_spans()
    assert root.parent is None


def test_a_malformed_traceparent_is_ignored(tracer: Tracer, exporter: InMemorySpanExporter) -> None:
    with tracer.request("ModelInfer", "00-zz-yy-01", {}):
        pass
    (root,) = exporter.get_finished_spans()
    assert root.parent is None


def test_sampling_ratio_and_the_clients_decision(exporter: InMemorySpanExporter) -> None:
    tracer = build_tracer("none", 0.0, span_exporter=exporter)
    try:
        with tracer.request("new", None, {}) as span:
            span.record(_response())
        with tracer.request("not-sampled", NOT_SAMPLED, {}):
            pass
        with tracer.request("sampled", SAMPLED, {}):
            pass
    finally:
        tracer.shutdown()
    assert [s.name for s in exporter.get_finished_spans()] == ["sampled"]  # parent-based: the client decides


def test_with_sampling_off_unsampled_requests_skip_the_sdk(exporter: InMemorySpanExporter) -> None:
    """Ratio 0: a request without a sampled traceparent gets the shared no-op (no span object, the
    client's traceparent passed on as it came), and so does a batch of only such requests."""
    tracer = build_tracer("none", 0.0, span_exporter=exporter)
    try:
        for incoming in (None, NOT_SAMPLED, "garbage"):
            with tracer.request("unsampled", incoming, {}) as span:
                assert span is NOOP_TRACER and span.traceparent is None
        with pytest.raises(InvalidInput), tracer.request("unsampled", None, {}):
            raise InvalidInput("errors still reach the caller")
        assert tracer.batch([InferRequest(model="m", inputs={}, traceparent=NOT_SAMPLED)], rows=1) is NOOP_TRACER
        with tracer.request("sampled", SAMPLED, {}) as span:
            downstream = span.traceparent
        unsampled = InferRequest(model="m", inputs={}, traceparent=NOT_SAMPLED)
        tracer.batch([unsampled, InferRequest(model="m", inputs={}, traceparent=downstream)], rows=2).end()
    finally:
        tracer.shutdown()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"sampled", "batch"}
    assert [link.context.span_id for link in spans["batch"].links] == [spans["sampled"].context.span_id]


def test_client_errors_are_not_span_errors(tracer: Tracer, exporter: InMemorySpanExporter) -> None:
    with pytest.raises(InvalidInput), tracer.request("bad", None, {}):
        raise InvalidInput("wrong shape")
    with pytest.raises(InternalError), tracer.request("fault", None, {}):
        raise InternalError("model failed")
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["bad"].status.status_code is StatusCode.UNSET
    assert spans["bad"].attributes["tensorgate.error_code"] == "invalid_argument"
    assert spans["fault"].status.status_code is StatusCode.ERROR


def test_exporter_none_is_a_shared_no_op() -> None:
    tracer = build_tracer("none", 1.0)
    assert tracer is NOOP_TRACER
    assert not tracer.enabled
    context = tracer.request("ModelInfer", SAMPLED, {})
    assert context is tracer.request("other", None, {})  # nothing is allocated per request
    with context as span:
        assert span.traceparent is None
        span.record(_response())
        assert span.child("encode") is span.child("other")
    assert tracer.batch(iter(()), 1) is tracer.batch(iter(()), 2)
