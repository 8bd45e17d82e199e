"""The OpenAPI document the package ships (``tensorgate/protocols/http/openapi.yaml``) against a real
server over the example repository (at a budget the suite can afford): Schemathesis generates
requests from the document, within its schemas and outside them, and runs every check it has
(its ``--checks all``) but ``positive_data_acceptance``: a request the document's schemas allow
may still be wrong for the model (a tensor's data that does not fill its shape, an input the model
does not take), which the server rightly refuses with 400. So no 5xx, only documented statuses,
content types, headers and bodies, a 4xx for every request outside the schemas, and a 405 with
a correct ``Allow`` for every undocumented method.

Also: the document is valid OpenAPI 3.0, every documented operation is served with exactly the
documented method, and the document and the app's route table list the same operations.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
import schemathesis.checks
import yaml
from hypothesis import HealthCheck, assume, settings

from tensorgate.clock import MonotonicClock
from tensorgate.models.manager import ModelManager
from tensorgate.models.service import InferenceService
from tensorgate.observability.metrics import Metrics
from tensorgate.protocols.http.app import HttpApp, HttpSettings
from tensorgate.protocols.http.v2_codec import DecodeLimits
from tensorgate.testing import ServerProcess

DOCUMENT: dict[str, Any] = yaml.safe_load(files("tensorgate.protocols.http").joinpath("openapi.yaml").read_text())
SCHEMA = schemathesis.openapi.from_dict(DOCUMENT)
CHECKS = [check for check in schemathesis.checks.CHECKS.get_all() if check.__name__ not in {"positive_data_acceptance"}]
# 40 operations: ~15 examples each (positive and negative) keeps the whole run near 20 s on 2 cores.
EXAMPLES_PER_OPERATION = 15
METHODS = ("get", "post")
FILLED = {"{model}": "mlp", "{version}": "1"}  # a model and version the example repository has
# OpenAPI matches a concrete path before a templated one: ``GET /v2/models/stats`` is the statistics
# operation, not the metadata of a model named "stats" (which negative generation offers).
CONCRETE_PATHS = frozenset(path for path in DOCUMENT["paths"] if "{" not in path)


@pytest.fixture(scope="module")
def server(example_repo: Path) -> Iterator[ServerProcess]:
    with ServerProcess("--model-repository", str(example_repo)) as process:
        yield process


def _asks_for_a_deadline(case: Any) -> bool:
    """A request with its own ``timeout`` parameter (microseconds) may expire before it runs: 504 is
    the documented answer (the error table's DEADLINE_EXCEEDED), not a server fault."""
    body = case.body if isinstance(case.body, dict) else {}
    params = body.get("parameters")
    return isinstance(params, dict) and "timeout" in params


@SCHEMA.parametrize()
@settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
def test_responses_conform_to_the_document(case: Any, server: ServerProcess) -> None:
    assume(case.path == case.formatted_path or case.formatted_path not in CONCRETE_PATHS)
    response = case.call(base_url=server.url, timeout=10)
    checks = CHECKS
    if response.status_code == 504 and _asks_for_a_deadline(case):
        checks = [c for c in CHECKS if c is not schemathesis.checks.not_a_server_error]
    case.validate_response(response, checks=checks)


def test_the_document_is_valid_openapi() -> None:
    assert DOCUMENT["openapi"].startswith("3.0.")
    SCHEMA.validate()  # against the OpenAPI 3.0 meta-schema; raises on any violation
    schemas = DOCUMENT["components"]["schemas"]
    health = {"/v2/health/live": schemas["ServerLive"], "/v2/health/ready": schemas["ServerReady"]}
    for path, item in DOCUMENT["paths"].items():
        for method in METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            for status, response in operation["responses"].items():
                target = _resolve(response)
                if int(status) < 400:
                    continue
                schema = _resolve(target["content"]["application/json"]["schema"])  # every error has a body
                if path in health and status == "400":  # not live / not ready: the protocol's own body
                    assert schema == health[path], path
                elif path.endswith("/ready") and status == "400":  # not ready, or a bad name
                    assert [_resolve(s) for s in schema["oneOf"]] == [schemas["ModelReady"], schemas["Error"]]
                else:
                    assert schema == schemas["Error"], (path, method, status)


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        found: Any = DOCUMENT
        for part in node["$ref"].removeprefix("#/").split("/"):
            found = found[part]
        node = found
    return node


def _served_routes() -> set[tuple[str, str]]:
    """Every (method, path template) the HTTP app's route table holds."""
    manager = ModelManager(MonotonicClock(), Metrics(process=False))
    settings = HttpSettings(max_body_bytes=1 << 20, limits=DecodeLimits(max_elements=1 << 20, max_json_depth=32))
    app = HttpApp(InferenceService(manager), settings, MonotonicClock())
    return {(method.lower(), pattern) for method, pattern in app.routes()}


def test_the_document_and_the_route_table_agree() -> None:
    served = _served_routes()
    assert ("post", "/v2/models/{model}/infer") in served and ("get", "/v1/models") in served  # the reading works
    documented = {(method, path) for path, item in DOCUMENT["paths"].items() for method in item if method in METHODS}
    assert served - documented == set(), "routes missing from the document"
    assert documented - served == set(), "documented operations no route serves"


def test_every_documented_operation_is_served_with_its_method(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        for template, item in DOCUMENT["paths"].items():
            path = template
            for placeholder, value in FILLED.items():
                path = path.replace(placeholder, value)
            for method in METHODS:
                response = client.request(method.upper(), path, json={} if method == "post" else None)
                if method in item:
                    unrouted = response.status_code == 404 and response.json()["error"].startswith("no route")
                    assert not unrouted, (method, template)
                    assert response.status_code != 405, (method, template)
                else:  # a wrong method is 405 on every route, before any other check
                    assert response.status_code == 405, (method, template, response.status_code)
                    assert response.headers["allow"], (method, template)
                    assert response.json()["error"]


def test_the_server_serves_the_document_as_json(server: ServerProcess) -> None:
    response = httpx.get(f"{server.url}/openapi.json", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == DOCUMENT
    assert httpx.head(f"{server.url}/openapi.json", timeout=10).status_code == 200


def test_the_document_is_behind_the_gate_of_the_metadata(example_repo: Path, tmp_path: Path) -> None:
    key = "openapi-reader-key-0123456789"
    (tmp_path / "api_keys").write_text(
        f"{hashlib.sha256(key.encode()).hexdigest()} reader infer\n"
    )  # sha256 name roles
    config = {"server": {"model_repository": str(example_repo), "auth": {"api_keys_file": str(tmp_path / "api_keys")}}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    with ServerProcess("--config", str(tmp_path / "config.yaml")) as locked, httpx.Client(timeout=10) as client:
        for path in ("/openapi.json", "/v2"):
            anonymous = client.get(locked.url + path)
            assert anonymous.status_code == 401, path
            assert anonymous.json()["error"]
            wrong = client.get(locked.url + path, headers={"authorization": "Bearer not-the-key-0000000000"})
            assert wrong.status_code == 401, path
            assert client.get(locked.url + path, headers={"authorization": f"Bearer {key}"}).status_code == 200
