"""What every target shares: the outcome of one call and the interface the runner drives."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

PROTOCOLS = ("v2-json", "v2-binary", "grpc", "grpc-stream", "v1", "openai-completions", "openai-chat")


def is_grpc(protocol: str) -> bool:
    """``grpc`` (unary ModelInfer) and ``grpc-stream`` (ModelStreamInfer) speak to the gRPC port."""
    return protocol in ("grpc", "grpc-stream")


@dataclass(slots=True)
class Outcome:
    """How one request ended. ``error`` is None on success, else a key such as ``http 503``.

    Streaming targets add the clock reading at which each token arrived, so the runner can
    derive time to first token and inter-token latency against the request's start.
    """

    error: str | None = None
    token_times: list[float] = field(default_factory=list)


class Target(Protocol):
    """A protocol client bound to one model and a fixed set of pre-encoded requests.

    The runner calls ``call`` from many tasks at once; each call picks request ``index`` modulo
    the number of variants. ``call`` returns HTTP or gRPC failures as an :class:`Outcome`; it
    may raise OSError or TimeoutError for transport failures, which the runner counts.
    """

    async def call(self, index: int) -> Outcome: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int
    prefix: str

    @property
    def authority(self) -> str:
        return f"{self.host}:{self.port}"


def parse_endpoint(url: str, default_port: int) -> Endpoint:
    """``http://host:port/prefix``, ``grpc://host:port`` or a bare ``host:port``."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "grpc"):
        raise ValueError(f"unsupported URL scheme {parts.scheme!r} in {url!r}; use http:// (TLS is not supported)")
    if not parts.hostname:
        raise ValueError(f"no host in URL {url!r}")
    return Endpoint(parts.hostname, parts.port or default_port, parts.path.rstrip("/"))
