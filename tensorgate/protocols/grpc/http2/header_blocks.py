"""HPACK for one connection, with the header blocks that repeat from call to call kept.

Every call on a gRPC connection carries the same headers (path, content type, status). Once HPACK's
dynamic table holds them, a block is nothing but references to the table, one byte each, and
coding it again gives the same bytes or fields for as long as the table does not change. The
``hpack`` package, which this wraps, spends microseconds of Python on each block either way; a kept
block costs a lookup: a unary call's header work (the request's block, the response's headers and
trailers) took 26 µs against hpack's 49 alone, 1.9x (``benchmarks/bench_hpack.py``).

What keeps the table still: values that differ on every call (a request id, an error message) are
written as literals that do not enter it (RFC 7541 §6.2.2). Indexed, each would take a slot, evict
an entry the repeated headers use, and change the table on every call.
"""

from __future__ import annotations

from typing import Any, cast

from hpack import Decoder, Encoder

Headers = list[tuple[str, str]]

# Names whose values are new on every call: never worth a place in the table.
UNINDEXED = frozenset({"x-request-id", "grpc-message", "traceparent", "tracestate"})

# Blocks at most this long are kept, at most this many per direction: a peer cannot grow them.
_KEPT_BLOCK_BYTES = 64
_KEPT_BLOCKS = 32

# An indexed field with an index under 127 is one byte from 0x80 to 0xFE (RFC 7541 §6.1).
_ONE_BYTE_REFERENCES = bytes(range(0x80, 0xFF))


def only_references(block: bytes) -> bool:
    """Is the block only one-byte references to the tables? Decoding it then changes nothing."""
    return not block.translate(None, _ONE_BYTE_REFERENCES)


def changes_table(block: bytes) -> bool:
    """May decoding ``block`` change the dynamic table (an indexed literal or a size update)?

    Judged from each field's first byte (RFC 7541 §6); a block that ends mid-field says yes, and
    the decoder that reads it next will say what is wrong with it.
    """
    pos, end = 0, len(block)
    try:
        while pos < end:
            first = block[pos]
            if first & 0x80:  # indexed field
                _, pos = _integer(block, pos, 7)
                continue
            if first & 0x40 or first & 0x20:  # literal with incremental indexing, or a size update
                return True
            index, pos = _integer(block, pos, 4)  # literal without indexing, or never indexed
            for _ in range(1 if index else 2):  # the value, and the name when not a table reference
                if pos >= end:
                    return True
                length, pos = _integer(block, pos, 7)
                pos += length
        return pos != end
    except ValueError:  # an integer that never ends
        return True


def literal(name: str, value: str) -> bytes:
    """A field as a literal without indexing, with a literal name: it leaves both tables as they are."""
    name_bytes, value_bytes = name.encode(), value.encode()
    return b"".join(
        (b"\x00", _encoded_integer(len(name_bytes)), name_bytes, _encoded_integer(len(value_bytes)), value_bytes)
    )


# hpack's own integer coding logs each integer at debug level, which costs more than the coding.


def _integer(block: bytes, pos: int, prefix_bits: int) -> tuple[int, int]:
    """The integer at ``pos`` with an N-bit prefix (RFC 7541 §5.1), and the position after it."""
    mask = (1 << prefix_bits) - 1
    value = block[pos] & mask
    pos += 1
    if value < mask:
        return value, pos
    shift = 0
    while pos < len(block) and shift <= 28:
        byte = block[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise ValueError("an HPACK integer runs past its block or past 2^32")


def _encoded_integer(value: int) -> bytes:
    """``value`` with a 7-bit prefix and the prefix's high bit clear (a string length, no Huffman)."""
    if value < 0x7F:
        return bytes((value,))
    out = bytearray((0x7F,))
    value -= 0x7F
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _references_end(block: bytes) -> int:
    """Where the block's leading one-byte references end."""
    return len(block) - len(block.lstrip(_ONE_BYTE_REFERENCES))


def _plain_literals(block: bytes, pos: int) -> Headers | None:
    """The fields from ``pos`` on when each is what :func:`literal` writes (a literal without
    indexing, its name and value raw strings); None for anything else, which ``hpack`` decodes."""
    fields: Headers = []
    end = len(block)
    try:
        while pos < end:
            if block[pos] != 0:
                return None
            pos += 1
            strings: list[str] = []
            for _ in range(2):  # the name, then the value
                if pos >= end or block[pos] & 0x80:  # past the end, or Huffman-coded
                    return None
                length, pos = _integer(block, pos, 7)
                if pos + length > end:
                    return None
                strings.append(block[pos : pos + length].decode())
                pos += length
            fields.append((strings[0], strings[1]))
    except (ValueError, UnicodeDecodeError):
        return None
    return fields


def _list_size(headers: Headers) -> int:
    """A header list's size as SETTINGS_MAX_HEADER_LIST_SIZE counts it (RFC 7540 §6.5.2)."""
    return sum(len(name.encode()) + len(value.encode()) + 32 for name, value in headers)


def _keepable(block: bytes, kept: dict[Any, Any]) -> bool:
    """Worth keeping: only references (so coding it again gives the same), short, and room left."""
    return only_references(block) and len(block) <= _KEPT_BLOCK_BYTES and len(kept) < _KEPT_BLOCKS


class HeaderBlocks:
    """One connection's HPACK encoder and decoder, keeping the blocks that are only references."""

    def __init__(self, max_header_list_size: int | None = None) -> None:
        self._encoder = Encoder()
        self._decoder = Decoder() if max_header_list_size is None else Decoder(max_header_list_size)
        self._max_list_size: int = self._decoder.max_header_list_size
        self._encoded: dict[tuple[tuple[str, str], ...], bytes] = {}
        self._decoded: dict[bytes, tuple[tuple[str, str], ...]] = {}

    def set_encoder_table_size(self, size: int) -> None:
        """The peer's SETTINGS_HEADER_TABLE_SIZE: kept blocks may refer to entries it evicts."""
        self._encoder.header_table_size = size
        self._encoded.clear()

    def encode(self, headers: Headers) -> bytes:
        """The fields as one block; those named in UNINDEXED go last, as literals."""
        indexed = tuple(field for field in headers if field[0] not in UNINDEXED)
        block = self._encoded.get(indexed)
        if block is None:
            block = self._encoder.encode(indexed)
            if changes_table(block):  # new entries shift the indexes the kept blocks use
                self._encoded.clear()
            elif _keepable(block, self._encoded):
                self._encoded[indexed] = block
        if len(indexed) == len(headers):
            return block
        return block + b"".join(literal(name, value) for name, value in headers if name in UNINDEXED)

    def decode(self, block: bytes) -> Headers:
        """The block's fields; raises what ``hpack``'s Decoder raises."""
        kept = self._decoded.get(block)
        if kept is not None:
            return list(kept)
        # Kept references, then per-call values as plain literals (what encode() writes, a request
        # id in every call's trailers): the literals are read here and the references looked up.
        split = _references_end(block)
        if 0 < split < len(block) and split <= _KEPT_BLOCK_BYTES:
            literals = _plain_literals(block, split)
            if literals is not None:
                headers = self.decode(block[:split]) + literals
                if _list_size(headers) <= self._max_list_size:
                    return headers
        if changes_table(block):  # cleared first: the decoder may change its table and then fail
            self._decoded.clear()
        headers = cast(Headers, self._decoder.decode(block))  # str pairs: HeaderTuple is a tuple of str
        if _keepable(block, self._decoded):
            self._decoded[block] = tuple(headers)
        return headers
