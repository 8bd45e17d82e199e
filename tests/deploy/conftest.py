"""Manifest validation shared by the Kubernetes and KServe tests.

Built-in kinds are validated by kubernetes-validate against the Kubernetes API schemas, strict
(unknown fields rejected, as ``kubectl apply``'s server-side field validation does). Custom
resources (KServe's ClusterServingRuntime and InferenceService, the Prometheus operator's
ServiceMonitor) are validated against the openAPIV3Schema of their CRDs, committed trimmed under
``fixtures/crds`` with their sources in each file's header. Where a CRD embeds a Kubernetes type
(a Container, a Volume), the fixture names it and that part is validated against the same
Kubernetes schema as the built-in kinds.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import all_versions, major_minor
from referencing import Registry, Resource

CRDS = Path(__file__).parent / "fixtures" / "crds"
# The oldest release the manifests promise (the preStop sleep action is on by default from 1.30,
# and 1.33 is the oldest still maintained) and the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.33", major_minor(all_versions()[-1]))
DEFINITIONS_URI = "https://kubernetes.io/api/_definitions.json"

Manifest = dict[str, Any]


@cache
def _definitions(version: str) -> Manifest:
    """kubernetes-validate's strict definitions (every API type) for one Kubernetes release."""
    folder = next(v for v in all_versions() if major_minor(v) == version)
    path = resources.files("kubernetes_validate") / "kubernetes-json-schema" / f"v{folder}-local-strict"
    return json.loads((path / "_definitions.json").read_text())


def _schema(node: Any, definitions: Manifest) -> Any:
    """A CRD's structural schema as JSON Schema: core types resolved, unknown fields rejected."""
    if isinstance(node, list):
        return [_schema(item, definitions) for item in node]
    if not isinstance(node, dict):
        return node
    if "x-tensorgate-core-type" in node:
        return {"$ref": f"{DEFINITIONS_URI}#/$defs/{node['x-tensorgate-core-type']}"}
    out: Manifest = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {name: _schema(schema, definitions) for name, schema in value.items()}
        elif not key.startswith("x-"):
            out[key] = _schema(value, definitions)
    for name in node.get("x-tensorgate-inline-core-types", []):
        # Go's `json:",inline"`: the Kubernetes type's fields sit beside the CRD's own, none required.
        for field, schema in definitions["$defs"][name]["properties"].items():
            out.setdefault("properties", {}).setdefault(field, _absolute_refs(schema))
    preserves = node.get("x-kubernetes-preserve-unknown-fields", False)
    if "properties" in out and "additionalProperties" not in out and not preserves:
        out["additionalProperties"] = False
    return out


def _absolute_refs(node: Any) -> Any:
    """A schema copied out of the definitions, its references (``#/$defs/...``) still pointing there."""
    if isinstance(node, list):
        return [_absolute_refs(item) for item in node]
    if not isinstance(node, dict):
        return node
    return {
        key: DEFINITIONS_URI + value if key == "$ref" and value.startswith("#") else _absolute_refs(value)
        for key, value in node.items()
    }


@cache
def _custom_resource_validators(version: str) -> dict[tuple[str, str], jsonschema.Draft202012Validator]:
    definitions = _definitions(version)
    registry: Registry[Any] = Registry().with_resource(DEFINITIONS_URI, Resource.from_contents(definitions))
    validators = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for served in crd["spec"]["versions"]:
            schema = _schema(served["schema"]["openAPIV3Schema"], definitions)
            schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
            schema["properties"]["apiVersion"] = {"const": f"{group}/{served['name']}"}
            schema["properties"]["kind"] = {"const": kind}
            schema["properties"]["metadata"] = {
                "$ref": f"{DEFINITIONS_URI}#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
            }
            schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata"})
            validators[(f"{group}/{served['name']}", kind)] = jsonschema.Draft202012Validator(schema, registry=registry)
    return validators


def validate_manifest(document: Manifest, version: str) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``document`` is valid for Kubernetes ``version``."""
    custom = _custom_resource_validators(version).get((document.get("apiVersion", ""), document.get("kind", "")))
    if custom is not None:
        custom.validate(document)
        return
    # Raises SchemaNotFoundError for a kind that is neither built in nor under fixtures/crds: an
    # unknown kind is a failure, not a pass.
    kubernetes_validate.validate(document, version, strict=True)


@pytest.fixture(params=KUBERNETES_VERSIONS)
def kubernetes_version(request: pytest.FixtureRequest) -> str:
    """Each Kubernetes release the manifests are validated for."""
    version: str = request.param
    return version


@pytest.fixture(scope="session")
def manifest_validator() -> Callable[[Manifest, str], None]:
    return validate_manifest
