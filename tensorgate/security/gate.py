"""The gate every request passes first, the same on HTTP and gRPC: who is calling (401), may they
do this (403), and are they within their limits (429). It sees only headers, so a request refused
here costs no body read, no decode and no queue slot.

Off by default: with no API keys file and no JWT settings, inference is open, and only the admin
routes need a credential (an admin key). Health stays open for load balancers and kubelets unless
``public_health`` is false. An error here always raises: nothing falls through to a handler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from tensorgate.clock import Clock
from tensorgate.errors import OUTCOME_BY_CODE, PermissionDenied, RateLimited, TensorgateError, Unauthenticated
from tensorgate.security.api_keys import ApiKeysFile
from tensorgate.security.identity import Identity
from tensorgate.security.jwt_tokens import JwtVerifier, looks_like_jwt
from tensorgate.security.key_table import KeyTable
from tensorgate.security.rate_limit import RateLimiter

# What a route asks of its caller: a role, or "health" (open unless public_health is off).
Access = Literal["health", "infer", "admin", "metrics"]
_BEARER = "bearer "
_ASK = "send 'Authorization: Bearer <key or token>' or 'X-API-Key: <key>'"


def credential_of(authorization: str | None, api_key: str | None) -> str | None:
    """The key or token a request carries: ``Authorization: Bearer ...``, else ``X-API-Key``."""
    if authorization is not None:
        if authorization[: len(_BEARER)].lower() != _BEARER:
            raise Unauthenticated(f"only the Bearer scheme is accepted; {_ASK}")
        return authorization[len(_BEARER) :].strip()
    if api_key is not None:
        return api_key.strip()
    return None


class Gate:
    def __init__(
        self,
        clock: Clock,
        *,
        admin_keys: KeyTable | None = None,
        api_keys: ApiKeysFile | None = None,
        tokens: JwtVerifier | None = None,
        public_health: bool = True,
        on_refused: Callable[[str, str], None] | None = None,
    ) -> None:
        self._clock = clock
        self._admin_keys = admin_keys
        self._api_keys = api_keys
        self._tokens = tokens
        self._public_health = public_health
        self._on_refused = on_refused  # (identity label, outcome): the refusals counter
        self._limiter = RateLimiter()
        self.enabled = api_keys is not None or tokens is not None  # every route but health needs a caller

    def check(self, access: Access, authorization: str | None, api_key: str | None) -> Identity | None:
        """The caller, or None where the route is open; raises Unauthenticated or PermissionDenied."""
        if access == "health" and (self._public_health or not self.enabled):
            return None
        if not self.enabled and access != "admin":
            return None
        try:
            if not self.enabled and self._admin_keys is None:
                raise PermissionDenied(
                    "admin calls (the model repository API) are disabled on this server: no admin keys are "
                    "configured (server.admin_keys_file)"
                )
            credential = credential_of(authorization, api_key)
            if not credential:
                needed = "an admin key" if access == "admin" else "credentials"
                raise Unauthenticated(f"this needs {needed}: {_ASK}")
            identity = self._resolve(credential)
        except TensorgateError as exc:
            self._refused("-", exc)
            raise
        if access != "health":
            try:
                identity.require(access)
            except PermissionDenied as exc:
                self._refused(identity.metrics_label, exc)
                raise
        return identity

    def _resolve(self, credential: str) -> Identity:
        if self._tokens is not None and looks_like_jwt(credential):
            return self._tokens.verify(credential)
        for table in (self._api_keys, self._admin_keys):
            identity = None if table is None else table.lookup(credential)
            if identity is not None:
                return identity
        raise Unauthenticated("the key is not valid")

    def admit(self, identity: Identity | None) -> None:
        """Within its rate and in-flight limits, or RateLimited. Pair with ``release``."""
        if identity is None:
            return
        try:
            self._limiter.admit(identity, self._clock.now())
        except RateLimited as exc:
            self._refused(identity.metrics_label, exc)
            raise

    def release(self, identity: Identity | None) -> None:
        if identity is not None:
            self._limiter.release(identity)

    def check_model(self, identity: Identity | None, model: str) -> None:
        if identity is None:
            return
        try:
            identity.require_model(model)
        except PermissionDenied as exc:
            self._refused(identity.metrics_label, exc)
            raise

    def check_all_models(self, identity: Identity | None) -> None:
        """Calls about every model at once (all statistics) are for callers not limited to some."""
        if identity is not None and identity.models is not None:
            exc = PermissionDenied(f"'{identity.name}' may use only some models; name one")
            self._refused(identity.metrics_label, exc)
            raise exc

    def _refused(self, label: str, exc: TensorgateError) -> None:
        if self._on_refused is not None:
            self._on_refused(label, OUTCOME_BY_CODE[exc.code])
