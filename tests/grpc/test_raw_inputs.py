"""Lifting raw_input_contents out of a received ModelInferRequest: the same message upb parses, no copies."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgate.protocols.grpc.generated import grpc_service_pb2 as pb
from tensorgate.protocols.grpc.raw_inputs import parse_infer_request, receive_infer_request


def _request(raw: list[bytes], version: str = "1") -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="resnet", model_version=version, id="req-7")
    for index, blob in enumerate(raw):
        entry = message.inputs.add(name=f"in{index}", datatype="UINT8", shape=[len(blob)])
        entry.parameters["note"].string_param = "x"
    message.outputs.add(name="out").parameters["binary_data"].bool_param = True
    message.parameters["priority"].int64_param = 2
    message.raw_input_contents.extend(raw)
    return message


def _check(data: bytes) -> None:
    """Split ``data`` and compare with what upb makes of it whole."""
    whole = pb.ModelInferRequest.FromString(data)
    received = parse_infer_request(data)
    assert [bytes(view) for view in received.raw] == list(whole.raw_input_contents)
    without = pb.ModelInferRequest()
    without.CopyFrom(whole)
    del without.raw_input_contents[:]
    assert received.message == without


def test_raw_contents_come_out_as_views_of_the_received_bytes() -> None:
    image = bytes(range(256)) * 2400  # 600 KB, as an image tensor
    data = _request([image, b"\x01\x02"]).SerializeToString()
    received = parse_infer_request(data)
    assert [bytes(view) for view in received.raw] == [image, b"\x01\x02"]
    assert all(view.obj is data for view in received.raw)  # no copy: views of what gRPC handed over
    assert len(received.message.raw_input_contents) == 0
    assert received.message.inputs[1].name == "in1"
    _check(data)


def test_a_request_without_raw_contents_parses_whole() -> None:
    message = pb.ModelInferRequest(model_name="mlp")
    message.inputs.add(name="x", datatype="FP32", shape=[2]).contents.fp32_contents.extend([0.5, 1.5])
    received = parse_infer_request(message.SerializeToString())
    assert received.raw == []
    assert received.message == message


def test_entries_interleaved_with_other_fields_keep_their_order() -> None:
    # Protobuf parses concatenated messages as one merged message: repeated entries in order.
    parts = [
        pb.ModelInferRequest(raw_input_contents=[b"first"]),
        _request([]),
        pb.ModelInferRequest(raw_input_contents=[b"", b"third"], id="later"),
        pb.ModelInferRequest(model_version="2"),
    ]
    data = b"".join(part.SerializeToString() for part in parts)
    assert [bytes(v) for v in parse_infer_request(data).raw] == [b"first", b"", b"third"]
    _check(data)


@settings(max_examples=80, deadline=None)
@given(
    raw=st.lists(st.binary(max_size=300), max_size=4),
    version=st.text(max_size=5),
    timeout=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    threshold=st.floats(allow_nan=False),
)
def test_any_request_splits_to_what_upb_parses(raw: list[bytes], version: str, timeout: int, threshold: float) -> None:
    message = _request(raw, version)
    message.parameters["timeout"].int64_param = timeout  # varint fields
    message.parameters["threshold"].double_param = threshold  # fixed64 fields
    _check(message.SerializeToString())


def test_truncated_or_malformed_bytes_fail_as_upb_does() -> None:
    data = _request([b"\x00" * 100]).SerializeToString()
    for bad in (data[:-1], data[:-101] + b"\x3a\xff", b"\x3a\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01"):
        with pytest.raises(DecodeError):
            pb.ModelInferRequest.FromString(bad)
        with pytest.raises(DecodeError):
            parse_infer_request(bad)
        received = receive_infer_request(bad)
        assert received.error is not None and received.error.startswith("the request is not a valid")
        assert received.raw == [] and received.message == pb.ModelInferRequest()
