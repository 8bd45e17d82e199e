"""The metrics port's application: Prometheus' exposition, behind the same Host check and gate as the
other ports (the ``metrics`` role where authentication is on)."""

from __future__ import annotations

from typing import Any

import orjson
from prometheus_client import CollectorRegistry, make_asgi_app

from tensorgate.errors import TensorgateError, Unauthenticated
from tensorgate.protocols.http.security_headers import NOSNIFF
from tensorgate.security.gate import Gate
from tensorgate.security.hosts import HostAllowlist


def metrics_app(registry: CollectorRegistry, gate: Gate | None = None, hosts: HostAllowlist | None = None) -> Any:
    """Prometheus' exposition; where authentication is on, for callers with the ``metrics`` role; on
    loopback, for requests addressed to its names (``hosts``)."""
    app = _nosniff(make_asgi_app(registry=registry))
    checks_hosts = hosts is not None and hosts.checks
    if (gate is None or not gate.enabled) and not checks_hosts:
        return app

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            try:
                if hosts is not None:
                    hosts.check(_latin1(headers.get(b"host")))
                if gate is not None and gate.enabled:
                    authorization, api_key = headers.get(b"authorization"), headers.get(b"x-api-key")
                    gate.check("metrics", _latin1(authorization), _latin1(api_key))
            except TensorgateError as exc:
                await _refuse(send, exc)
                return
        await app(scope, receive, send)

    return guarded


def _nosniff(app: Any) -> Any:
    """Prometheus' answers with ``X-Content-Type-Options: nosniff``, as every answer has (S-20)."""

    async def with_nosniff(scope: dict[str, Any], receive: Any, send: Any) -> None:
        async def send_nosniff(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), NOSNIFF]}
            await send(message)

        await app(scope, receive, send_nosniff)

    return with_nosniff


def _latin1(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


async def _refuse(send: Any, exc: TensorgateError) -> None:
    headers = [(b"content-type", b"application/json"), NOSNIFF]
    if isinstance(exc, Unauthenticated):
        headers.append((b"www-authenticate", b'Bearer realm="tensorgate"'))
    await send({"type": "http.response.start", "status": exc.http_status, "headers": headers})
    await send({"type": "http.response.body", "body": orjson.dumps({"error": exc.message})})
