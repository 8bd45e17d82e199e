"""HeaderBlocks against hpack's own coder as the peer: kept blocks must decode and encode exactly as
the uncached coder would, whatever the table does in between."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from hpack import Decoder, Encoder, NeverIndexedHeaderTuple, OversizedHeaderListError
from hpack.huffman import HuffmanEncoder
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH

from tensorgate.protocols.grpc.http2.header_blocks import HeaderBlocks, changes_table, literal, only_references


def huffman_literal(name: str, value: str) -> bytes:
    """A literal without indexing whose name and value are Huffman-coded, as grpc-core writes them."""
    coder = HuffmanEncoder(REQUEST_CODES, REQUEST_CODES_LENGTH)
    name_bytes, value_bytes = coder.encode(name.encode()), coder.encode(value.encode())
    return b"\x00" + bytes([0x80 | len(name_bytes)]) + name_bytes + bytes([0x80 | len(value_bytes)]) + value_bytes


RESPONSE = [(":status", "200"), ("content-type", "application/grpc"), ("grpc-accept-encoding", "identity,gzip")]


def test_repeated_headers_become_one_byte_references_and_are_kept() -> None:
    ours, peer = HeaderBlocks(), Decoder()
    blocks = []
    for index in range(4):
        trailers = [("grpc-status", "0"), ("x-request-id", f"req-{index}")]
        blocks.append(ours.encode(RESPONSE))
        assert peer.decode(blocks[-1]) == RESPONSE
        assert peer.decode(ours.encode(trailers)) == trailers
    assert only_references(blocks[-1]) and len(blocks[-1]) == len(RESPONSE)
    assert blocks[-1] is blocks[-2]  # kept, not encoded again


def test_per_call_values_never_enter_the_table() -> None:
    ours, peer = HeaderBlocks(), Decoder()
    for index in range(200):
        fields = [("grpc-status", "2"), ("grpc-message", f"failure {index}"), ("x-request-id", f"{index:032x}")]
        assert peer.decode(ours.encode(fields)) == fields
    # Only grpc-status: 2 was ever added; without the literals 200 ids would have cycled the table.
    assert len(peer.header_table.dynamic_entries) == 1


def test_unindexed_fields_go_last_in_their_order() -> None:
    ours = HeaderBlocks()
    fields = [("x-request-id", "a"), ("grpc-status", "0"), ("traceparent", "00-1-2-01"), ("custom", "v")]
    decoded = Decoder().decode(ours.encode(fields))
    assert decoded == [("grpc-status", "0"), ("custom", "v"), ("x-request-id", "a"), ("traceparent", "00-1-2-01")]


def test_a_smaller_peer_table_is_announced_and_kept_blocks_dropped() -> None:
    ours, peer = HeaderBlocks(), Decoder()
    for _ in range(3):
        assert peer.decode(ours.encode(RESPONSE)) == RESPONSE
    ours.set_encoder_table_size(0)  # the peer's SETTINGS_HEADER_TABLE_SIZE
    block = ours.encode(RESPONSE)
    assert not only_references(block)  # a size update, then literals: the old references are gone
    assert peer.decode(block) == RESPONSE
    assert peer.header_table.maxsize == 0


def test_decoding_matches_hpack_whatever_the_peer_sends() -> None:
    """A peer that mixes repeated fields, new values, never-indexed values and table resizes."""
    rng = random.Random(7)
    peer, ours, reference = Encoder(), HeaderBlocks(), Decoder()
    paths = [f"/inference.GRPCInferenceService/{name}" for name in ("ModelInfer", "ModelReady", "ServerLive")]
    for index in range(600):
        fields: list[tuple[str, str]] = [(":method", "POST"), (":path", rng.choice(paths)), ("te", "trailers")]
        if rng.random() < 0.3:
            fields.append(("grpc-timeout", f"{rng.randrange(1, 99)}m"))
        if rng.random() < 0.2:
            fields.append(NeverIndexedHeaderTuple("authorization", f"Bearer {index}"))
        if rng.random() < 0.02:
            peer.header_table_size = rng.choice([0, 256, 4096])
        block = peer.encode(fields)
        assert ours.decode(block) == reference.decode(block), index


def test_encoding_stays_decodable_as_the_table_changes() -> None:
    """Kept blocks refer to table positions; new entries move them, and the peer must still read ours."""
    rng = random.Random(11)
    ours, peer = HeaderBlocks(), Decoder()
    for index in range(600):
        fields = [(":status", "200"), ("content-type", rng.choice(["application/grpc", "application/grpc+proto"]))]
        if rng.random() < 0.3:
            fields.append(("custom", f"value-{rng.randrange(40)}"))
        if rng.random() < 0.02:
            ours.set_encoder_table_size(rng.choice([0, 256, 4096]))
        assert peer.decode(ours.encode(fields)) == fields, index


def test_a_kept_block_is_not_decoded_again() -> None:
    peer, ours = Encoder(), HeaderBlocks()
    fields = [(":method", "POST"), (":path", "/p"), ("content-type", "application/grpc")]
    ours.decode(peer.encode(fields))
    block = peer.encode(fields)
    assert only_references(block)
    assert ours.decode(block) == fields
    ours._decoder = None  # type: ignore[assignment]  # any further hpack decoding would fail
    assert ours.decode(block) == fields


def test_references_then_plain_literals_are_read_without_hpack() -> None:
    """Every call's trailers: the kept status, then the call's id as a literal (what encode() writes)."""
    server, ours, reference = HeaderBlocks(), HeaderBlocks(), Decoder()
    for index in range(3):
        block = server.encode([("grpc-status", "0"), ("x-request-id", f"id-{index}")])
        assert ours.decode(block) == reference.decode(block) == [("grpc-status", "0"), ("x-request-id", f"id-{index}")]
    ours._decoder = None  # type: ignore[assignment]  # any further hpack decoding would fail
    block = server.encode([("grpc-status", "0"), ("x-request-id", "id-3"), ("grpc-message", "é" * 200)])
    assert ours.decode(block) == [("grpc-status", "0"), ("x-request-id", "id-3"), ("grpc-message", "é" * 200)]


@pytest.mark.parametrize(
    "tail",
    [
        Encoder().encode([NeverIndexedHeaderTuple("a", "b")]),  # never indexed: hpack's to read
        huffman_literal("x-request-id", "abc"),  # Huffman-coded strings
        literal("x", "y")[:-1],  # its value runs past the end
        literal("name", "value")[:4],  # ends inside its name
        b"\x00\x01\xff\x01v",  # a name that is not UTF-8
        literal("x-request-id", "v") + b"\x40\x01a\x01b",  # then a literal that enters the table
    ],
)
def test_any_other_tail_decodes_as_hpack_decodes_it(tail: bytes) -> None:
    def outcome(decode: Callable[[bytes], object]) -> object:
        try:
            return decode(b"\x88" + tail)
        except Exception as exc:
            return type(exc)

    assert outcome(HeaderBlocks().decode) == outcome(Decoder().decode)


def test_plain_literals_still_count_against_the_header_list_limit() -> None:
    block = b"\x88" + literal("x-request-id", "v" * 300)
    with pytest.raises(OversizedHeaderListError):
        HeaderBlocks(max_header_list_size=256).decode(block)
    assert HeaderBlocks(max_header_list_size=400).decode(block) == [(":status", "200"), ("x-request-id", "v" * 300)]


def test_a_peer_cannot_grow_the_kept_blocks() -> None:
    ours = HeaderBlocks()
    for index in range(1, 62):  # every static-table reference, each its own block
        ours.decode(bytes([0x80 | index]))
    assert len(ours._decoded) <= 32


@pytest.mark.parametrize("size", [0, 1, 126, 127, 128, 255, 16_383, 16_384, 70_000])
def test_literals_of_any_length_decode_and_leave_the_table_alone(size: int) -> None:
    """Lengths from 127 up take more than one byte (RFC 7541 §5.1)."""
    block = literal("x-request-id", "v" * size) + literal("n" * size or "n", "w")
    assert Decoder(max_header_list_size=200_000).decode(block) == [
        ("x-request-id", "v" * size),
        ("n" * size or "n", "w"),
    ]
    assert not changes_table(block)


def test_references_past_126_are_read_whole() -> None:
    """An index over 126 takes two bytes; the field after it must still be judged."""
    table_filler = Encoder()
    fields = [(f"name-{index}", "v") for index in range(80)]  # 80 dynamic entries: indexes up to 141
    table_filler.encode(fields)
    block = table_filler.encode([fields[0]])  # the oldest entry, index 141
    assert len(block) == 2 and not only_references(block)
    assert not changes_table(block)
    assert changes_table(block + Encoder().encode([("new", "value")]))


@pytest.mark.parametrize(
    ("block", "changes"),
    [
        (b"\x82\x86", False),  # indexed fields
        (literal("x-request-id", "abc"), False),  # literal without indexing
        (Encoder().encode([NeverIndexedHeaderTuple("a", "b")]), False),
        (Encoder().encode([("a", "b")]), True),  # incremental indexing
        (b"\x3f\xe1\x1f", True),  # table size update
        (literal("x", "y")[:-1], True),  # its value runs past the end
        (literal("name", "value")[:4], True),  # ends inside its name
        (b"\x82\xff", True),  # an index whose integer never ends
    ],
)
def test_changes_table(block: bytes, changes: bool) -> None:
    assert changes_table(block) is changes
