"""One HTTP exchange as every route sees it: the request's record (:class:`Call`) and how answers go out
(:class:`Responder`), shared by the inference, management and generation routes."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from tensorgate.errors import TensorgateError, Unauthenticated
from tensorgate.protocols.http.disconnect import ConnectionWatch
from tensorgate.protocols.http.routes import WrongMethod
from tensorgate.protocols.http.security_headers import NOSNIFF
from tensorgate.protocols.http.v2_codec import dumps
from tensorgate.security.gate import Gate
from tensorgate.security.identity import Identity

log = logging.getLogger(__name__)

Send = Callable[[dict[str, Any]], Awaitable[None]]
Header = tuple[bytes, bytes]

JSON: Header = (b"content-type", b"application/json")
_CLOSE: Header = (b"connection", b"close")


@dataclass(slots=True)
class Call:
    """What one HTTP exchange carries besides its body, filled in as the request goes (the access
    log reads it at the end)."""

    method: str
    path: str
    raw_path: str  # as sent, percent-encoded (routing splits it; ``path`` is decoded)
    # Raw, lower-case names (as the server hands them over) to raw values; a route decodes the few
    # it reads (``header``) instead of every header being decoded for every request.
    headers: dict[bytes, bytes]
    request_id: str
    model: str = "-"
    version: str = "-"
    status: int = 0
    queue_s: float = 0.0
    compute_s: float = 0.0
    connection: ConnectionWatch | None = None  # from our listener, which hands one to every request
    identity: Identity | None = None  # the caller, where authentication is on
    gate: Gate | None = None
    peer_host: str | None = None  # the client's address (None on a Unix socket)

    def __init__(self, method: str, path: str, headers: dict[bytes, bytes], request_id: str) -> None:
        # Written out: a generated dataclass __init__ stays interpreted under mypyc (see types.py).
        self.method = method
        self.path = path
        self.raw_path = path
        self.headers = headers
        self.request_id = request_id
        self.model = "-"
        self.version = "-"
        self.status = 0
        self.queue_s = 0.0
        self.compute_s = 0.0
        self.connection = None
        self.identity = None
        self.gate = None
        self.peer_host = None

    def header(self, name: bytes) -> str | None:
        value = self.headers.get(name)
        return None if value is None else value.decode("latin-1")

    def text_header(self, name: str) -> str | None:
        """A header by its lower-case name as text (the service's sticky-key reader)."""
        return self.header(name.encode("latin-1"))

    def allow_model(self, name: str) -> None:
        """403 for a caller limited to other models (nothing where authentication is off)."""
        if self.gate is not None:
            self.gate.check_model(self.identity, name)

    def may_use(self, name: str) -> bool:
        """Whether :meth:`allow_model` would pass, counting nothing (to filter a list)."""
        identity = self.identity
        return identity is None or identity.models is None or name in identity.models


class Responder:
    """Writes answers: an explicit length, the request id, ``nosniff``, and ``Connection: close``
    while the server drains (keep-alive clients and proxies reconnect elsewhere)."""

    def __init__(self, draining: Callable[[], bool]) -> None:
        self._draining = draining

    async def body(self, call: Call, send: Send, status: int, body: bytes, headers: list[Header]) -> None:
        call.status = status
        # An explicit length spares every response uvicorn's chunked framing.
        out = [
            *headers,
            (b"content-length", str(len(body)).encode()),
            (b"x-request-id", call.request_id.encode("latin-1")),
            NOSNIFF,
        ]
        if self._draining():
            out.append(_CLOSE)
        await send({"type": "http.response.start", "status": status, "headers": out})
        await send({"type": "http.response.body", "body": b"" if call.method == "HEAD" else body})

    async def json(self, call: Call, send: Send, status: int, document: Any) -> None:
        await self.body(call, send, status, dumps(document), [JSON])

    async def error(self, call: Call, send: Send, exc: TensorgateError) -> None:
        headers = [JSON]
        if exc.retry_after_s is not None:
            headers.append((b"retry-after", str(max(1, round(exc.retry_after_s))).encode()))
        if isinstance(exc, WrongMethod):  # a 405 names the methods the route takes (RFC 9110 15.5.6)
            headers.append((b"allow", exc.allow))
        if isinstance(exc, Unauthenticated):  # a 401 names the scheme to use (RFC 9110 11.6.1)
            headers.append((b"www-authenticate", b'Bearer realm="tensorgate"'))
        try:
            await self.body(call, send, exc.http_status, dumps({"error": exc.message}), headers)
        except Exception:  # the response had already started, or the client is gone
            log.debug("could not send the error response for %s", call.path)
