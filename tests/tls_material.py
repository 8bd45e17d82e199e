"""Certificates and keys the security tests make for themselves (``cryptography``): a CA, a server
certificate for 127.0.0.1 and localhost, client certificates, and JWKS documents with their keys."""

from __future__ import annotations

import datetime
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

_DAY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path
    serial: int


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _pem_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


class Authority:
    """A certificate authority in ``directory`` that issues server and client certificates."""

    def __init__(self, directory: Path, name: str = "tensorgate test CA") -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _DAY)
            .not_valid_after(now + 30 * _DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.cert = directory / f"{name.replace(' ', '-')}.pem"
        self.cert.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, stem: str, *, server: bool = True) -> Issued:
        """A certificate for ``stem`` (a server's for 127.0.0.1 and localhost, or a client's)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        serial = x509.random_serial_number()
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(stem))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(serial)
            .not_valid_before(now - _DAY)
            .not_valid_after(now + 30 * _DAY)
        )
        if server:
            import ipaddress

            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        cert = builder.sign(self._key, hashes.SHA256())
        cert_path, key_path = self.directory / f"{stem}.crt", self.directory / f"{stem}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _pem_key(key, key_path)
        return Issued(cert_path, key_path, serial)


def serial_of(pem_der: bytes) -> int:
    return x509.load_der_x509_certificate(pem_der).serial_number


def key_line(key: str, name: str, roles: str, *rest: str) -> str:
    """One line of an API keys file for ``key`` (the file holds its SHA-256 only)."""
    return " ".join([hashlib.sha256(key.encode()).hexdigest(), name, roles, *rest])


class Signer:
    """An RSA and an EC signing key, the JWKS document of their public halves, and tokens."""

    def __init__(self, issuer: str = "https://issuer.test", audience: str = "tensorgate") -> None:
        self.issuer, self.audience = issuer, audience
        self.rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.ec = ec.generate_private_key(ec.SECP256R1())

    def jwks(self) -> dict[str, Any]:
        keys = []
        for kid, key, algorithm in (("rsa-1", self.rsa, jwt.algorithms.RSAAlgorithm), ("ec-1", self.ec, None)):
            if algorithm is None:
                jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))
            else:
                jwk = json.loads(algorithm.to_jwk(key.public_key()))
            jwk["kid"] = kid
            keys.append(jwk)
        return {"keys": keys}

    def write_jwks(self, path: Path) -> Path:
        path.write_text(json.dumps(self.jwks()))
        return path

    def token(self, *, algorithm: str = "RS256", **claims: Any) -> str:
        now = int(time.time())
        body = {"iss": self.issuer, "aud": self.audience, "sub": "svc-a", "exp": now + 300, "iat": now, **claims}
        body = {k: v for k, v in body.items() if v is not None}
        key, kid = (self.rsa, "rsa-1") if algorithm == "RS256" else (self.ec, "ec-1")
        return jwt.encode(body, key, algorithm=algorithm, headers={"kid": kid})

    def public_pem(self) -> bytes:
        return self.rsa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
