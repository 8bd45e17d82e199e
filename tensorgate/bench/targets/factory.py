"""``--protocol`` to a target: encodes every request variant once, before the clock starts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tensorgate.bench.inputs import RequestTensors
from tensorgate.bench.targets.base import Endpoint, Target, is_grpc
from tensorgate.bench.targets.grpc_v2 import GrpcStreamTarget, GrpcTarget, infer_request_bytes
from tensorgate.bench.targets.http_tensor import HttpTensorTarget, encode_v1, encode_v2_binary, encode_v2_json
from tensorgate.bench.targets.openai import OpenAiTarget
from tensorgate.clock import Clock

_HTTP_ENCODERS = {"v2-json": encode_v2_json, "v2-binary": encode_v2_binary, "v1": encode_v1}


def is_streaming(protocol: str) -> bool:
    return protocol.startswith("openai-")


def build_target(
    protocol: str,
    endpoint: Endpoint,
    model: str,
    version: str | None,
    tensors: Sequence[RequestTensors],
    documents: Sequence[Mapping[str, Any]],
    clock: Clock,
) -> Target:
    """``tensors`` feed the tensor protocols, ``documents`` (request bodies) the OpenAI ones."""
    if protocol in _HTTP_ENCODERS:
        encode = _HTTP_ENCODERS[protocol]
        return HttpTensorTarget(endpoint, [encode(endpoint, model, version, t) for t in tensors])
    if is_grpc(protocol):
        target = GrpcStreamTarget if protocol == "grpc-stream" else GrpcTarget
        return target(endpoint, [infer_request_bytes(model, version, t) for t in tensors])
    if is_streaming(protocol):
        return OpenAiTarget(endpoint, documents, protocol == "openai-chat", clock)
    raise ValueError(f"unknown protocol {protocol!r}")
