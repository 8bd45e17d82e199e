"""The access log's lines as msgspec structs: built in C from positional values as a request ends,
and written as JSON lines by one ``encode_lines`` call per flush.

Kept out of the compiled modules: mypyc compiles its own classes, and this must stay msgspec's.
"""

from __future__ import annotations

import msgspec


class AccessLine(msgspec.Struct, omit_defaults=True):
    """One request's line; a gRPC call's has no path (the method is the RPC), and leaves it out."""

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
    path: str | None = None
    replica: str | None = None  # the server's --replica-id, when it has one
    identity: str | None = None  # who called, where authentication is on


JSON_LINES = msgspec.json.Encoder()
