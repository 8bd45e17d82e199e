"""The Open Inference Protocol's own REST specification (``fixtures/open_inference_rest.yaml``, verbatim
from kserve/open-inference-protocol) drives schemathesis against the server: no 5xx, and every answer
as the specification allows.

Two changes are made to the document before it is read, because as published it cannot be run:

- its paths write parameters as ``${MODEL_NAME}``, which is not OpenAPI's templating: they become
  ``{MODEL_NAME}``;
- the model and version parameters are plain strings, so generated requests would name models the
  server does not have (404, which the document does not list for its operations): they are pinned
  to a model and version the server serves (``simple``, ``1``).

Every check schemathesis has (its ``--checks all``) runs, but for two the document's known gaps make
meaningless:

- ``positive_data_acceptance``: the specification's ``inference_request`` ties neither ``data`` to
  ``shape`` and ``datatype`` nor the tensors to the model, so a body it calls valid is almost always
  wrong for the model, and the 400 that says so is the right answer;
- ``status_code_conformance`` on requests generated *outside* the schema (negative mode): the
  document lists no error status for its health, readiness and metadata operations and only 400 for
  ``infer``, so any refusal of such a request (400 for a version that is not a number, 404 for a
  model name outside the pin) is one it does not list. ``negative_data_rejection`` still checks that
  each of those requests is refused with a 4xx; requests within the schema keep every check.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import schemathesis
import schemathesis.checks
import yaml
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode

from tensorgate.testing import ServerProcess

SPEC = Path(__file__).parent / "fixtures" / "open_inference_rest.yaml"
PINNED = {"MODEL_NAME": "simple", "MODEL_VERSION": "1"}
NOT_MEANINGFUL = {"positive_data_acceptance"}


def _document() -> dict[str, Any]:
    text = SPEC.read_text(encoding="utf-8")
    for name in PINNED:
        text = text.replace("${" + name + "}", "{" + name + "}")
    document: dict[str, Any] = yaml.safe_load(text)
    for item in document["paths"].values():
        for parameter in item.get("parameters", []):
            if parameter.get("in") == "path" and parameter["name"] in PINNED:
                parameter["schema"] = {"type": "string", "enum": [PINNED[parameter["name"]]]}
    return document


def _schema(mode: GenerationMode) -> Any:
    schema = schemathesis.openapi.from_dict(DOCUMENT)
    schema.config.generation.update(modes=[mode])
    return schema


DOCUMENT = _document()
POSITIVE, NEGATIVE = _schema(GenerationMode.POSITIVE), _schema(GenerationMode.NEGATIVE)
CHECKS = [check for check in schemathesis.checks.CHECKS.get_all() if check.__name__ not in NOT_MEANINGFUL]
OUTSIDE_CHECKS = [check for check in CHECKS if check.__name__ != "status_code_conformance"]
HYPOTHESIS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)


def test_the_published_document_needed_only_the_two_changes() -> None:
    assert "${MODEL_NAME}" in SPEC.read_text(encoding="utf-8")  # the fixture is the published text
    assert all("$" not in path for path in DOCUMENT["paths"])
    assert {"/v2/health/live", "/v2/health/ready", "/v2/"} <= set(DOCUMENT["paths"])
    assert len(CHECKS) == len(schemathesis.checks.CHECKS.get_all()) - len(NOT_MEANINGFUL)


@POSITIVE.parametrize()
@HYPOTHESIS
def test_every_answer_is_as_the_specification_allows(case: Any, triton_server: ServerProcess) -> None:
    response = case.call(base_url=triton_server.url, timeout=10)
    case.validate_response(response, checks=CHECKS)


@NEGATIVE.parametrize()
@HYPOTHESIS
def test_every_request_outside_the_specification_is_refused(case: Any, triton_server: ServerProcess) -> None:
    response = case.call(base_url=triton_server.url, timeout=10)
    case.validate_response(response, checks=OUTSIDE_CHECKS)


@pytest.mark.parametrize("path", ["/v2/health/live", "/v2/health/ready", "/v2/models/simple/versions/1/ready"])
def test_the_health_routes_answer_the_prose_specifications_bodies(triton_server: ServerProcess, path: str) -> None:
    """The YAML declares no body for these; the prose specification (inference_rest.md) does."""
    import httpx

    body = httpx.get(f"{triton_server.url}{path}", timeout=10).json()
    expected = {"live": True} if path.endswith("live") else {"ready": True}
    if "models" in path:
        expected = {"name": "simple", "ready": True}
    assert body == expected
