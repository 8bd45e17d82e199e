"""V2 (JSON and binary tensors) and V1 ``:predict`` over HTTP/1.1: pre-encoded requests, status-only answers.

Every distinct request is encoded once at start-up into the full HTTP request bytes, so the hot
loop costs one socket write and one C-parsed response. Responses are judged by status: a load
generator that decoded every output tensor would measure itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import quote

import orjson

from tensorgate.bench.http_client import ConnectionPool, encode_request
from tensorgate.bench.inputs import RequestTensors
from tensorgate.bench.targets.base import Endpoint, Outcome
from tensorgate.bench.targets.encoding import json_data, nested_data, raw_bytes


def model_path(endpoint: Endpoint, api: str, model: str, version: str | None) -> str:
    path = f"{endpoint.prefix}/{api}/models/{quote(model, safe='')}"
    return path if version is None else f"{path}/versions/{quote(version, safe='')}"


def v2_json_body(tensors: RequestTensors) -> bytes:
    inputs = [
        {"name": t.name, "datatype": t.datatype, "shape": list(t.array.shape), "data": json_data(t)} for t in tensors
    ]
    return orjson.dumps({"inputs": inputs})


def v2_binary_body(tensors: RequestTensors) -> tuple[bytes, int]:
    """Triton's binary extension: JSON header, then raw tensors; returns the body and the header length."""
    blobs = [raw_bytes(t) for t in tensors]
    inputs = [
        {
            "name": t.name,
            "datatype": t.datatype,
            "shape": list(t.array.shape),
            "parameters": {"binary_data_size": len(blob)},
        }
        for t, blob in zip(tensors, blobs, strict=True)
    ]
    header = orjson.dumps({"inputs": inputs, "parameters": {"binary_data_output": True}})
    return b"".join([header, *blobs]), len(header)


def v1_body(tensors: RequestTensors) -> bytes:
    if len(tensors) == 1:
        return orjson.dumps({"instances": nested_data(tensors[0])})
    return orjson.dumps({"inputs": {t.name: nested_data(t) for t in tensors}})


def encode_v2_json(endpoint: Endpoint, model: str, version: str | None, tensors: RequestTensors) -> bytes:
    path = model_path(endpoint, "v2", model, version) + "/infer"
    headers = (("Content-Type", "application/json"), *endpoint.request_headers)
    return encode_request("POST", endpoint.authority, path, v2_json_body(tensors), headers)


def encode_v2_binary(endpoint: Endpoint, model: str, version: str | None, tensors: RequestTensors) -> bytes:
    body, header_length = v2_binary_body(tensors)
    path = model_path(endpoint, "v2", model, version) + "/infer"
    headers = (
        ("Content-Type", "application/octet-stream"),
        ("Inference-Header-Content-Length", str(header_length)),
        *endpoint.request_headers,
    )
    return encode_request("POST", endpoint.authority, path, body, headers)


def encode_v1(endpoint: Endpoint, model: str, version: str | None, tensors: RequestTensors) -> bytes:
    path = model_path(endpoint, "v1", model, version) + ":predict"
    headers = (("Content-Type", "application/json"), *endpoint.request_headers)
    return encode_request("POST", endpoint.authority, path, v1_body(tensors), headers)


class HttpTensorTarget:
    """Sends pre-encoded requests over a keep-alive pool; any status but 200 is an error."""

    def __init__(self, endpoint: Endpoint, requests: Sequence[bytes]) -> None:
        if not requests:
            raise ValueError("no requests to send")
        self._pool = ConnectionPool(endpoint.host, endpoint.port, endpoint.ssl_context("http/1.1"))
        self._requests = list(requests)

    async def call(self, index: int) -> Outcome:
        response = await self._pool.request(self._requests[index % len(self._requests)])
        return Outcome(None if response.status == 200 else f"http {response.status}")

    async def aclose(self) -> None:
        await self._pool.aclose()
