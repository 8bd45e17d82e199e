"""The Kubernetes manifests (deploy/kubernetes), rendered by the real kustomize and checked three ways.

- Every object of the base and of each overlay, as ``kubectl kustomize`` renders it, validates
  against the Kubernetes API schemas (kubernetes-validate, strict) and, for the ServiceMonitor, the
  Prometheus operator's CRD schema (fixtures/crds).
- The manifest rules for a replica behind Kubernetes: probes on /v2/health/ready and
  /v2/health/live with timeoutSeconds >= 2, a startup budget, preStop sleep >= 5,
  terminationGracePeriodSeconds >= preStop + drain_delay + exit_timeout + 5, maxUnavailable 0, a
  PodDisruptionBudget, non-root, a read-only root filesystem and a read-only model volume; and the
  contracts between files: the ConfigMap's config.yaml is a valid tensorgate server config whose
  ports are the container's and the Service's, the args parse as ``tensorgate serve`` flags, the
  HPA's metric is the one the Prometheus adapter serves and the server exports.
- A real ``tensorgate serve`` run as the pod runs it: the init container's own command writes the
  models, the server reads the rendered ConfigMap with the Deployment's args and environment,
  under a read-only root filesystem with only a /tmp stand-in writable (a private mount
  namespace), and answers the probes as the kubelet expects, through startup, serving and the
  SIGTERM drain.

kubectl is installed before the suite by ``tests/system_packages.sh`` (Google's ``kubectl`` package
where the machine's lists have it; Debian's ``kubernetes-client`` otherwise, whose kustomize may be
too old: then the test says so and fails).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from model_builders import metric, v2_body, wait_until, write_python_model

from tensorgate.cli import serve
from tensorgate.config.loading import validate
from tensorgate.config.server_config import ServerConfig
from tensorgate.testing import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
TARGETS = ("base", "overlays/gpu", "overlays/ascend", "overlays/pvc")
KUSTOMIZE_TIMEOUT_S = 60.0
FEATURES = [[float(i) for i in range(16)]]

Manifest = dict[str, Any]


# ---- rendering ----


def _kubectl() -> str:
    from system_tools import system_tool

    found = system_tool("kubectl")
    version = subprocess.run(
        [found, "version", "--client", "-o", "json"], capture_output=True, text=True, timeout=30, check=True
    )
    kustomize = json.loads(version.stdout).get("kustomizeVersion", "v0")
    if int(kustomize.lstrip("v").split(".")[0]) < 4:
        pytest.fail(f"{found} embeds kustomize {kustomize}; the manifests need kustomize 4 or newer")
    return found


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Manifest]]:
    kubectl = _kubectl()
    out = {}
    for target in TARGETS:
        done = subprocess.run(
            [kubectl, "kustomize", str(KUBERNETES / target)],
            capture_output=True,
            text=True,
            timeout=KUSTOMIZE_TIMEOUT_S,
            check=False,
        )
        assert done.returncode == 0, f"kubectl kustomize {target}:\n{done.stderr}"
        assert "Warning" not in done.stderr, f"kustomize warns about {target}:\n{done.stderr}"
        out[target] = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    return out


def _only(docs: list[Manifest], kind: str) -> Manifest:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def _pod(docs: list[Manifest]) -> Manifest:
    spec: Manifest = _only(docs, "Deployment")["spec"]["template"]["spec"]
    return spec


def _server(docs: list[Manifest]) -> Manifest:
    containers = _pod(docs)["containers"]
    assert [c["name"] for c in containers] == ["tensorgate"]
    server: Manifest = containers[0]
    return server


def _serve_args(container: Manifest) -> argparse.Namespace:
    """The container's args parsed by the real ``tensorgate serve`` parser (unknown flags fail)."""
    args = container["args"]
    assert args[0] == "serve", "the image's entrypoint is `tensorgate`; args start with the command"
    parser = argparse.ArgumentParser(prog="tensorgate serve", exit_on_error=False)
    serve.add_arguments(parser)
    return parser.parse_args(args[1:])


def _config_text(docs: list[Manifest]) -> str:
    """config.yaml as the server reads it: the ConfigMap behind the volume that holds --config."""
    pod, server = _pod(docs), _server(docs)
    path = Path(_serve_args(server).config)
    mount = next(m for m in server["volumeMounts"] if path.parent == Path(m["mountPath"]))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    name = volume["configMap"]["name"]
    configmap = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name)
    text: str = configmap["data"][path.name]
    return text


