"""The live status page (``GET /`` and ``GET /status``): one static HTML file with its CSS and
script inline, read once at startup. It polls ``GET /v2/status`` (``models/status.py``) every second.

No build step and nothing from a CDN, so it works on a host with no way out. Its
Content-Security-Policy allows exactly its own inline script and style (by their SHA-256 hashes) and
requests to this server only: a page that can be framed or made to load scripts would be a way in.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass
from importlib.resources import files

_INLINE = re.compile(r"<(script|style)>(.*?)</\1>", re.DOTALL)


@dataclass(frozen=True, slots=True)
class StatusPage:
    body: bytes
    content_security_policy: str

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        """What the page is served with: its policy, no framing or referrer, never cached."""
        return [
            (b"content-type", b"text/html; charset=utf-8"),
            (b"content-security-policy", self.content_security_policy.encode()),
            (b"x-frame-options", b"DENY"),
            (b"referrer-policy", b"no-referrer"),
            (b"cache-control", b"no-store"),
        ]


def _hashes(html: str, tag: str) -> str:
    digests = [hashlib.sha256(text.encode()).digest() for kind, text in _INLINE.findall(html) if kind == tag]
    return " ".join(f"'sha256-{base64.b64encode(d).decode()}'" for d in digests) or "'none'"


def status_page() -> StatusPage:
    """The page and the policy that lets its own inline script and style run; called at startup."""
    html = files("tensorgate.observability").joinpath("status_page.html").read_text(encoding="utf-8")
    policy = (
        f"default-src 'none'; script-src {_hashes(html, 'script')}; style-src {_hashes(html, 'style')}; "
        "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    return StatusPage(html.encode("utf-8"), policy)
