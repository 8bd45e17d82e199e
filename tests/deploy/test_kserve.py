"""The KServe manifests (deploy/kserve): tensorgate as a ClusterServingRuntime, and InferenceServices.

- Each manifest validates against KServe's CRD schemas (committed trimmed under fixtures/crds, with
  their source), and a broken one does not.
- The runtime speaks what its InferenceServices ask for (V2 and gRPC-V2, onnx and pytorch), and
  each example names it, a format it supports and a protocol it speaks.
- The container's args are ``tensorgate serve`` flags over the image's own config file
  (deploy/docker/config.yaml, which the Dockerfile copies to /config/config.yaml); a real server
  started with them answers the runtime's probe paths as Kubernetes expects, and its metrics where
  the runtime's Prometheus annotations say.
"""

from __future__ import annotations

import argparse
import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import yaml

from tensorgate.cli import serve
from tensorgate.testing import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
KSERVE = ROOT / "deploy" / "kserve"
IMAGE_CONFIG = ROOT / "deploy" / "docker" / "config.yaml"
CRDS = Path(__file__).parent / "fixtures" / "crds"
MANIFESTS = ("clusterservingruntime.yaml", "inferenceservice.yaml", "inferenceservice-grpc.yaml")
PORT_FLAGS = ("--http-port", "--grpc-port", "--metrics-port")

Manifest = dict[str, Any]


def _load(name: str) -> Manifest:
    document: Manifest = yaml.safe_load((KSERVE / name).read_text())
    return document


def _runtime() -> Manifest:
    return _load("clusterservingruntime.yaml")


def _container() -> Manifest:
    containers = _runtime()["spec"]["containers"]
    # KServe runs the predictor in the container of this name.
    (container,) = [c for c in containers if c["name"] == "kserve-container"]
    result: Manifest = container
    return result


def _serve_args(container: Manifest) -> argparse.Namespace:
    args = container["args"]
    assert args[0] == "serve", "the image's entrypoint is `tensorgate`; args start with the command"
    parser = argparse.ArgumentParser(prog="tensorgate serve", exit_on_error=False)
    serve.add_arguments(parser)
    return parser.parse_args(args[1:])


def _inference_services() -> list[Manifest]:
    return [_load(name) for name in MANIFESTS if _load(name)["kind"] == "InferenceService"]


@pytest.mark.parametrize("name", MANIFESTS)
def test_manifest_validates_against_the_crd(
    manifest_validator: Callable[[Manifest, str], None], kubernetes_version: str, name: str
) -> None:
    manifest_validator(_load(name), kubernetes_version)


@pytest.mark.parametrize(
    ("name", "break_it", "message"),
    [
        ("inferenceservice.yaml", lambda d: d["spec"]["predictor"]["model"].update(storageURI="x"), "storageURI"),
        ("inferenceservice.yaml", lambda d: d["spec"]["predictor"]["model"].update(modelFormat={}), "'name'"),
        ("inferenceservice.yaml", lambda d: d["spec"].pop("predictor"), "'predictor'"),
        ("clusterservingruntime.yaml", lambda d: d["spec"]["containers"][0].pop("name"), "'name'"),
        ("clusterservingruntime.yaml", lambda d: d["spec"]["supportedModelFormats"][0].update(priority=0), "0"),
        # A typo inside the embedded Kubernetes Container, validated by Kubernetes' own schema.
        ("clusterservingruntime.yaml", lambda d: d["spec"]["containers"][0].update(arg=[]), "'arg'"),
    ],
)
def test_a_broken_manifest_is_rejected(
    manifest_validator: Callable[[Manifest, str], None],
    kubernetes_version: str,
    name: str,
    break_it: Callable[[Manifest], object],
    message: str,
) -> None:
    document = copy.deepcopy(_load(name))
    break_it(document)
    with pytest.raises(jsonschema.ValidationError, match=message):
        manifest_validator(document, kubernetes_version)


def test_fixtures_name_their_source() -> None:
    for path in sorted(CRDS.glob("*.yaml")):
        header = path.read_text().split("apiVersion:", 1)[0]
        assert re.search(r"at commit [0-9a-f]{40}\b", header), path.name
        assert re.search(r"^#\s+\S+/\S+,", header, re.MULTILINE), f"{path.name}: no repository named"


