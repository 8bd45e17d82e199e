"""Inputs the fuzzers found that broke a decoder, kept as plain tests after their fixes.

- A shape with a zero dimension and others past numpy's limit (``[0, 2**62]``): the element count
  is 0, so it passed the count check, and numpy's reshape raised ValueError (HTTP 500, gRPC
  INTERNAL). Fixed in ``tensor_codec.parse_shape``.
- V1 BYTES ``{"b64": "<non-ASCII text>"}``: ``base64.b64decode`` raises ValueError, not
  binascii.Error, for a str with non-ASCII characters (HTTP 500). Fixed in ``v1_codec``.
- V1 values past FP16/FP32's range warned (RuntimeWarning on every such request) where V2 reads
  them as +/-inf quietly. Fixed in ``v1_codec``.
- HTTP/2: a stream the connection resets for the client's protocol error (a second HEADERS without
  END_STREAM, DATA past END_STREAM or the stream's window, a bad WINDOW_UPDATE) left its gRPC call
  waiting forever for the rest of its request, even after the connection closed: a task and a
  concurrent-stream slot leaked per such stream. Fixed in ``http2/stream.py`` (``Stream.reset``
  tells the call).
- A V2 JSON body with a key holding a NUL (``"\u0000inputs"``) beside a large flat ``data``:
  simdjson looks keys up as C strings, so the fast path's lookup of that key raised KeyError (HTTP
  500). Fixed in ``json_tensors``: such a body takes the general decoder.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from fuzz_targets import HTTP2_LIMITS, TARGETS, check, feed, frames_written
from hpack import Encoder

from tensorgate.errors import InvalidInput
from tensorgate.protocols.grpc.codec import GrpcLimits
from tensorgate.protocols.grpc.codec import decode_infer as decode_grpc
from tensorgate.protocols.grpc.generated import grpc_service_pb2 as pb
from tensorgate.protocols.grpc.http2 import frames as f
from tensorgate.protocols.http.json_tensors import MIN_FAST_BYTES
from tensorgate.protocols.http.v1_codec import decode_predict
from tensorgate.protocols.http.v2_codec import DecodeLimits, decode_infer
from tensorgate.types import DataType, TensorSpec


def test_a_json_key_holding_a_nul_takes_the_general_decoder() -> None:
    data = ",".join(str(v) for v in range(MIN_FAST_BYTES))  # large enough for the fast path
    tensor = f'{{"name":"x","datatype":"INT64","shape":[{MIN_FAST_BYTES}],"data":[{data}]}}'
    body = f'{{"\\u0000note":[{tensor}],"inputs":[{tensor}]}}'.encode()
    request, _ = decode_infer(body, None, "m", None, DecodeLimits())
    assert request.inputs["x"].tolist() == list(range(MIN_FAST_BYTES))


@pytest.mark.parametrize("datatype", ["FP32", "BYTES", "BOOL"])
def test_an_empty_shape_past_numpys_limit_is_invalid_over_http(datatype: str) -> None:
    body = f'{{"inputs":[{{"name":"x","datatype":"{datatype}","shape":[0,{2**62}],"data":[]}}]}}'.encode()
    with pytest.raises(InvalidInput, match="exceed the maximum size"):
        decode_infer(body, None, "m", None, DecodeLimits())
    header = f'{{"inputs":[{{"name":"x","datatype":"{datatype}","shape":[{2**62},0],'
    header += '"parameters":{"binary_data_size":0}}]}'
    with pytest.raises(InvalidInput, match="exceed the maximum size"):
        decode_infer(header.encode(), len(header), "m", None, DecodeLimits())


@pytest.mark.parametrize("raw", [True, False])
def test_an_empty_shape_past_numpys_limit_is_invalid_over_grpc(raw: bool) -> None:
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name="x", datatype="FP32", shape=[0, 2**62, 3])
    if raw:
        message.raw_input_contents.append(b"")
    with pytest.raises(InvalidInput, match="exceed the maximum size"):
        decode_grpc(message, GrpcLimits())


def test_an_empty_shape_within_the_limit_still_decodes() -> None:
    body = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[0,16],"data":[]}]}'
    request, _ = decode_infer(body, None, "m", None, DecodeLimits())
    assert request.inputs["x"].shape == (0, 16)


@pytest.mark.parametrize("text", ["A\u00e9==", "\ud83d\ude00", "AAEC\u0660"])
def test_v1_base64_with_non_ascii_characters_is_invalid(text: str) -> None:
    specs = (TensorSpec("t", DataType.BYTES, (-1,)),)
    with pytest.raises(InvalidInput, match="invalid base64"):
        decode_predict({"instances": [{"b64": text}]}, "m", None, specs, True)


@pytest.mark.parametrize("datatype", [DataType.FP16, DataType.FP32])
def test_v1_values_past_the_range_are_infinite_without_a_warning(datatype: DataType) -> None:
    # pytest turns warnings into errors (pyproject.toml), so a RuntimeWarning fails this test.
    specs = (TensorSpec("x", datatype, (-1, 2)),)
    request, _ = decode_predict({"instances": [[1e300, -1e300]]}, "m", None, specs, True)
    assert np.isinf(request.inputs["x"]).all()


def _open_then_headers_again() -> bytes:
    """A client-streaming call opened, then a second HEADERS on its stream without END_STREAM."""
    encoder = Encoder()
    fields = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/test.Echo/Bidi"),
        (":authority", "127.0.0.1"),
        ("te", "trailers"),
        ("content-type", "application/grpc"),
    ]
    return (
        f.PREFACE
        + f.settings({})
        + f.frame(f.HEADERS, f.END_HEADERS, 1, encoder.encode(fields))
        + f.frame(f.DATA, 0, 1, b"\0" + struct.pack(">I", 2) + b"hi")
        + f.frame(f.HEADERS, f.END_HEADERS, 1, encoder.encode([("x-late", "1")]))
    )


def _window_overrun() -> bytes:
    """DATA past the stream's receive window: the stream is reset with FLOW_CONTROL_ERROR."""
    encoder = Encoder()
    fields = [(":method", "POST"), (":scheme", "http"), (":path", "/test.Echo/Bidi"), (":authority", "h")]
    fields += [("te", "trailers"), ("content-type", "application/grpc")]
    big = b"\0" * (HTTP2_LIMITS.stream_window + 1)
    return (
        f.PREFACE
        + f.settings({})
        + f.frame(f.HEADERS, f.END_HEADERS, 1, encoder.encode(fields))
        + f.frame(f.DATA, 0, 1, big)
    )


@pytest.mark.parametrize(
    ("data", "code"),
    [(_open_then_headers_again(), f.ErrorCode.PROTOCOL_ERROR), (_window_overrun(), f.ErrorCode.FLOW_CONTROL_ERROR)],
    ids=["headers-without-end-stream", "window-overrun"],
)
def test_a_stream_reset_for_the_clients_error_ends_its_call(data: bytes, code: f.ErrorCode) -> None:
    fed = feed(data)
    resets = [payload for kind, _, stream_id, payload in frames_written(fed.written) if kind == f.RST_STREAM]
    assert resets == [struct.pack(">I", code)]
    assert fed.running == 0  # ended with its stream, while the connection is still open
    assert fed.outliving == 0
    assert check(TARGETS["http2"], (data, [])) == "decoded"


@pytest.mark.parametrize("value", ["\xb2", "1\xb3", "\xb9"])
def test_header_length_with_a_superscript_digit_is_a_client_error(value: str) -> None:
    """'²'.isdigit() is true and int('²') raises: the header arrives latin-1 decoded, so this was a 500."""
    from tensorgate.protocols.http.v2_codec import parse_header_length

    with pytest.raises(InvalidInput, match="Inference-Header-Content-Length"):
        parse_header_length(value, 100)
