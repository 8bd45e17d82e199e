"""What a gRPC handler reads of its call's context: metadata, the caller, the peer, the deadline."""

from __future__ import annotations

from typing import Any

from tensorgate.protocols.shared_memory import grpc_peer_host, is_local_peer, region_owner
from tensorgate.security.identity import Identity


def metadata_of(context: Any) -> dict[str, str]:
    return {key: value for key, value in (context.invocation_metadata() or ()) if isinstance(value, str)}


class MetadataReader:
    """A call's metadata as a header reader: the service's sticky key, the tenant. Read on first use."""

    __slots__ = ("_context", "_read")

    def __init__(self, context: Any) -> None:
        self._context = context
        self._read: dict[str, str] | None = None

    def __call__(self, key: str) -> str | None:
        read = self._read
        if read is None:
            read = self._read = metadata_of(self._context)
        return read.get(key)


def identity_of(context: Any) -> Identity | None:
    identity = getattr(context, "identity", None)
    return identity if isinstance(identity, Identity) else None


def owner_of(context: Any) -> str:
    return region_owner(identity_of(context))


def is_local(context: Any) -> bool:
    return is_local_peer(grpc_peer_host(context.peer()))


def past_deadline(context: Any) -> bool:
    remaining = context.time_remaining()
    return remaining is not None and remaining <= 0
