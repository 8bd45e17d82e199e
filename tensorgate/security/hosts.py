"""Which ``Host`` names the HTTP ports answer: the guard against DNS rebinding (checklist S-16).

A page on ``evil.example`` can point its own name at 127.0.0.1 and make a browser on the server's
host send it requests; they arrive with ``Host: evil.example``. So a server bound to loopback
answers only requests addressed to a loopback name or to a name in ``server.allowed_hosts``; one
bound to another address answers any name unless ``allowed_hosts`` is set. ``*`` allows every
name. A request without a ``Host`` (HTTP/1.0) did not come from a browser and is answered.

gRPC is not guarded: a browser cannot make a gRPC call (it needs HTTP/2 trailers), and the
``:authority`` a gRPC client sends is often a load balancer's name.
"""

from __future__ import annotations

from tensorgate.errors import PermissionDenied

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
ANY = "*"


def host_name(value: str) -> str:
    """The name of a ``Host`` value, lower case, without its port or a trailing dot."""
    value = value.strip().lower()
    if value.startswith("["):  # an IPv6 literal: [::1]:8080
        end = value.find("]")
        return value[1:end] if end > 0 else value
    name, _, port = value.rpartition(":")
    if name and port.isdigit():
        value = name
    return value.rstrip(".")


class HostAllowlist:
    def __init__(self, names: frozenset[str] | None) -> None:
        self._names = names  # None: every name
        self.checks = names is not None

    @classmethod
    def for_bind(cls, bind_host: str, allowed: list[str] | None) -> HostAllowlist:
        if allowed is None:
            return cls(LOOPBACK_NAMES if host_name(bind_host) in LOOPBACK_NAMES else None)
        if ANY in allowed:
            return cls(None)
        return cls(LOOPBACK_NAMES | {host_name(name) for name in allowed})

    def check(self, host: str | None) -> None:
        """PermissionDenied (403) for a name outside the list; the name is not echoed back."""
        if self._names is None or host is None:
            return
        if host_name(host) not in self._names:
            raise PermissionDenied(
                "this server answers only requests addressed to its own names (a loopback name or one "
                "in server.allowed_hosts); the Host header named another"
            )
