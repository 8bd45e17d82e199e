"""Before the clock starts: what each request carries, from metadata, an input file or a prompt.

Talks to the server once (model metadata) with a plain client; the load itself goes through
the targets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from tensorgate.bench.inputs import RequestTensors, TensorMeta, parse_metadata, synthesize, tensors_from_v2
from tensorgate.bench.targets.base import Endpoint, is_grpc
from tensorgate.bench.targets.grpc_v2 import fetch_metadata
from tensorgate.bench.targets.http_tensor import model_path
from tensorgate.bench.targets.openai import chat_body, completion_body

# Distinct synthesized requests cycled through, so a server-side cache of one body proves nothing.
VARIANTS = 8


def http_metadata(endpoint: Endpoint, model: str, version: str | None, timeout_s: float) -> list[TensorMeta]:
    scheme = "https" if endpoint.tls else "http"
    url = f"{scheme}://{endpoint.authority}{model_path(endpoint, 'v2', model, version)}"
    verify = endpoint.ssl_context("http/1.1") or True
    import httpx  # the bench extra's, imported here so that the ``tensorgate`` command does not need it

    try:
        response = httpx.get(url, timeout=timeout_s, headers=dict(endpoint.request_headers), verify=verify)
    except httpx.HTTPError as exc:
        raise RuntimeError(f"cannot fetch model metadata from {url}: {exc}") from exc
    if response.status_code != 200:
        raise RuntimeError(
            f"model metadata at {url} answered {response.status_code}: {response.text[:200]} "
            "(a server without V2 metadata needs --input-file)"
        )
    return parse_metadata(response.json())


def model_inputs(
    protocol: str, endpoint: Endpoint, model: str, version: str | None, timeout_s: float
) -> list[TensorMeta]:
    """The model's inputs: over gRPC for the gRPC protocols, else from the V2 HTTP metadata endpoint (V1
    has none)."""
    if is_grpc(protocol):
        return asyncio.run(fetch_metadata(endpoint, model, version, timeout_s))
    return http_metadata(endpoint, model, version, timeout_s)


def tensor_requests(
    file_requests: Sequence[Mapping[str, Any]] | None,
    metas: Sequence[TensorMeta] | None,
    batch_size: int,
    shapes: Mapping[str, tuple[int, ...]],
    seed: int,
) -> list[RequestTensors]:
    if file_requests is not None:
        return [tensors_from_v2(r) for r in file_requests]
    assert metas is not None
    return synthesize(metas, batch_size, shapes, seed, VARIANTS)


def openai_requests(
    file_requests: Sequence[Mapping[str, Any]] | None, chat: bool, model: str, prompt: str, max_tokens: int
) -> list[dict[str, Any]]:
    if file_requests is not None:
        return [{"model": model, **r, "stream": True} for r in file_requests]
    return [(chat_body if chat else completion_body)(model, prompt, max_tokens)]
