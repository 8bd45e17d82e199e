"""JWTs from a JWKS file: what is accepted, and every way a token is refused."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import jwt
import pytest
from tls_material import Signer

from tensorgate.config.server_config import JwtSection
from tensorgate.errors import ConfigError, Unauthenticated
from tensorgate.security.identity import Limits
from tensorgate.security.jwt_tokens import JwtVerifier, looks_like_jwt


@pytest.fixture(scope="module")
def signer() -> Signer:
    return Signer()


def _verifier(signer: Signer, tmp_path: Path, **settings: object) -> JwtVerifier:
    jwks = signer.write_jwks(tmp_path / "jwks.json")
    section = JwtSection(jwks_file=jwks, issuer=signer.issuer, audience=signer.audience, leeway_s=5, **settings)
    return JwtVerifier(section, Limits(requests_per_s=10))


def test_rs256_and_es256_tokens_give_their_subject_and_roles(signer: Signer, tmp_path: Path) -> None:
    verifier = _verifier(signer, tmp_path)
    identity = verifier.verify(signer.token(scope="infer metrics openid"))
    assert identity.name == "svc-a" and identity.roles == {"infer", "metrics"} and identity.models is None
    assert identity.limits == Limits(requests_per_s=10) and identity.metrics_label == f"jwt:{signer.issuer}"
    assert verifier.verify(signer.token(algorithm="ES256", scope="admin")).roles == {"admin"}


def test_roles_and_models_from_configured_claims(signer: Signer, tmp_path: Path) -> None:
    verifier = _verifier(signer, tmp_path, roles_claim="roles", models_claim="models")
    identity = verifier.verify(signer.token(roles=["infer", "superuser"], models=["resnet"]))
    assert identity.roles == {"infer"} and identity.models == {"resnet"}
    assert verifier.verify(signer.token(roles=["infer"])).models == frozenset()  # no claim: no model


def _b64(data: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


@pytest.mark.parametrize(
    ("claims", "reason"),
    [
        ({"exp": -60}, "expired"),  # times: seconds from when the test runs
        ({"nbf": 60}, "not valid yet"),
        ({"aud": "another-service"}, "another audience"),
        ({"iss": "https://elsewhere.test"}, "another issuer"),
        ({"sub": None}, "not valid"),
        ({"exp": None}, "not valid"),
    ],
)
def test_claims_that_do_not_hold_are_refused(
    signer: Signer, tmp_path: Path, claims: dict[str, object], reason: str
) -> None:
    now = int(time.time())
    claims = {k: now + v if k in ("exp", "nbf") and isinstance(v, int) else v for k, v in claims.items()}
    with pytest.raises(Unauthenticated, match=reason):
        _verifier(signer, tmp_path).verify(signer.token(**claims))


def test_the_leeway_covers_a_clock_a_little_behind(signer: Signer, tmp_path: Path) -> None:
    _verifier(signer, tmp_path).verify(signer.token(exp=int(time.time()) - 2))


def test_alg_none_and_hs256_with_the_public_key_are_refused(signer: Signer, tmp_path: Path) -> None:
    verifier = _verifier(signer, tmp_path)
    now = int(time.time())
    claims = {"iss": signer.issuer, "aud": signer.audience, "sub": "x", "exp": now + 60}
    unsigned = f"{_b64({'alg': 'none', 'typ': 'JWT', 'kid': 'rsa-1'})}.{_b64(claims)}."
    with pytest.raises(Unauthenticated, match="algorithm is not accepted"):
        verifier.verify(unsigned)
    # HS/RS confusion: the RSA public key (which anyone may have) used as an HMAC secret.
    import hashlib
    import hmac

    header_and_body = f"{_b64({'alg': 'HS256', 'typ': 'JWT', 'kid': 'rsa-1'})}.{_b64(claims)}"
    mac = hmac.new(signer.public_pem(), header_and_body.encode(), hashlib.sha256).digest()
    forged = f"{header_and_body}.{base64.urlsafe_b64encode(mac).rstrip(b'=').decode()}"
    with pytest.raises(Unauthenticated, match="algorithm is not accepted"):
        verifier.verify(forged)


def test_a_key_of_the_wrong_type_or_an_unknown_signer_is_refused(signer: Signer, tmp_path: Path) -> None:
    verifier = _verifier(signer, tmp_path)
    now = int(time.time())
    claims = {"iss": signer.issuer, "aud": signer.audience, "sub": "x", "exp": now + 60}
    # ES256 claimed, the RSA key named: refused before any signature check.
    confused = jwt.encode(claims, signer.ec, algorithm="ES256", headers={"kid": "rsa-1"})
    with pytest.raises(Unauthenticated, match="not signed by a key this server trusts"):
        verifier.verify(confused)
    stranger = Signer()
    with pytest.raises(Unauthenticated, match="not valid"):
        verifier.verify(stranger.token())  # same kid, another key: the signature fails
    with pytest.raises(Unauthenticated, match="well-formed"):
        verifier.verify("eyJ.not.a-token")


def test_a_jwks_without_a_usable_key_stops_the_start(tmp_path: Path) -> None:
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "h"}]}))
    with pytest.raises(ConfigError, match="no RSA or EC key"):
        JwtVerifier(JwtSection(jwks_file=path, issuer="i", audience="a"), Limits())
    path.write_text("not json")
    with pytest.raises(ConfigError, match="not a JWKS document"):
        JwtVerifier(JwtSection(jwks_file=path, issuer="i", audience="a"), Limits())


def test_what_looks_like_a_jwt() -> None:
    assert looks_like_jwt("eyJhbGciOi.eyJzdWIi.c2ln")
    assert not looks_like_jwt("key-of-team-a-0123456789")
    assert not looks_like_jwt("eyJ.only-one-dot")
