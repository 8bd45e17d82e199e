"""The API keys file: one line per key, holding the key's SHA-256 and never the key.

    # sha256 of the key                                               name     roles  models  limits
    9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08  billing  infer  resnet  rate=50
    60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752  ops      admin  *

``printf %s "$KEY" | sha256sum`` makes a line's first field. Roles are ``infer``, ``admin`` and
``metrics``; models are ``*`` (every model, the default) or a comma-separated list. ``rate`` (requests
per second), ``burst`` and ``inflight`` set that key's limits; without them the config's defaults hold.

The file is looked at again at most once a second and reloaded when it changes, so keys are added
and revoked without a restart; a new file with an error is logged and the old keys stay in force.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from tensorgate.clock import Clock
from tensorgate.errors import ConfigError
from tensorgate.names import is_valid_model_name
from tensorgate.security.identity import NO_LIMITS, ROLES, Identity, Limits
from tensorgate.security.key_table import KeyTable

log = logging.getLogger(__name__)

RECHECK_S = 1.0
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@:-]{0,63}$")
_LIMITS = {"rate": "requests_per_s", "burst": "burst", "inflight": "max_inflight"}


def parse_api_keys(text: str, source: str, defaults: Limits = NO_LIMITS) -> KeyTable:
    """Every line of the file as (digest, identity); ConfigError names the line and what it expected."""
    entries: list[tuple[bytes, Identity]] = []
    names: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{number}"
        fields = line.split()
        if len(fields) < 3:
            raise ConfigError(f"{where}: expected '<sha256 of the key> <name> <roles> [models] [rate=N ...]'")
        digest, name, roles = fields[0].lower(), fields[1], fields[2]
        if not _DIGEST.match(digest):
            raise ConfigError(f"{where}: the first field must be the key's SHA-256 as 64 hex digits, not the key")
        if not _NAME.match(name):
            raise ConfigError(f"{where}: the name must be 1-64 letters, digits or _.@:-")
        if name in names:
            raise ConfigError(f"{where}: the name '{name}' is on another line too")
        names.add(name)
        role_set = frozenset(roles.split(","))
        if not role_set <= ROLES:
            raise ConfigError(f"{where}: roles must be among {sorted(ROLES)}, got '{roles[:60]}'")
        rest = fields[3:]
        models: frozenset[str] | None = None
        if rest and "=" not in rest[0]:
            models = _models(rest.pop(0), where)
        limits = _limits(rest, where).or_else(defaults)
        entries.append((bytes.fromhex(digest), Identity(name, role_set, models, limits)))
    return KeyTable(entries)


def _models(field: str, where: str) -> frozenset[str] | None:
    if field == "*":
        return None
    models = frozenset(field.split(","))
    bad = sorted(m for m in models if not is_valid_model_name(m))
    if bad:
        raise ConfigError(f"{where}: models must be '*' or model names separated by commas")
    return models


def _limits(fields: list[str], where: str) -> Limits:
    values: dict[str, float | int] = {}
    for field in fields:
        key, _, value = field.partition("=")
        if key not in _LIMITS:
            raise ConfigError(f"{where}: unknown field '{field[:40]}'; expected rate=, burst= or inflight=")
        try:
            number = float(value) if key == "rate" else int(value)
        except ValueError:
            raise ConfigError(f"{where}: '{key}' must be a number, got '{value[:20]}'") from None
        if number <= 0:
            raise ConfigError(f"{where}: '{key}' must be above 0")
        values[_LIMITS[key]] = number
    return Limits(
        requests_per_s=float(values["requests_per_s"]) if "requests_per_s" in values else None,
        burst=int(values["burst"]) if "burst" in values else None,
        max_inflight=int(values["max_inflight"]) if "max_inflight" in values else None,
    )


class ApiKeysFile:
    """The keys of one file, reloaded when the file changes."""

    def __init__(self, path: Path, clock: Clock, defaults: Limits = NO_LIMITS) -> None:
        self._path = path
        self._clock = clock
        self._defaults = defaults
        self._stamp = self._stat()
        self.table = self._read()  # ConfigError at startup: a server does not start on a broken file
        self._checked = clock.now()

    def _stat(self) -> tuple[int, int, int]:
        try:
            st = os.stat(self._path)
        except OSError as exc:
            raise ConfigError(f"api_keys_file {self._path}: cannot read it ({exc.strerror})") from exc
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _read(self) -> KeyTable:
        try:
            text = self._path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"api_keys_file {self._path}: cannot read it ({exc})") from exc
        return parse_api_keys(text, str(self._path), self._defaults)

    def lookup(self, key: str) -> Identity | None:
        self.refresh()
        return self.table.lookup(key)

    def refresh(self) -> None:
        """Reload when the file changed since the last look (at most one look a second)."""
        now = self._clock.now()
        if now - self._checked < RECHECK_S:
            return
        self._checked = now
        try:
            stamp = self._stat()
            if stamp == self._stamp:
                return
            self._stamp = stamp
            table = self._read()
        except ConfigError as exc:
            log.error("keeping the API keys in force: %s", exc)
            return
        self.table = table
        log.info("reloaded %d API key(s) from %s", len(table), self._path)
