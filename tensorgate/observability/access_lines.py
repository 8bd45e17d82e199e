"""The access log's lines as msgspec structs: built in C from positional values as a request ends,
and written as JSON lines by one ``encode_lines`` call per flush.

Kept out of the compiled modules: mypyc compiles its own classes, and these must stay msgspec's.
"""

from __future__ import annotations

import msgspec


class HttpLine(msgspec.Struct):
    ts: str
    level: str
    logger: str
    request_id: str
    protocol: str
    method: str
    path: str
    model: str
    version: str
    status: int | str
    queue_ms: float
    compute_ms: float
    total_ms: float


class GrpcLine(msgspec.Struct):
    """A gRPC call's line: the method is the RPC, and there is no path."""

    ts: str
    level: str
    logger: str
    request_id: str
    protocol: str
    method: str
    model: str
    version: str
    status: int | str
    queue_ms: float
    compute_ms: float
    total_ms: float


AccessLine = HttpLine | GrpcLine
JSON_LINES = msgspec.json.Encoder()