def _config(docs: list[Manifest]) -> ServerConfig:
    return validate(ServerConfig, yaml.safe_load(_config_text(docs)), "the ConfigMap's config.yaml")


def _container_port(container: Manifest, name: str | int) -> int:
    if isinstance(name, int):
        return name
    port: int = next(p["containerPort"] for p in container["ports"] if p["name"] == name)
    return port


def _matches(selector: Manifest, labels: dict[str, str]) -> bool:
    assert set(selector) == {"matchLabels"}, "only matchLabels selectors are checked here"
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def _drain_and_exit(docs: list[Manifest]) -> tuple[float, float]:
    """drain_delay_s and exit_timeout_s as the server runs them: a flag wins over the file."""
    config, args = _config(docs).server, _serve_args(_server(docs))
    drain = args.drain_delay if args.drain_delay is not None else config.drain_delay_s
    exit_timeout = args.exit_timeout if args.exit_timeout is not None else config.exit_timeout_s
    return drain, exit_timeout


# ---- schemas ----


@pytest.mark.parametrize("target", TARGETS)
def test_every_rendered_object_validates(
    rendered: dict[str, list[Manifest]],
    manifest_validator: Callable[[Manifest, str], None],
    kubernetes_version: str,
    target: str,
) -> None:
    kinds = sorted(d["kind"] for d in rendered[target])
    assert kinds == sorted(
        ["ConfigMap", "Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Service", "ServiceMonitor"]
    )
    for document in rendered[target]:
        manifest_validator(document, kubernetes_version)


def test_a_broken_manifest_is_rejected(
    rendered: dict[str, list[Manifest]], manifest_validator: Callable[[Manifest, str], None], kubernetes_version: str
) -> None:
    """The validation above can fail: a misspelt probe field and a misspelt ServiceMonitor field."""
    import jsonschema

    deployment = json.loads(json.dumps(_only(rendered["base"], "Deployment")))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["timeoutSecond"] = 2
    with pytest.raises(jsonschema.ValidationError, match="timeoutSecond"):
        manifest_validator(deployment, kubernetes_version)
    monitor = json.loads(json.dumps(_only(rendered["base"], "ServiceMonitor")))
    monitor["spec"]["endpoints"][0]["interval"] = "15 seconds"
    with pytest.raises(jsonschema.ValidationError, match="15 seconds"):
        manifest_validator(monitor, kubernetes_version)


# ---- probes, drain and resources ----


@pytest.mark.parametrize("target", TARGETS)
def test_probes(rendered: dict[str, list[Manifest]], target: str) -> None:
    server = _server(rendered[target])
    http_port = _config(rendered[target]).server.http_port
    expected = {
        "readinessProbe": "/v2/health/ready",
        "livenessProbe": "/v2/health/live",  # the process works: never model state or load
        "startupProbe": "/v2/health/ready",  # holds liveness off through loading and warm-up
    }
    for probe, path in expected.items():
        get = server[probe]["httpGet"]
        assert get["path"] == path, probe
        assert _container_port(server, get["port"]) == http_port, probe
        assert get.get("scheme", "HTTP") == "HTTP", probe
        assert server[probe]["timeoutSeconds"] >= 2, probe
    assert server["readinessProbe"]["failureThreshold"] >= 1
    assert server["livenessProbe"]["failureThreshold"] >= 3, "one slow answer must not restart a pod"


