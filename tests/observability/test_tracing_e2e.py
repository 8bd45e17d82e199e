"""A real server with ``--trace-exporter console``: a gRPC request's spans continue the caller's trace."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tensorgate.cli.serve import add_arguments, build_config
from tensorgate.testing import ServerProcess

pytest.importorskip("opentelemetry.sdk")

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"


def _json_objects(text: str) -> list[dict[str, Any]]:
    """The console exporter prints one indented JSON object per span, between log lines."""
    decoder = json.JSONDecoder()
    found = []
    lines = text.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    for index, line in enumerate(lines):
        if line.rstrip() == "{":
            try:
                document, _ = decoder.raw_decode(text, offsets[index])
            except ValueError:
                continue
            found.append(document)
    return found


def test_grpc_request_spans_continue_the_callers_trace(example_repo: Path) -> None:
    with ServerProcess("--model-repository", str(example_repo), "--trace-exporter", "console") as server:
        with grpc.insecure_channel(server.grpc_address) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            message = service_pb2.ModelInferRequest(model_name="mlp")
            message.inputs.add(name="features", datatype="FP32", shape=[1, 16])
            message.raw_input_contents.append(np.ones((1, 16), np.float32).tobytes())
            stub.ModelInfer(message, metadata=(("traceparent", f"00-{TRACE_ID}-{PARENT_ID}-01"),), timeout=30)
        assert server.stop() == 0  # the exporter flushes at shutdown
        spans = [s for s in _json_objects(server.log()) if s.get("context", {}).get("trace_id") == f"0x{TRACE_ID}"]
    by_name = {s["name"]: s for s in spans}
    assert {"ModelInfer", "queue", "compute", "encode"} <= set(by_name)
    root = by_name["ModelInfer"]
    assert root["parent_id"] == f"0x{PARENT_ID}"
    assert root["kind"] == "SpanKind.SERVER"
    for name in ("queue", "compute", "encode"):
        assert by_name[name]["parent_id"] == root["context"]["span_id"]


def test_trace_flags_reach_the_config() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config, _, _ = build_config(parser.parse_args(["--trace-exporter", "otlp", "--trace-sample-ratio", "0.25"]))
    assert config.server.trace_exporter == "otlp"
    assert config.server.trace_sample_ratio == 0.25
    default, _, _ = build_config(parser.parse_args([]))
    assert default.server.trace_exporter == "none"
    assert default.server.trace_sample_ratio == 1.0
