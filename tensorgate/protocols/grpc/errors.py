"""TensorgateError -> gRPC status, through the one error table.

The table (:data:`tensorgate.errors.ERROR_TABLE`) names a ``grpc.StatusCode`` member for each error
code; this module only resolves the name, so no status is decided here.
"""

from __future__ import annotations

from typing import Any, NoReturn

import grpc

from tensorgate.errors import TensorgateError

Metadata = tuple[tuple[str, str], ...]


def status_code(error: TensorgateError) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, error.grpc_status)


def trailers(error: TensorgateError, metadata: Metadata) -> Metadata:
    """The request id, plus ``retry-after`` (seconds) when the error suggests one, as HTTP sends it."""
    if error.retry_after_s is None:
        return metadata
    return (*metadata, ("retry-after", str(max(1, round(error.retry_after_s)))))


async def abort(context: Any, error: TensorgateError, metadata: Metadata = ()) -> NoReturn:
    """End the RPC with the error's table status and its client-facing message (never a trace)."""
    await context.abort(status_code(error), error.message, trailers(error, metadata))
    raise AssertionError("context.abort returned")  # pragma: no cover - abort always raises
