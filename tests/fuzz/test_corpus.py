"""The seed corpus is what it says: every seed is a valid request that decodes (and, over HTTP/2, is
answered OK), so the fuzzers' mutations start one step from a request the server serves."""

from __future__ import annotations

import pytest
from fuzz_targets import (
    CORPUS,
    MODELS,
    corpus,
    feed,
    frames_written,
    goaway_codes,
    header_length,
    model_of,
    run_grpc,
    run_openai,
    run_v1,
    run_v2_binary,
    run_v2_json,
)
from hpack import Decoder

from tensorgate.protocols.grpc.generated import grpc_service_pb2 as pb
from tensorgate.protocols.grpc.http2 import frames as f
from tensorgate.protocols.grpc.http2.header_blocks import HeaderBlocks


def _names(group: str) -> list[str]:
    return [name for name, _ in corpus(group)]


def _seed(group: str, name: str) -> bytes:
    return (CORPUS / group / name).read_bytes()


def test_every_group_has_seeds_for_the_served_models() -> None:
    for group in ("v2_json", "v2_binary", "v1", "grpc"):
        assert {model_of(name) for name in _names(group)} <= set(MODELS), group
        assert len(_names(group)) >= 4, group
    assert {model_of(name) for name in _names("openai")} == {"chat", "completions"}


@pytest.mark.parametrize("name", _names("v2_json"))
def test_v2_json_seeds_decode(name: str) -> None:
    run_v2_json(_seed("v2_json", name))


@pytest.mark.parametrize("name", _names("v2_binary"))
def test_v2_binary_seeds_decode(name: str) -> None:
    seed = _seed("v2_binary", name)
    assert 0 < header_length(seed) < len(seed)
    run_v2_binary((seed, str(header_length(seed))))


@pytest.mark.parametrize("name", _names("v1"))
def test_v1_seeds_decode(name: str) -> None:
    run_v1((model_of(name), _seed("v1", name)))


@pytest.mark.parametrize("name", _names("openai"))
def test_openai_seeds_parse(name: str) -> None:
    run_openai((model_of(name), _seed("openai", name)))


@pytest.mark.parametrize("name", _names("grpc"))
def test_grpc_seeds_decode(name: str) -> None:
    seed = _seed("grpc", name)
    assert pb.ModelInferRequest.FromString(seed).model_name == model_of(name)
    run_grpc(seed)


def _statuses(written: bytes) -> dict[int, str]:
    """grpc-status per stream, from the header blocks the connection wrote (one HPACK table)."""
    decoder, statuses, parts = Decoder(), {}, b""
    for kind, flags, stream_id, payload in frames_written(written):
        if kind in (f.HEADERS, f.CONTINUATION):
            parts += payload
            if flags & f.END_HEADERS:
                fields = dict(decoder.decode(parts))
                parts = b""
                if "grpc-status" in fields:
                    statuses[stream_id] = fields["grpc-status"]
    return statuses


EXPECTED_STATUSES = {
    "infer-one-call.bin": {1: "0"},
    "echo-gzip-continuation.bin": {1: "0"},
    "echo-two-streams.bin": {1: "0", 3: "0"},
    "infer-reset.bin": {5: "12"},  # stream 1 was reset by the client; /test.Echo/Missing is UNIMPLEMENTED
}


def test_http2_seeds_are_answered() -> None:
    assert set(_names("http2")) == set(EXPECTED_STATUSES)
    for name, expected in EXPECTED_STATUSES.items():
        fed = feed(_seed("http2", name))
        assert fed.outliving == 0
        assert _statuses(fed.written) == expected, name
        assert set(goaway_codes(fed.written)) <= {f.ErrorCode.NO_ERROR}, name


def test_hpack_seeds_decode_in_order() -> None:
    blocks = [seed for _, seed in corpus("hpack")]
    ours = HeaderBlocks()
    decoded = [ours.decode(block) for block in blocks[:3]]
    assert decoded[0] == decoded[2] and dict(decoded[0])[":path"].endswith("/ModelInfer")
    assert dict(decoded[1])["x-request-id"] == "abc-123"
    assert dict(HeaderBlocks().decode(blocks[3]))[":status"] == "200"
    assert dict(HeaderBlocks().decode(blocks[4]))["authorization"] == "secret"
