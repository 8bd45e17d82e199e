"""A received ``ModelInferRequest`` with its ``raw_input_contents`` left in the received buffer.

upb copies a bytes field when it parses a message and again each time Python reads it: for a
600 KB image, two copies on the event loop per request, a quarter of what gRPC's own receive
path copies. The raw tensors are the bulk of the message and need no parsing, so the request
deserializer lifts them out as views of the buffer gRPC handed over and gives upb only the rest
(names, shapes, parameters: a few hundred bytes).

Protobuf's wire format makes this safe to do at the top level: a message is a sequence of
(key, value) fields, a repeated field's entries keep their order however they are interleaved
with other fields, and parsing the remaining fields yields the message without that one field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from tensorgate.protocols.grpc.generated import grpc_service_pb2 as pb

RAW_INPUT_CONTENTS = 7  # ModelInferRequest.raw_input_contents in grpc_service.proto
_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5


@dataclass(frozen=True, slots=True)
class ReceivedInfer:
    message: Any  # the ModelInferRequest, without its raw_input_contents
    raw: list[memoryview]  # raw_input_contents, in order: views of the received bytes
    error: str | None = None  # why the bytes are no ModelInferRequest (the message is then empty)


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while shift < 64:
        if pos >= len(data):
            raise DecodeError("truncated message: a varint runs past its end")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise DecodeError("malformed message: a varint longer than 10 bytes")


def receive_infer_request(data: bytes) -> ReceivedInfer:
    """The request deserializer of ModelInfer and ModelStreamInfer.

    Never raises: grpc answers a deserializer's exception with UNKNOWN and the exception's class
    name, where undecodable bytes are the client's error, INVALID_ARGUMENT (the servicer's to say).
    """
    try:
        return parse_infer_request(data)
    except DecodeError as exc:
        return ReceivedInfer(pb.ModelInferRequest(), [], f"the request is not a valid ModelInferRequest: {exc}")


def parse_infer_request(data: bytes) -> ReceivedInfer:
    """Split ``data``; raises DecodeError where upb would."""
    view = memoryview(data)
    raw: list[memoryview] = []
    rest: list[memoryview] = []
    kept_from = pos = 0
    end = len(view)
    while pos < end:
        start = pos
        key, pos = _varint(view, pos)
        wire_type = key & 7
        if wire_type == _VARINT:
            _, pos = _varint(view, pos)
        elif wire_type == _FIXED64:
            pos += 8
        elif wire_type == _FIXED32:
            pos += 4
        elif wire_type == _LENGTH_DELIMITED:
            length, pos = _varint(view, pos)
            if key >> 3 == RAW_INPUT_CONTENTS and pos + length <= end:
                rest.append(view[kept_from:start])
                raw.append(view[pos : pos + length])
                kept_from = pos + length
            pos += length
        else:  # groups (wire types 3 and 4) are not proto3: upb judges the whole message
            return _parsed_whole(data)
    if pos > end:
        raise DecodeError("truncated message: a field runs past its end")
    if not raw:  # typed contents, or no inputs: nothing to lift out
        return ReceivedInfer(pb.ModelInferRequest.FromString(data), [])
    rest.append(view[kept_from:])
    return ReceivedInfer(pb.ModelInferRequest.FromString(b"".join(rest)), raw)


def _parsed_whole(data: bytes) -> ReceivedInfer:
    message = pb.ModelInferRequest.FromString(data)
    return ReceivedInfer(message, [memoryview(entry) for entry in message.raw_input_contents])
