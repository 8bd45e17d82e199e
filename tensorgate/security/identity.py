"""Who a request comes from, and what that caller may do.

An :class:`Identity` comes from an API key line or a verified token. Roles are few and fixed:
``infer`` (inference, metadata, the OpenAI endpoints), ``admin`` (the repository API and anything
that changes state) and ``metrics`` (the metrics port).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from tensorgate.errors import PermissionDenied

Role = Literal["infer", "admin", "metrics"]
ROLES: frozenset[str] = frozenset(get_args(Role))


@dataclass(frozen=True, slots=True)
class Limits:
    """What one identity may use at once: a token bucket and a cap on requests in flight."""

    requests_per_s: float | None = None
    burst: int | None = None  # None: one second's worth of requests_per_s
    max_inflight: int | None = None

    def or_else(self, default: Limits) -> Limits:
        """Each limit this one leaves unset taken from ``default``."""
        return Limits(
            self.requests_per_s if self.requests_per_s is not None else default.requests_per_s,
            self.burst if self.burst is not None else default.burst,
            self.max_inflight if self.max_inflight is not None else default.max_inflight,
        )


NO_LIMITS = Limits()


@dataclass(frozen=True, slots=True)
class Identity:
    """``name`` is what logs and metrics show (never the key or the token)."""

    name: str
    roles: frozenset[str]
    models: frozenset[str] | None = None  # None: every model
    limits: Limits = NO_LIMITS
    label: str = ""  # the metrics label: the name for keys; one per issuer for tokens (bounded)

    def require(self, role: Role) -> None:
        if role not in self.roles:
            raise PermissionDenied(f"'{self.name}' does not have the '{role}' role")

    def require_model(self, model: str) -> None:
        if self.models is not None and model not in self.models:
            raise PermissionDenied(f"'{self.name}' may not use this model")

    @property
    def metrics_label(self) -> str:
        return self.label or self.name
