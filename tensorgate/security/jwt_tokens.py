"""OAuth2 bearer tokens (JWT) checked offline: the keys come from a JWKS file, never a fetch.

Only RS256 and ES256 are taken, each only with a key of its own type from the file, so a token
signed ``none`` or HS256 (with the public key as its "secret") is refused before any signature
check. PyJWT checks the signature, ``exp`` and ``nbf`` (with ``leeway_s``), the issuer and the
audience; ``exp``, ``iss``, ``aud`` and ``sub`` must be present.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import jwt

from tensorgate.config.server_config import JwtSection
from tensorgate.errors import ConfigError, Unauthenticated
from tensorgate.security.identity import ROLES, Identity, Limits

log = logging.getLogger(__name__)

# Each algorithm with the one key type it may be verified with.
_KEY_TYPES = {"RS256": "RSA", "ES256": "EC"}
_REQUIRED = ["exp", "iss", "aud", "sub"]


def looks_like_jwt(credential: str) -> bool:
    """A compact JWS: three base64url parts, the header a JSON object (``eyJ`` is ``{"``)."""
    return credential.startswith("eyJ") and credential.count(".") == 2


def _read_jwks(path: Path) -> dict[str, jwt.PyJWK]:
    try:
        text = path.read_text(encoding="utf-8")
        keys = jwt.PyJWKSet.from_json(text).keys
    except (OSError, UnicodeDecodeError, jwt.PyJWTError, ValueError) as exc:
        raise ConfigError(f"jwks_file {path}: not a JWKS document this server can use ({exc})") from exc
    usable = {k.key_id: k for k in keys if k.key_id and k.key_type in _KEY_TYPES.values()}
    if not usable:
        raise ConfigError(f"jwks_file {path}: holds no RSA or EC key with a 'kid'")
    return usable


class JwtVerifier:
    def __init__(self, settings: JwtSection, limits: Limits) -> None:
        self._settings = settings
        self._keys = _read_jwks(settings.jwks_file)
        self._limits = limits
        self._label = f"jwt:{settings.issuer}"[:80]  # one metrics label per issuer, not per subject

    def verify(self, token: str) -> Identity:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise Unauthenticated("the bearer token is not a well-formed JWT") from None
        algorithm = header.get("alg")
        if algorithm not in _KEY_TYPES:
            raise Unauthenticated("the token's algorithm is not accepted (RS256 or ES256)")
        key = self._keys.get(str(header.get("kid")))
        if key is None or key.key_type != _KEY_TYPES[algorithm]:
            raise Unauthenticated("the token is not signed by a key this server trusts")
        s = self._settings
        try:
            claims = jwt.decode(
                token,
                key.key,
                algorithms=[algorithm],
                audience=s.audience,
                issuer=s.issuer,
                leeway=s.leeway_s,
                options={"require": _REQUIRED},
            )
        except jwt.ExpiredSignatureError:
            raise Unauthenticated("the token has expired") from None
        except jwt.ImmatureSignatureError:
            raise Unauthenticated("the token is not valid yet") from None
        except jwt.InvalidAudienceError:
            raise Unauthenticated("the token is for another audience") from None
        except jwt.InvalidIssuerError:
            raise Unauthenticated("the token is from another issuer") from None
        except jwt.PyJWTError:
            raise Unauthenticated("the token is not valid") from None
        return Identity(
            str(claims["sub"])[:128],
            _roles(claims.get(s.roles_claim)),
            None if s.models_claim is None else _names(claims.get(s.models_claim)),
            self._limits,
            self._label,
        )


def _roles(claim: Any) -> frozenset[str]:
    """``scope`` as OAuth2 writes it (space-separated), or a list of roles; unknown ones ignored."""
    return frozenset(r for r in _names(claim) if r in ROLES)


def _names(claim: Any) -> frozenset[str]:
    if isinstance(claim, str):
        return frozenset(claim.split())
    if isinstance(claim, list):
        return frozenset(str(item) for item in claim)
    return frozenset()
