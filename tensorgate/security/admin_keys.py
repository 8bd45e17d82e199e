"""Admin keys for the repository API: a file of keys, one per line, checked in constant time.

Only SHA-256 digests of the keys are kept in memory; a presented key is hashed and compared with
every digest by ``hmac.compare_digest``, so neither the comparison nor the number of keys tried
tells a caller how much of a key it got right.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

from tensorgate.errors import ConfigError, Unauthenticated

_SCHEME = "bearer "


class AdminKeys:
    def __init__(self, keys: list[str]) -> None:
        self._digests = [hashlib.sha256(key.encode()).digest() for key in keys]

    @classmethod
    def from_file(cls, path: Path) -> AdminKeys:
        """Blank lines and ``#`` comments are skipped; a file with no key is refused at startup."""
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"admin_keys_file {path}: cannot read it ({exc})") from exc
        keys = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
        if not keys:
            raise ConfigError(f"admin_keys_file {path}: holds no key")
        if any(len(key) < 16 for key in keys):
            raise ConfigError(f"admin_keys_file {path}: every key must be at least 16 characters")
        return cls(keys)

    def check(self, authorization: str | None) -> None:
        """Pass for ``Bearer <a key from the file>``; raise Unauthenticated for anything else."""
        if authorization is None or authorization[: len(_SCHEME)].lower() != _SCHEME:
            raise Unauthenticated("the repository API needs an admin key: send 'Authorization: Bearer <key>'")
        presented = hashlib.sha256(authorization[len(_SCHEME) :].strip().encode()).digest()
        matched = False
        for digest in self._digests:  # every digest is compared, whatever matched before
            matched |= hmac.compare_digest(presented, digest)
        if not matched:
            raise Unauthenticated("the admin key is not valid")
