"""Who a request is queued for: the authenticated caller, else the tenant header, else the shared tenant."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tensorgate.config.server_config import ServerSection, TenantConfig
from tensorgate.errors import InvalidInput
from tensorgate.protocols.tenancy import Tenancy
from tensorgate.security.identity import Identity
from tensorgate.types import SHARED_TENANT, Tenant

TENANCY = Tenancy(True, "X-Tenant", {"batch": TenantConfig(weight=0.5, max_queued=10)})


def test_the_header_names_the_tenant_with_its_configured_share() -> None:
    assert TENANCY.resolve(None, "batch") == Tenant("batch", 0.5, 10)
    assert TENANCY.resolve(None, b"batch") == Tenant("batch", 0.5, 10)  # raw HTTP header bytes
    assert TENANCY.resolve(None, "someone") == Tenant("someone")  # unlisted: weight 1, no bound
    assert TENANCY.resolve(None, None) is SHARED_TENANT
    assert TENANCY.resolve(None, "") is SHARED_TENANT


def test_an_authenticated_caller_cannot_queue_as_another_tenant() -> None:
    caller = Identity(name="team-a", roles=frozenset({"infer"}))
    assert TENANCY.resolve(caller, "batch") == Tenant("team-a")


@pytest.mark.parametrize("value", ["x" * 65, "tab\there", "caf\u00e9"])
def test_a_malformed_header_is_a_client_error(value: str) -> None:
    with pytest.raises(InvalidInput, match="X-Tenant header must be 1 to 64 printable ASCII"):
        TENANCY.resolve(None, value)


def test_with_fair_queuing_off_everyone_shares_one_tenant() -> None:
    off = Tenancy(False, "X-Tenant", {"batch": TenantConfig()})
    assert off.resolve(Identity(name="team-a", roles=frozenset()), "batch") is SHARED_TENANT


def test_the_header_name_is_lower_cased_for_lookups() -> None:
    tenancy = Tenancy(True, "X-Team", {})
    assert tenancy.header_key == b"x-team" and tenancy.metadata_key == "x-team"


def test_tenant_settings_are_checked() -> None:
    with pytest.raises(ValidationError, match="greater than 0"):
        ServerSection.model_validate({"tenants": {"a": {"weight": 0}}})
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        ServerSection.model_validate({"tenants": {"a": {"max_queued": 0}}})
    with pytest.raises(ValidationError, match="pattern"):
        ServerSection.model_validate({"tenant_header": "X Tenant"})
