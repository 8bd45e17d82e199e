"""The chunks of a sequence as each tensor protocol carries them, with Triton's sequence parameters.

A chunk differs from the next only in its parameters (``sequence_id``, ``sequence_start``,
``sequence_end``), so the tensor part of each request variant is encoded once and only the
parameters are encoded per chunk:

- gRPC: a ``ModelInferRequest`` serializes its fields in field-number order, and ``parameters``
  (field 4) sits between the model's name and version (1, 2) and the inputs (5, 7); the head and the
  tail are serialized once, the parameters per chunk, and the three concatenated are exactly the
  bytes protobuf would write for the whole message (a test checks them against tritonclient's);
- HTTP: the V2 JSON header with the parameters is written per chunk (it is small: the tensor data
  stays in the binary part, or is pre-encoded JSON spliced in).

Pure functions over bytes, tested without a server.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from tensorgate.bench.grpc_client import framed
from tensorgate.bench.http_client import encode_request
from tensorgate.bench.inputs import RequestTensors
from tensorgate.bench.targets.base import Endpoint
from tensorgate.bench.targets.encoding import json_data, raw_bytes
from tensorgate.bench.targets.grpc_v2 import stubs
from tensorgate.bench.targets.http_tensor import model_path

SequenceId = int | str


def sequence_parameters(sequence_id: SequenceId, start: bool, end: bool) -> dict[str, Any]:
    """Triton's request parameters for one chunk, as its clients send them."""
    return {"sequence_id": sequence_id, "sequence_start": start, "sequence_end": end}


class GrpcChunks:
    """Serialized ``ModelInferRequest``s: one variant's tensors with one chunk's parameters."""

    def __init__(self, model: str, version: str | None, variants: Sequence[RequestTensors]) -> None:
        if not variants:
            raise ValueError("no requests to send")
        service_pb2, _ = stubs()
        self._message = service_pb2.ModelInferRequest
        self._head = bytes(self._message(model_name=model, model_version=version or "").SerializeToString())
        self._tails = []
        for tensors in variants:
            tail = self._message()
            for tensor in tensors:
                entry = tail.inputs.add()
                entry.name = tensor.name
                entry.datatype = tensor.datatype
                entry.shape.extend(tensor.array.shape)
                tail.raw_input_contents.append(raw_bytes(tensor))
            self._tails.append(bytes(tail.SerializeToString()))

    def __len__(self) -> int:
        return len(self._tails)

    def parameters(self, sequence_id: SequenceId, start: bool, end: bool) -> bytes:
        """Field 4 alone: tritonclient's types (``int64_param`` for an integer id, ``string_param``
        for a string, ``bool_param`` for the flags)."""
        message = self._message()
        if isinstance(sequence_id, str):
            message.parameters["sequence_id"].string_param = sequence_id
        else:
            message.parameters["sequence_id"].int64_param = sequence_id
        message.parameters["sequence_start"].bool_param = start
        message.parameters["sequence_end"].bool_param = end
        return bytes(message.SerializeToString())

    def message(self, variant: int, sequence_id: SequenceId, start: bool, end: bool) -> bytes:
        """The request's serialized message (unframed)."""
        return self._head + self.parameters(sequence_id, start, end) + self._tails[variant % len(self._tails)]

    def framed(self, variant: int, sequence_id: SequenceId, start: bool, end: bool) -> bytes:
        """The message as a unary call's body carries it (length-prefixed)."""
        return framed(self.message(variant, sequence_id, start, end))


class HttpChunks:
    """Whole HTTP/1.1 ``POST .../infer`` requests, V2 binary (Triton's extension) or V2 JSON."""

    def __init__(
        self, endpoint: Endpoint, model: str, version: str | None, variants: Sequence[RequestTensors], binary: bool
    ) -> None:
        if not variants:
            raise ValueError("no requests to send")
        self._authority = endpoint.authority
        self._path = model_path(endpoint, "v2", model, version) + "/infer"
        self._headers = endpoint.request_headers
        self._binary = binary
        # binary: (JSON of the inputs' descriptions, the raw tensors); JSON: the inputs' JSON.
        self._variants: list[tuple[bytes, bytes]] = []
        for tensors in variants:
            if binary:
                blobs = [raw_bytes(t) for t in tensors]
                described = [
                    {
                        "name": t.name,
                        "datatype": t.datatype,
                        "shape": list(t.array.shape),
                        "parameters": {"binary_data_size": len(blob)},
                    }
                    for t, blob in zip(tensors, blobs, strict=True)
                ]
                self._variants.append((orjson.dumps(described), b"".join(blobs)))
            else:
                inputs = [
                    {"name": t.name, "datatype": t.datatype, "shape": list(t.array.shape), "data": json_data(t)}
                    for t in tensors
                ]
                self._variants.append((orjson.dumps(inputs), b""))

    def __len__(self) -> int:
        return len(self._variants)

    def body(self, variant: int, sequence_id: SequenceId, start: bool, end: bool) -> tuple[bytes, int | None]:
        """The body, and (binary) the length of its JSON header."""
        inputs, blobs = self._variants[variant % len(self._variants)]
        parameters = sequence_parameters(sequence_id, start, end)
        if self._binary:
            parameters["binary_data_output"] = True
        header = b'{"inputs":' + inputs + b',"parameters":' + orjson.dumps(parameters) + b"}"
        return (header + blobs, len(header)) if self._binary else (header, None)

    def request(self, variant: int, sequence_id: SequenceId, start: bool, end: bool) -> bytes:
        body, header_length = self.body(variant, sequence_id, start, end)
        if header_length is None:
            headers = (("Content-Type", "application/json"), *self._headers)
        else:
            headers = (
                ("Content-Type", "application/octet-stream"),
                ("Inference-Header-Content-Length", str(header_length)),
                *self._headers,
            )
        return encode_request("POST", self._authority, self._path, body, headers)
