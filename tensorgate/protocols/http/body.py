"""Reading a request body under limits, before any decoding work is spent.

A declared ``Content-Length`` over the limit is refused before a byte of the body is read; a
chunked body is counted as it arrives and refused the moment it passes the limit; a compressed
body is limited again after decompression, so a small gzip bomb cannot expand past the limit.
"""

from __future__ import annotations

import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from tensorgate.errors import Cancelled, InvalidInput, TooLarge, UnsupportedMedia

Receive = Callable[[], Awaitable[dict[str, Any]]]

# Triton's regression for CVE-2025-23310 sends 65 537 one-byte chunks; we refuse past this many.
MAX_CHUNKS = 65536


def _too_large(size: int | str, limit: int) -> TooLarge:
    return TooLarge(
        f"request body of {size} bytes exceeds the maximum allowed size of {limit} bytes "
        "(set server.max_body_bytes to raise it)"
    )


async def read_body(receive: Receive, content_length: int | None, limit: int) -> bytes:
    if content_length is not None and content_length > limit:
        raise _too_large(content_length, limit)
    parts: list[bytes] = []
    size = 0
    chunks = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Cancelled("the client disconnected while sending the body")
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            chunks += 1
            if size > limit:
                raise _too_large(f"more than {limit}", limit)
            if chunks > MAX_CHUNKS:
                raise InvalidInput(f"request body arrived in more than {MAX_CHUNKS} chunks")
            parts.append(chunk)
        if not message.get("more_body", False):
            break
    return parts[0] if len(parts) == 1 else b"".join(parts)


def decompress(body: bytes, encoding: str | None, limit: int) -> bytes:
    if not encoding:
        return body
    encoding = encoding.strip().lower()  # content codings are case-insensitive (RFC 9110 8.4.1)
    if encoding == "identity":
        return body
    if encoding not in ("gzip", "deflate"):
        raise UnsupportedMedia(f"unsupported Content-Encoding {encoding[:40]!r}; use gzip, deflate or none")
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error:
        raise InvalidInput(f"request body is not valid {encoding} data") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise TooLarge(f"decompressed request body exceeds the maximum allowed size of {limit} bytes")
    if not inflater.eof:
        raise InvalidInput(f"request body is truncated {encoding} data")
    return out
