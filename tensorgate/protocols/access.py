"""What each route asks of its caller, for the gate (:mod:`tensorgate.security.gate`): one table per
protocol, so the same call needs the same role over HTTP and gRPC."""

from __future__ import annotations

from tensorgate.security.gate import Access

_V2 = "/inference.GRPCInferenceService/"
_GRPC_HEALTH = frozenset(
    {f"{_V2}ServerLive", f"{_V2}ServerReady", "/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"}
)
_GRPC_ADMIN = frozenset({f"{_V2}RepositoryIndex", f"{_V2}RepositoryModelLoad", f"{_V2}RepositoryModelUnload"})


def grpc_access(path: str) -> Access:
    if path in _GRPC_HEALTH:
        return "health"
    if path in _GRPC_ADMIN:
        return "admin"
    return "infer"  # inference, metadata, statistics, reflection, and any method added later


def http_access(parts: list[str]) -> Access:
    """``parts``: the path split on "/" (``/v2/health/ready`` is ["v2", "health", "ready"])."""
    if len(parts) >= 2 and parts[0] == "v2":
        if parts[1] == "health":
            return "health"
        if parts[1] == "repository":
            return "admin"
        if parts[1] == "status" and len(parts) == 2:
            return "metrics"
    if parts == [""] or parts == ["status"]:  # the status page: what the metrics port shows, on one page
        return "metrics"
    return "infer"
