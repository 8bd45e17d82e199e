"""Reading a request body under limits, with a scripted ASGI ``receive`` (no socket)."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tensorgate.errors import Cancelled, InvalidInput, TooLarge, UnsupportedMedia
from tensorgate.protocols.http.body import MAX_CHUNKS, decompress, read_body


def _receiver(
    chunks: list[bytes], disconnect: bool = False
) -> tuple[Callable[[], Awaitable[dict[str, Any]]], list[int]]:
    calls = [0]

    async def receive() -> dict[str, Any]:
        index = calls[0]
        calls[0] += 1
        if index == len(chunks) and disconnect:
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": chunks[index], "more_body": index < len(chunks) - 1 or disconnect}

    return receive, calls


def test_reads_all_chunks() -> None:
    receive, _ = _receiver([b"ab", b"", b"cd"])
    assert asyncio.run(read_body(receive, None, 10)) == b"abcd"


def test_declared_length_over_the_limit_reads_nothing() -> None:
    receive, calls = _receiver([b"x" * 20])
    with pytest.raises(TooLarge, match="exceeds the maximum allowed size of 10 bytes"):
        asyncio.run(read_body(receive, 20, 10))
    assert calls[0] == 0


def test_streamed_body_stops_at_the_limit() -> None:
    receive, calls = _receiver([b"x" * 6, b"x" * 6, b"x" * 6])
    with pytest.raises(TooLarge):
        asyncio.run(read_body(receive, None, 10))
    assert calls[0] == 2


def test_too_many_messages() -> None:
    receive, _ = _receiver([b"x"] * (MAX_CHUNKS + 1))
    with pytest.raises(InvalidInput, match="chunks"):
        asyncio.run(read_body(receive, None, 1 << 20))


def test_disconnect_while_reading() -> None:
    receive, _ = _receiver([b"ab"], disconnect=True)
    with pytest.raises(Cancelled):
        asyncio.run(read_body(receive, None, 10))


def test_decompress() -> None:
    assert decompress(b"plain", None, 10) == b"plain"
    assert decompress(b"plain", "identity", 10) == b"plain"
    assert decompress(gzip.compress(b"hello"), "gzip", 10) == b"hello"
    assert decompress(gzip.compress(b"hello"), "GZip ", 10) == b"hello"
    assert decompress(zlib.compress(b"hello"), "deflate", 10) == b"hello"
    assert decompress(gzip.compress(b"x" * 10), "gzip", 10) == b"x" * 10


def test_decompression_bomb_is_bounded() -> None:
    bomb = gzip.compress(b"\0" * (50 << 20))
    assert len(bomb) < 100_000
    with pytest.raises(TooLarge, match="decompressed request body exceeds"):
        decompress(bomb, "gzip", 1 << 20)
    with pytest.raises(TooLarge):
        decompress(gzip.compress(b"x" * 11), "gzip", 10)


@pytest.mark.parametrize(
    ("body", "encoding", "error", "message"),
    [
        (b"not gzip", "gzip", InvalidInput, "not valid gzip"),
        (gzip.compress(b"hello", mtime=0)[:-3], "gzip", InvalidInput, "truncated gzip"),
        (gzip.compress(b"hello", mtime=0)[:-4] + b"\0\0\0\0", "gzip", InvalidInput, "not valid gzip"),
        (b"x", "br", UnsupportedMedia, "unsupported Content-Encoding"),
        (b"x", "gzip, gzip", UnsupportedMedia, "unsupported Content-Encoding"),
    ],
)
def test_decompress_errors(body: bytes, encoding: str, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        decompress(body, encoding, 1 << 20)
