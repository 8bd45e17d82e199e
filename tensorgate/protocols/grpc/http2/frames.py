"""HTTP/2 frames: the 9-byte header, the types and flags the server uses, and their encoding.

Only what a gRPC server speaks: no server push, no priorities (PRIORITY frames and the priority
fields of HEADERS are read past, as RFC 9113 deprecates the scheme).
"""

from __future__ import annotations

import struct
from enum import IntEnum

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADER_BYTES = 9

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)

END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# SETTINGS identifiers.
HEADER_TABLE_SIZE = 0x1
ENABLE_PUSH = 0x2
MAX_CONCURRENT_STREAMS = 0x3
INITIAL_WINDOW_SIZE = 0x4
MAX_FRAME_SIZE = 0x5
MAX_HEADER_LIST_SIZE = 0x6

DEFAULT_WINDOW = 65_535
DEFAULT_FRAME_SIZE = 16_384
MAX_FRAME_SIZE_LIMIT = (1 << 24) - 1
MAX_WINDOW = (1 << 31) - 1
MAX_STREAM_ID = (1 << 31) - 1

_HEADER = struct.Struct(">BHBBI")
_U32 = struct.Struct(">I")
_SETTING = struct.Struct(">HI")
_GOAWAY = struct.Struct(">II")


class ErrorCode(IntEnum):
    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    SETTINGS_TIMEOUT = 0x4
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9
    CONNECT_ERROR = 0xA
    ENHANCE_YOUR_CALM = 0xB
    INADEQUATE_SECURITY = 0xC
    HTTP_1_1_REQUIRED = 0xD


class ConnectionError_(Exception):
    """A connection error (RFC 9113 §5.4.1): the connection ends with GOAWAY and this code."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def parse_header(buffer: bytes | bytearray | memoryview, offset: int) -> tuple[int, int, int, int]:
    """(payload length, type, flags, stream id) of the frame header at ``offset``."""
    high, low, kind, flags, stream_id = _HEADER.unpack_from(buffer, offset)
    return (high << 16) | low, kind, flags, stream_id & 0x7FFF_FFFF


def header(kind: int, flags: int, stream_id: int, length: int) -> bytes:
    return _HEADER.pack(length >> 16, length & 0xFFFF, kind, flags, stream_id)


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return header(kind, flags, stream_id, len(payload)) + payload


def settings(values: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(key, value) for key, value in values.items()))


def parse_settings(payload: bytes | memoryview) -> list[tuple[int, int]]:
    if len(payload) % 6:
        raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS payload is not a multiple of 6 bytes")
    return [_SETTING.unpack_from(payload, offset) for offset in range(0, len(payload), 6)]


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(increment))


def rst_stream(stream_id: int, code: ErrorCode) -> bytes:
    return frame(RST_STREAM, 0, stream_id, _U32.pack(code))


def goaway(last_stream_id: int, code: ErrorCode, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, _GOAWAY.pack(last_stream_id, code) + debug)


def u32(payload: bytes | memoryview) -> int:
    return int(_U32.unpack_from(payload, 0)[0])
