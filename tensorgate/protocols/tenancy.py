"""Who a request is queued for (``server.fair_queuing``, docs/fairness.md).

The tenant is the authenticated caller where authentication is on (a client cannot queue as
another), else the value of ``server.tenant_header`` (``X-Tenant``; gRPC metadata of the same
name, lower case), else the one shared tenant. Its weight and queue bound come from
``server.tenants``; a tenant not listed there has weight 1 and no bound of its own.
"""

from __future__ import annotations

from collections.abc import Mapping

from tensorgate.config.server_config import TenantConfig
from tensorgate.errors import InvalidInput
from tensorgate.security.identity import Identity
from tensorgate.types import SHARED_TENANT, Tenant

MAX_TENANT_CHARS = 64


class Tenancy:
    def __init__(self, enabled: bool, header: str, tenants: Mapping[str, TenantConfig]) -> None:
        self.enabled = enabled
        self.header = header
        self.header_key = header.lower().encode()  # as the HTTP server hands header names over
        self.metadata_key = header.lower()  # gRPC metadata keys are lower case
        self._known = {name: Tenant(name, c.weight, c.max_queued) for name, c in tenants.items()}

    @classmethod
    def off(cls) -> Tenancy:
        return cls(False, "X-Tenant", {})

    def resolve(self, identity: Identity | None, claimed: str | bytes | None) -> Tenant:
        """The request's tenant, from its authenticated caller or the header value it sent."""
        if not self.enabled:
            return SHARED_TENANT
        if identity is not None:
            name = identity.name
        elif claimed:
            name = claimed.decode("latin-1") if isinstance(claimed, bytes) else claimed
            if len(name) > MAX_TENANT_CHARS or not name.isprintable() or not name.isascii():
                raise InvalidInput(
                    f"the {self.header} header must be 1 to {MAX_TENANT_CHARS} printable ASCII characters"
                )
        else:
            return SHARED_TENANT
        known = self._known.get(name)
        return known if known is not None else Tenant(name)
