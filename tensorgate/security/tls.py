"""TLS for the HTTP and gRPC ports: one policy for both, and certificates that rotate without a restart.

TLS 1.2 and 1.3 only; on 1.2 only forward-secret AEAD suites (ECDHE with AES-GCM or ChaCha20), no
compression, no renegotiation. ALPN offers ``h2`` on the gRPC port (gRPC clients require it) and
``http/1.1`` on the HTTP port. With a client CA, a client certificate it signed is verified, and
with ``require_client_cert`` one without is refused in the handshake (mutual TLS).

Rotation: :class:`CertificateFiles` notices when the files change (``poll``, once a second from the
server) and loads the new pair into the contexts the listeners already hold, so the next handshake
presents the new certificate and connections already open keep theirs. A pair that does not load
(half-written, a key that does not match) is logged and the old one stays in use.
"""

from __future__ import annotations

import logging
import os
import ssl
from pathlib import Path

from tensorgate.config.server_config import TlsSection
from tensorgate.errors import ConfigError

log = logging.getLogger(__name__)

POLL_S = 1.0
_CIPHERS_TLS12 = "ECDHE+AESGCM:ECDHE+CHACHA20"
HTTP_ALPN = ["http/1.1"]
GRPC_ALPN = ["h2"]


def _context(settings: TlsSection, alpn: list[str]) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(_CIPHERS_TLS12)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION | ssl.OP_CIPHER_SERVER_PREFERENCE
    context.set_alpn_protocols(alpn)
    _load(context, settings)
    if settings.client_ca_file is not None:
        context.verify_mode = ssl.CERT_REQUIRED if settings.require_client_cert else ssl.CERT_OPTIONAL
    return context


def _load(context: ssl.SSLContext, settings: TlsSection) -> None:
    try:
        context.load_cert_chain(settings.cert_file, settings.key_file)
        if settings.client_ca_file is not None:
            context.load_verify_locations(cafile=settings.client_ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"tls: cannot load the certificate, key or client CA ({exc})") from exc


class CertificateFiles:
    """The server's TLS contexts, one per listener, reloaded together when the files change."""

    def __init__(self, settings: TlsSection) -> None:
        self._settings = settings
        self._stamp = self._stat()
        self.contexts: list[ssl.SSLContext] = []
        self.reloads = 0

    def context(self, alpn: list[str]) -> ssl.SSLContext:
        """A server context for one listener (ConfigError when the files do not load)."""
        context = _context(self._settings, alpn)
        self.contexts.append(context)
        return context

    def _paths(self) -> list[Path]:
        s = self._settings
        return [p for p in (s.cert_file, s.key_file, s.client_ca_file) if p is not None]

    def _stat(self) -> tuple[tuple[int, int, int], ...]:
        stamps = []
        for path in self._paths():
            try:
                st = os.stat(path)
            except OSError:
                stamps.append((0, 0, 0))
                continue
            stamps.append((st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(stamps)

    def poll(self) -> bool:
        """Reload when a file changed; True when the new pair is now in use."""
        stamp = self._stat()
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            _load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), self._settings)  # the new files load at all
            for context in self.contexts:
                _load(context, self._settings)
        except ConfigError as exc:
            log.error("keeping the TLS certificate in use: %s", exc)
            return False
        self.reloads += 1
        log.info("reloaded the TLS certificate from %s", self._settings.cert_file)
        return True
