"""What every target shares: the outcome of one call and the interface the runner drives."""

from __future__ import annotations

import ssl
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
    """Where the load goes and how to reach it (inert and picklable, for client processes)."""

    host: str
    port: int
    prefix: str
    tls: bool = False
    ca_file: str | None = None  # with tls: the CA that signed the server's certificate; None: the system's
    credential: str | None = None  # an API key or token, sent as ``Authorization: Bearer``
    tenant: str | None = None  # sent as ``X-Tenant`` (the server's default tenant header), for fair sharing

    @property
    def authority(self) -> str:
        return f"{self.host}:{self.port}"

    def ssl_context(self, alpn: str) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        context = ssl.create_default_context(cafile=self.ca_file)
        context.set_alpn_protocols([alpn])
        return context

    @property
    def request_headers(self) -> tuple[tuple[str, str], ...]:
        """The credential and the tenant, as headers (gRPC: the same, as lower-case metadata)."""
        headers = () if self.credential is None else (("Authorization", f"Bearer {self.credential}"),)
        return headers if self.tenant is None else (*headers, ("X-Tenant", self.tenant))


_SCHEMES = {"http": False, "grpc": False, "https": True, "grpcs": True}


def parse_endpoint(
    url: str,
    default_port: int,
    *,
    ca_file: str | None = None,
    credential: str | None = None,
    tenant: str | None = None,
) -> Endpoint:
    """``http://host:port/prefix``, ``grpc://host:port`` or a bare ``host:port``; ``https://`` and
    ``grpcs://`` speak TLS."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in _SCHEMES:
        raise ValueError(f"unsupported URL scheme {parts.scheme!r} in {url!r}; use http(s):// or grpc(s)://")
    if not parts.hostname:
        raise ValueError(f"no host in URL {url!r}")
    tls = _SCHEMES[parts.scheme]
    if ca_file is not None and not tls:
        raise ValueError(f"--cacert is for a TLS server; use https:// or grpcs:// in {url!r}")
    return Endpoint(
        parts.hostname, parts.port or default_port, parts.path.rstrip("/"), tls, ca_file, credential, tenant
    )
