"""The security settings from flags and from a config file: paths resolved where they were written,
and combinations that cannot work refused with their reason."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from tensorgate.cli.serve import add_arguments, build_config
from tensorgate.errors import ConfigError


def _config(*argv: str):  # type: ignore[no-untyped-def]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return build_config(parser.parse_args(list(argv)))[0]


def test_flags_set_tls_mutual_tls_and_the_keys_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = _config(
        "--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-client-ca", "ca.pem", "--api-keys-file", "keys"
    )
    tls, auth = config.server.tls, config.server.auth
    assert tls is not None and auth is not None
    assert (tls.cert_file, tls.key_file, tls.client_ca_file) == (
        tmp_path / "c.pem",
        tmp_path / "k.pem",
        tmp_path / "ca.pem",
    )
    assert tls.require_client_cert  # the flag means mutual TLS
    assert auth.api_keys_file == tmp_path / "keys" and auth.public_health


def test_paths_in_a_config_file_are_relative_to_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "etc").mkdir()
    document = {
        "server": {
            "tls": {"cert_file": "tls/c.pem", "key_file": "/abs/k.pem", "client_ca_file": "ca.pem"},
            "auth": {"api_keys_file": "keys", "jwt": {"jwks_file": "jwks.json", "issuer": "i", "audience": "a"}},
            "max_connections": 100,
        }
    }
    (tmp_path / "etc" / "config.yaml").write_text(yaml.safe_dump(document))
    monkeypatch.chdir("/")
    server = _config("--config", str(tmp_path / "etc" / "config.yaml")).server
    assert server.tls is not None and server.auth is not None and server.auth.jwt is not None
    assert server.tls.cert_file == tmp_path / "etc" / "tls" / "c.pem"
    assert server.tls.key_file == Path("/abs/k.pem")
    assert not server.tls.require_client_cert  # optional client certificates, as the file says
    assert server.auth.api_keys_file == tmp_path / "etc" / "keys"
    assert server.auth.jwt.jwks_file == tmp_path / "etc" / "jwks.json"
    assert server.max_connections == 100


@pytest.mark.parametrize(
    ("server", "expected"),
    [
        ({"tls": {"cert_file": "c", "key_file": "k", "require_client_cert": True}}, "needs client_ca_file"),
        ({"metrics_tls": True}, "metrics_tls needs tls"),
        ({"auth": {"public_health": False}}, "auth needs api_keys_file or jwt"),
        ({"auth": {"api_keys_file": "k", "rate_limit": {"requests_per_s": 0}}}, "greater than 0"),
    ],
)
def test_settings_that_cannot_work_are_refused(tmp_path: Path, server: dict[str, object], expected: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"server": server}))
    with pytest.raises(ConfigError, match=expected):
        _config("--config", str(path))
