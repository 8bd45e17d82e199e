"""A table of SHA-256 key digests, each naming an identity, matched in constant time.

Only digests are held. A presented key is hashed and compared with every digest by
``hmac.compare_digest``, whatever matched before, so neither the comparison nor the position of
the match tells a caller how much of a key it got right.
"""

from __future__ import annotations

import hashlib
import hmac

from tensorgate.security.identity import Identity


def digest_of(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class KeyTable:
    def __init__(self, entries: list[tuple[bytes, Identity]]) -> None:
        self._entries = entries

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, key: str) -> Identity | None:
        presented = digest_of(key)
        found: Identity | None = None
        for digest, identity in self._entries:
            if hmac.compare_digest(presented, digest) and found is None:
                found = identity
        return found