def test_runtime_speaks_v2_for_onnx_and_pytorch() -> None:
    spec = _runtime()["spec"]
    assert set(spec["protocolVersions"]) == {"v2", "grpc-v2"}
    assert {f["name"] for f in spec["supportedModelFormats"]} == {"onnx", "pytorch"}
    assert not spec.get("multiModel", False)
    context = _container()["securityContext"]
    assert context["runAsNonRoot"] is True and context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    mounts = {m["mountPath"]: m["name"] for m in _container()["volumeMounts"]}
    assert "emptyDir" in next(v for v in spec["volumes"] if v["name"] == mounts["/tmp"])


@pytest.mark.parametrize("service", _inference_services(), ids=lambda s: s["metadata"]["name"])
def test_inference_service_picks_this_runtime(service: Manifest) -> None:
    runtime = _runtime()
    model = service["spec"]["predictor"]["model"]
    # autoSelect is off: KServe only matches a runtime that the InferenceService names.
    assert model["runtime"] == runtime["metadata"]["name"]
    formats = {f["name"]: f for f in runtime["spec"]["supportedModelFormats"]}
    assert model["modelFormat"]["name"] in formats
    version = model["modelFormat"].get("version")
    assert version is None or version == formats[model["modelFormat"]["name"]].get("version")
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
    assert model["storageUri"]
    if model["protocolVersion"] == "grpc-v2":
        # Knative routes the one port named h2c: it must be the one the server's gRPC listens on.
        (port,) = model["ports"]
        assert port["name"] == "h2c"
        assert port["containerPort"] == int(_serve_args(_container()).grpc_port)


def test_runtime_args_and_the_image_config_agree() -> None:
    container = _container()
    args = _serve_args(container)
    # The image holds deploy/docker/config.yaml at the path the args name.
    dockerfile = (ROOT / "deploy" / "docker" / "Dockerfile").read_text()
    assert f"COPY deploy/docker/config.yaml {args.config}" in dockerfile
    image_config = yaml.safe_load(IMAGE_CONFIG.read_text())["server"]
    assert image_config["host"] == "0.0.0.0"
    # KServe's storage initializer puts the model repository here.
    assert args.model_repository == Path("/mnt/models")
    http = int(args.http_port or image_config["http_port"])
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == http, probe
        assert container[probe]["timeoutSeconds"] >= 2, probe
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    annotations = _runtime()["spec"]["annotations"]
    metrics = int(args.metrics_port or image_config["metrics_port"])
    assert int(annotations["prometheus.kserve.io/port"]) == metrics


def test_a_server_started_as_the_runtime_answers_its_probes(example_repo: Path) -> None:
    container = _container()
    args = list(container["args"][1:])
    # The image's config file, the test's models; ServerProcess picks free loopback ports, so
    # the port flags (checked against the probes above) and the host go.
    args = [str(IMAGE_CONFIG) if a == "/config/config.yaml" else a for a in args]
    args = [str(example_repo) if a == "/mnt/models" else a for a in args]
    for flag in PORT_FLAGS:
        index = args.index(flag)
        del args[index : index + 2]
    env = {e["name"]: e["value"] for e in container["env"]}
    with ServerProcess(*args, "--host", "127.0.0.1", env=env) as server:
        for probe in ("readinessProbe", "livenessProbe"):
            status = httpx.get(server.url + container[probe]["httpGet"]["path"], timeout=2.0).status_code
            assert 200 <= status < 400, probe
        path = _runtime()["spec"]["annotations"]["prometheus.kserve.io/path"]
        scrape = httpx.get(f"http://127.0.0.1:{server.ports['metrics']}{path}", timeout=5.0)
        assert scrape.status_code == 200
        assert re.search(r'^tensorgate_model_ready\{model="mlp",version="1"\} 1\.0$', scrape.text, re.MULTILINE)
        assert httpx.get(server.url + "/v2/models/mlp/ready", timeout=2.0).status_code == 200
