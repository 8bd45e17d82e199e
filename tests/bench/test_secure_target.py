"""``tensorgate bench`` against a server with TLS and API keys, on every tensor protocol: the
credential and the CA reach each connection, and a missing credential is counted as such."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from tls_material import Authority, key_line

from tensorgate.cli.main import main
from tensorgate.testing import ServerProcess

KEY = "bench-key-0123456789abc"


@pytest.fixture(scope="module")
def secure(example_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    directory = tmp_path_factory.mktemp("secure-bench")
    ca = Authority(directory)
    cert = ca.issue("server")
    (directory / "keys").write_text(key_line(KEY, "bench", "infer") + "\n")
    args = ["--model-repository", str(example_repo), "--tls-cert", str(cert.cert), "--tls-key", str(cert.key)]
    args += ["--api-keys-file", str(directory / "keys")]
    with ServerProcess(*args, tls_ca=ca.cert) as server:
        yield server, ca.cert


@pytest.mark.parametrize("protocol", ["v2-json", "v2-binary", "v1", "grpc", "grpc-stream"])
def test_every_protocol_over_tls_with_a_key(secure: tuple[ServerProcess, Path], tmp_path: Path, protocol: str) -> None:
    server, ca = secure
    url = f"grpcs://{server.grpc_address}" if protocol.startswith("grpc") else server.url
    out = tmp_path / "report.json"
    common = ["bench", "mlp", "-u", url, "--protocol", protocol, "-c", "2", "-n", "40", "--cacert", str(ca)]
    assert main([*common, "--api-key", KEY, "--json", str(out)]) == 0
    run = json.loads(out.read_text())["runs"][0]
    assert run["errors"] == {} and run["requests"] == 40


def test_without_the_key_the_errors_say_why(secure: tuple[ServerProcess, Path], tmp_path: Path) -> None:
    server, ca = secure
    out = tmp_path / "report.json"
    code = main(
        ["bench", "mlp", "-u", f"grpcs://{server.grpc_address}", "--protocol", "grpc", "-n", "5",
         "--cacert", str(ca), "--json", str(out)]
    )  # fmt: skip
    assert code == 1  # metadata itself needs the key: refused before the run, with the reason