@pytest.mark.parametrize("target", TARGETS)
def test_termination_budget(rendered: dict[str, list[Manifest]], target: str) -> None:
    pod, server = _pod(rendered[target]), _server(rendered[target])
    pre_stop = server["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain, exit_timeout = _drain_and_exit(rendered[target])
    assert pre_stop >= 5
    assert drain > 0, "the server must keep serving while endpoint updates propagate"
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + drain + exit_timeout + 5


@pytest.mark.parametrize("target", TARGETS)
def test_rollout_and_disruption_budget(rendered: dict[str, list[Manifest]], target: str) -> None:
    docs = rendered[target]
    deployment = _only(docs, "Deployment")
    strategy = deployment["spec"]["strategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"]["maxUnavailable"] == 0
    assert strategy["rollingUpdate"]["maxSurge"] >= 1
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert _matches(deployment["spec"]["selector"], labels)
    budget = _only(docs, "PodDisruptionBudget")
    assert _matches(budget["spec"]["selector"], labels)
    autoscaler = _only(docs, "HorizontalPodAutoscaler")
    # A drain may take maxUnavailable pods; at least one must stay.
    assert autoscaler["spec"]["minReplicas"] > budget["spec"]["maxUnavailable"]
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count"


@pytest.mark.parametrize("target", TARGETS)
def test_s17_least_privilege(rendered: dict[str, list[Manifest]], target: str) -> None:
    pod = _pod(rendered[target])
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True, container["name"]
        assert context["allowPrivilegeEscalation"] is False, container["name"]
        assert context["runAsNonRoot"] is True, container["name"]
        assert context["capabilities"]["drop"] == ["ALL"], container["name"]
        assert "privileged" not in context or context["privileged"] is False


@pytest.mark.parametrize("target", TARGETS)
def test_volumes(rendered: dict[str, list[Manifest]], target: str) -> None:
    pod, server = _pod(rendered[target]), _server(rendered[target])
    mounts = {m["mountPath"]: m for m in server["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    repository = str(_config(rendered[target]).server.model_repository)
    assert mounts[repository]["readOnly"] is True, "the model volume is mounted read-only"
    claim = volumes[mounts[repository]["name"]].get("persistentVolumeClaim")
    if claim is not None:
        assert claim["readOnly"] is True
    assert mounts[str(Path(_serve_args(server).config).parent)]["readOnly"] is True
    # The root filesystem is read-only: /tmp is the one writable place (the server's temporary
    # files and caches; worker processes share tensors through memfd, which needs none).
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]
    assert not mounts["/tmp"].get("readOnly", False)


@pytest.mark.parametrize("target", TARGETS)
def test_config_ports_and_service(rendered: dict[str, list[Manifest]], target: str) -> None:
    docs = rendered[target]
    config = _config(docs).server
    server = _server(docs)
    assert config.host == "0.0.0.0", "inside a pod the server must listen beyond its own loopback"
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert ports == {"http": config.http_port, "grpc": config.grpc_port, "metrics": config.metrics_port}
    service = _only(docs, "Service")
    assert _matches(
        {"matchLabels": service["spec"]["selector"]},
        _only(docs, "Deployment")["spec"]["template"]["metadata"]["labels"],
    )
    by_name = {p["name"]: p for p in service["spec"]["ports"]}
    assert set(by_name) == set(ports)
    for name, port in by_name.items():
        assert _container_port(server, port["targetPort"]) == ports[name]
    assert by_name["grpc"]["appProtocol"] == "grpc"


@pytest.mark.parametrize("target", TARGETS)
def test_args_are_tensorgate_serve_flags(rendered: dict[str, list[Manifest]], target: str) -> None:
    server = _server(rendered[target])
    args = _serve_args(server)
    # $(POD_NAME) is expanded by the kubelet from the container's env.
    assert args.replica_id == "$(POD_NAME)"
    env = {e["name"]: e for e in server["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    # A Deployment's pod name (63 characters at most, lowercase, digits and '-') is a valid id.
    document = yaml.safe_load(_config_text(rendered[target]))
    document["server"]["replica_id"] = "tensorgate-7d9c8b6f5d-x2k4q"
    validate(ServerConfig, document, "config.yaml with the pod's name as its replica id")


def test_autoscaling_metric_is_the_servers(rendered: dict[str, list[Manifest]]) -> None:
    docs = rendered["base"]
    autoscaler = _only(docs, "HorizontalPodAutoscaler")["spec"]
    deployment = _only(docs, "Deployment")
    target = autoscaler["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    metrics = {m["type"]: m for m in autoscaler["metrics"]}
    assert set(metrics) == {"Pods", "Resource"}
    name = metrics["Pods"]["pods"]["metric"]["name"]
    assert name == "tensorgate_queue_depth"
    assert metrics["Pods"]["pods"]["target"]["type"] == "AverageValue"
    assert metrics["Resource"]["resource"]["name"] == "cpu", "CPU is the fallback"
    assert "cpu" in _server(docs)["resources"]["requests"], "CPU utilisation is relative to the request"
    # The Prometheus adapter serves the metric under the name the HPA asks for, per pod.
    adapter = yaml.safe_load((KUBERNETES / "prometheus-adapter" / "values.yaml").read_text())
    (rule,) = adapter["rules"]["custom"]
    assert rule["seriesQuery"].startswith(name + "{")
    assert re.fullmatch(rule["name"]["matches"], name)
    assert rule["name"]["as"] == name
    assert rule["resources"]["overrides"]["pod"]["resource"] == "pod"


def test_service_monitor_scrapes_the_metrics_port(rendered: dict[str, list[Manifest]]) -> None:
    docs = rendered["base"]
    monitor, service = _only(docs, "ServiceMonitor"), _only(docs, "Service")
    assert _matches(monitor["spec"]["selector"], service["metadata"]["labels"])
    (endpoint,) = monitor["spec"]["endpoints"]
    port = next(p for p in service["spec"]["ports"] if p["name"] == endpoint["port"])
    assert _container_port(_server(docs), port["targetPort"]) == _config(docs).server.metrics_port
    assert endpoint["path"] == "/metrics"


def test_device_overlays(rendered: dict[str, list[Manifest]]) -> None:
    def limits(target: str) -> dict[str, Any]:
        found: dict[str, Any] = _server(rendered[target])["resources"]["limits"]
        return found

    assert not {"nvidia.com/gpu", "huawei.com/Ascend310"} & set(limits("base"))
    assert limits("overlays/gpu")["nvidia.com/gpu"] == 1
    assert limits("overlays/ascend")["huawei.com/Ascend310"] == 1
    for target in ("overlays/gpu", "overlays/ascend"):
        assert {k: v for k, v in limits(target).items() if "/" not in k} == limits("base"), target
    # Each device runs the image built for it (deploy/docker/Dockerfile's VARIANT), of this version.
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert _server(rendered["base"])["image"] == f"tensorgate:{version}"
    assert _server(rendered["overlays/gpu"])["image"] == f"tensorgate:{version}-gpu"
    assert _server(rendered["overlays/ascend"])["image"] == f"tensorgate:{version}-cann"
    dockerfile = (ROOT / "deploy" / "docker" / "Dockerfile").read_text()
    for variant in ("gpu", "cann"):
        assert f"      {variant}) runtime=" in dockerfile


def test_pvc_overlay_serves_your_repository(rendered: dict[str, list[Manifest]]) -> None:
    pod = _pod(rendered["overlays/pvc"])
    models = next(v for v in pod["volumes"] if v["name"] == "models")
    assert models == {"name": "models", "persistentVolumeClaim": {"claimName": "tensorgate-models", "readOnly": True}}
    assert not pod.get("initContainers"), "the example models are the base's only"


# ---- the pod, run for real ----

# Everything but the given directories read-only, in a private mount namespace: the pod's
# read-only root filesystem with its /tmp volume. `remount,bind,ro` changes this namespace's view
# of each mount only, never the host's. The ports file's folder (ServerProcess's) stays writable
# too: the test's own channel, not the pod's.
READ_ONLY_ROOT = r"""
set -eu
writable=$1
shift
ports_dir=$writable
previous=
for arg in "$@"; do
  if [ "$previous" = --ports-file ]; then ports_dir=$(dirname "$arg"); fi
  previous=$arg
done
mount --bind "$writable" "$writable"
[ "$ports_dir" = "$writable" ] || mount --bind "$ports_dir" "$ports_dir"
awk '{print $5}' /proc/self/mountinfo | while read -r point; do
  case $point in
    /proc | /proc/* | /sys | /sys/* | /dev | /dev/*) continue ;;
  esac
  if [ "$point" = "$writable" ] || [ "$point" = "$ports_dir" ]; then continue; fi
  mount -o remount,bind,ro "$point"
done
if touch /.tensorgate-read-only-probe 2>/dev/null; then echo "the root is still writable" >&2; exit 97; fi
exec "$@"
"""


def _read_only_root(writable: Path) -> list[str]:
    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        pytest.skip("a read-only root needs unshare(1) and root (a private mount namespace)")
    probe = subprocess.run([unshare, "--mount", "--propagation", "private", "true"], capture_output=True, timeout=10)
    if probe.returncode != 0:
        pytest.skip(f"mount namespaces are not available here: {probe.stderr.decode(errors='replace')}")
    return [unshare, "--mount", "--propagation", "private", "sh", "-c", READ_ONLY_ROOT, "sh", str(writable)]


def _pod_env(container: Manifest, tmp: Path) -> dict[str, str]:
    """The test's environment with the container's literal env over it, its /tmp being ``tmp``
    (TMPDIR says where that is)."""
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env = {k: str(tmp) + v[len("/tmp") :] if v == "/tmp" or v.startswith("/tmp/") else v for k, v in env.items()}
    return {**os.environ, **env, "TMPDIR": str(tmp)}


@pytest.fixture
def pod(rendered: dict[str, list[Manifest]], tmp_path: Path) -> Iterator[tuple[ServerProcess, float]]:
    docs = rendered["base"]
    pod_spec, server = _pod(docs), _server(docs)
    tmp = tmp_path / "tmp"  # the pod's /tmp volume
    tmp.mkdir()
    models = tmp_path / "models"
    models.mkdir()
    # The init container's own command, its last argument (the models volume) replaced, under a
    # read-only root with only that volume writable: the init container mounts nothing else.
    (init,) = pod_spec["initContainers"]
    command = init["command"]
    assert command[0] == "python" and command[-1] == "/models"
    assert [m["mountPath"] for m in init["volumeMounts"]] == ["/models"]
    subprocess.run(
        [*_read_only_root(models), sys.executable, *command[1:-1], str(models)],
        check=True,
        timeout=120,
        env={**_pod_env(init, models), "TMPDIR": "/nonexistent"},
    )
    # A worker-process model beside the examples: tensors cross to it through memfd.
    write_python_model(models, "worker", instance_group=[{"count": 1, "kind": "cpu", "isolation": "process"}])
    config = tmp_path / "config" / "config.yaml"
    config.parent.mkdir()
    config.write_text(_config_text(docs))
    args = [a.replace("$(POD_NAME)", "tensorgate-test-0") for a in server["args"][1:]]
    args = [str(config) if a == "/config/config.yaml" else a for a in args]
    # Flags over the file: the models folder, and loopback for the test (ServerProcess picks ports).
    args += ["--model-repository", str(models), "--host", "127.0.0.1"]
    process = ServerProcess(*args, env=_pod_env(server, tmp), wrapper=_read_only_root(tmp), ready_timeout_s=60)
    started = time.monotonic()
    with process:
        yield process, time.monotonic() - started


def _status(url: str) -> int:
    try:
        return httpx.get(url, timeout=2.0).status_code
    except httpx.TransportError:
        return 0  # refused or reset: a failed probe


def test_the_pod_starts_serves_and_drains(
    pod: tuple[ServerProcess, float], rendered: dict[str, list[Manifest]]
) -> None:
    """Startup within the budget, the probes as the kubelet reads them, serving under the read-only
    root, then SIGTERM (sent after preStop): readiness fails at once, liveness holds through the
    drain, and the process exits 0 before what is left of the grace period would kill it."""
    server, load_s = pod
    docs = rendered["base"]
    container = _server(docs)
    startup = container["startupProbe"]
    # The startup budget covers twice the load and warm-up measured here.
    assert startup["failureThreshold"] * startup["periodSeconds"] >= 2 * load_s
    ready = server.url + container["readinessProbe"]["httpGet"]["path"]
    live = server.url + container["livenessProbe"]["httpGet"]["path"]
    # Kubernetes counts 200-399 as success.
    assert 200 <= _status(ready) < 400
    assert 200 <= _status(live) < 400

    # Serving under the read-only root: a thread-instance model and a worker-process model.
    with httpx.Client(base_url=server.url, timeout=10.0) as client:
        body = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16], "data": FEATURES}]}
        assert client.post("/v2/models/mlp/infer", json=body).status_code == 200
        answer = client.post("/v2/models/worker/infer", json=v2_body([[1.0, 2.0, 3.0, 4.0]]))
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["data"] == [2.0, 3.0, 4.0, 5.0]
    # The series the ServiceMonitor scrapes and the Prometheus adapter turns into the HPA's metric.
    endpoint = _only(docs, "ServiceMonitor")["spec"]["endpoints"][0]
    scrape = httpx.get(f"http://127.0.0.1:{server.ports['metrics']}{endpoint['path']}", timeout=5.0)
    assert scrape.status_code == 200
    assert re.search(r"^tensorgate_queue_depth\{", scrape.text, re.MULTILINE)
    assert metric(server.metrics_url, "tensorgate_server_info", replica="tensorgate-test-0") == 1

    drain, _ = _drain_and_exit(docs)
    budget = _pod(docs)["terminationGracePeriodSeconds"] - container["lifecycle"]["preStop"]["sleep"]["seconds"]
    signalled = time.monotonic()
    server.signal(signal.SIGTERM)
    wait_until(lambda: not 200 <= _status(ready) < 400, timeout_s=2.0)
    assert time.monotonic() - signalled < min(drain, 2.0), "readiness must fail before the drain ends"
    assert _status(live) == 200, "a draining server is alive: liveness must not restart it"
    assert server.process is not None
    assert server.process.wait(timeout=budget) == 0
    assert time.monotonic() - signalled < budget
    assert not [r for r in server.log_records() if r.get("level") == "error"]
