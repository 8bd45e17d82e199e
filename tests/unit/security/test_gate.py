"""The gate: open where nothing is configured, and with authentication on, 401, 403 and 429 in
that order, each counted; an error never lets a request through (S-19)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tls_material import Signer, key_line

from tensorgate.clock import ManualClock
from tensorgate.config.server_config import JwtSection
from tensorgate.errors import PermissionDenied, RateLimited, Unauthenticated
from tensorgate.security.admin_keys import read_admin_keys
from tensorgate.security.api_keys import ApiKeysFile
from tensorgate.security.gate import Gate, credential_of
from tensorgate.security.identity import Limits
from tensorgate.security.jwt_tokens import JwtVerifier

INFER_KEY, OPS_KEY, ADMIN_KEY = "infer-key-0123456789", "ops-key-0123456789ab", "admin-key-from-the-admin-file"


@pytest.fixture
def refused() -> list[tuple[str, str]]:
    return []


def _gate(tmp_path: Path, refused: list[tuple[str, str]], **options: object) -> Gate:
    keys = tmp_path / "api_keys"
    keys.write_text(
        key_line(INFER_KEY, "team-a", "infer", "resnet", "rate=1", "burst=2")
        + "\n"
        + key_line(OPS_KEY, "ops", "metrics")
        + "\n"
    )
    admin = tmp_path / "admin_keys"
    admin.write_text(ADMIN_KEY + "\n")
    clock = ManualClock()
    return Gate(
        clock,
        admin_keys=read_admin_keys(admin),
        api_keys=ApiKeysFile(keys, clock),
        on_refused=lambda who, outcome: refused.append((who, outcome)),
        **options,  # type: ignore[arg-type]
    )


def test_with_nothing_configured_inference_is_open_and_admin_calls_are_disabled() -> None:
    gate = Gate(ManualClock())
    assert not gate.enabled
    assert gate.check("infer", None, None) is None
    assert gate.check("health", None, None) is None
    with pytest.raises(PermissionDenied, match="disabled"):
        gate.check("admin", f"Bearer {ADMIN_KEY}", None)


def test_with_only_admin_keys_only_admin_calls_need_one(tmp_path: Path) -> None:
    (tmp_path / "admin").write_text(ADMIN_KEY + "\n")
    gate = Gate(ManualClock(), admin_keys=read_admin_keys(tmp_path / "admin"))
    assert gate.check("infer", None, None) is None
    with pytest.raises(Unauthenticated, match="needs an admin key"):
        gate.check("admin", None, None)
    assert gate.check("admin", f"Bearer {ADMIN_KEY}", None) is not None


def test_the_caller_the_role_and_the_model(tmp_path: Path, refused: list[tuple[str, str]]) -> None:
    gate = _gate(tmp_path, refused)
    assert gate.enabled
    assert gate.check("health", None, None) is None  # load balancers and kubelets need no key
    with pytest.raises(Unauthenticated, match="needs credentials"):
        gate.check("infer", None, None)
    with pytest.raises(Unauthenticated, match="not valid"):
        gate.check("infer", "Bearer not-a-key", None)
    with pytest.raises(Unauthenticated, match="Bearer scheme"):
        gate.check("infer", f"Basic {INFER_KEY}", None)
    team = gate.check("infer", f"Bearer {INFER_KEY}", None)
    assert team is not None and team.name == "team-a"
    assert gate.check("infer", None, INFER_KEY) == team  # X-API-Key works as well
    with pytest.raises(PermissionDenied, match="'team-a' does not have the 'admin' role"):
        gate.check("admin", f"Bearer {INFER_KEY}", None)
    with pytest.raises(PermissionDenied, match="does not have the 'infer' role"):
        gate.check("infer", f"Bearer {OPS_KEY}", None)
    assert gate.check("metrics", None, OPS_KEY) is not None
    assert gate.check("admin", f"bearer {ADMIN_KEY}", None) is not None  # the admin file is an admin source
    gate.check_model(team, "resnet")
    with pytest.raises(PermissionDenied, match="may not use this model"):
        gate.check_model(team, "bert")
    with pytest.raises(PermissionDenied, match="only some models"):
        gate.check_all_models(team)
    assert refused == [
        ("-", "unauthenticated"),
        ("-", "unauthenticated"),
        ("-", "unauthenticated"),
        ("team-a", "forbidden"),
        ("ops", "forbidden"),
        ("team-a", "forbidden"),
        ("team-a", "forbidden"),
    ]


def test_health_can_be_closed(tmp_path: Path, refused: list[tuple[str, str]]) -> None:
    gate = _gate(tmp_path, refused, public_health=False)
    with pytest.raises(Unauthenticated):
        gate.check("health", None, None)
    assert gate.check("health", None, OPS_KEY) is not None  # any valid caller, whatever its roles


def test_limits_are_per_identity_and_counted(tmp_path: Path, refused: list[tuple[str, str]]) -> None:
    gate = _gate(tmp_path, refused)
    team = gate.check("infer", f"Bearer {INFER_KEY}", None)
    for _ in range(2):
        gate.admit(team)
        gate.release(team)
    with pytest.raises(RateLimited):
        gate.admit(team)
    assert refused[-1] == ("team-a", "rate_limited")


def test_tokens_and_keys_side_by_side(tmp_path: Path, refused: list[tuple[str, str]]) -> None:
    signer = Signer()
    jwks = signer.write_jwks(tmp_path / "jwks.json")
    verifier = JwtVerifier(JwtSection(jwks_file=jwks, issuer=signer.issuer, audience=signer.audience), Limits())
    gate = _gate(tmp_path, refused, tokens=verifier)
    assert gate.check("infer", f"Bearer {signer.token(scope='infer')}", None).name == "svc-a"  # type: ignore[union-attr]
    assert gate.check("infer", f"Bearer {INFER_KEY}", None) is not None
    with pytest.raises(Unauthenticated, match="expired"):
        gate.check("infer", f"Bearer {signer.token(scope='infer', exp=1)}", None)
    with pytest.raises(PermissionDenied):
        gate.check("admin", f"Bearer {signer.token(scope='infer')}", None)


def test_credentials_from_the_headers() -> None:
    assert credential_of("Bearer  abc ", None) == "abc"
    assert credential_of(None, " abc") == "abc"
    assert credential_of("bearer abc", "other") == "abc"  # Authorization wins
    assert credential_of(None, None) is None
