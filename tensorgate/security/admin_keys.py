"""Admin keys for the repository API: a file of keys, one per line.

It is one source of the ``admin`` role (an API keys file with ``admin`` lines is another); the
keys are kept only as digests (:mod:`tensorgate.security.key_table`).
"""

from __future__ import annotations

from pathlib import Path

from tensorgate.errors import ConfigError
from tensorgate.security.identity import Identity
from tensorgate.security.key_table import KeyTable, digest_of

ADMIN = Identity("admin", frozenset({"admin"}))


def read_admin_keys(path: Path) -> KeyTable:
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
    return KeyTable([(digest_of(key), ADMIN) for key in keys])
