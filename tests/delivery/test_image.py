"""The container image (``TENSORGATE_IMAGE``, which ``make image`` builds) run as its users run it.

Each container runs as image_containers.py starts it: the image's entrypoint, user and CMD, with
a read-only root file system, a tmpfs at /tmp, and loopback ports on the host network.

- The image: tagged with pyproject.toml's version, which ``tensorgate --version`` in it and ``/v2``
  report too; under the size budget that docs/deployment.md states; no compiler, package lists,
  pip cache, tests or build leftovers in it.
- As it is: the bundled examples, served to tritonclient over HTTP and gRPC (the same answers as
  the examples run here by onnxruntime); every process of it runs as user 10001, and nothing but
  /tmp is writable; Docker reports it healthy through its own HEALTHCHECK.
- A model repository mounted read-only and a config file mounted (poll mode): a version copied
  into the mounted folder is loaded and served.
- ``docker stop`` under 8 clients: the server drains and exits 0 within the grace period, and no
  request fails (``test_docker_stop_drains_under_load`` says how requests are counted).
"""

from __future__ import annotations

import re
import threading
import time
import tomllib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import onnxruntime
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml
from image_containers import IMAGE, STOP_TIMEOUT_S, Container, docker
from model_builders import wait_until, write_python_model, write_version, write_versioned_model

from tensorgate.examples import EXAMPLE_MODELS
from tensorgate.examples.build import mlp_model

pytestmark = pytest.mark.timeout(300)  # containers start slowly on a busy 2-core machine

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE_CONFIG = yaml.safe_load((ROOT / "deploy" / "docker" / "config.yaml").read_text())["server"]
USER_ID = 10001


def size_budget_mb() -> int:
    """The budget docs/deployment.md states for the CPU image."""
    match = re.search(r"size budget is \*\*(\d+) MB\*\*", (ROOT / "docs" / "deployment.md").read_text())
    assert match is not None, "docs/deployment.md states no size budget for the image"
    return int(match.group(1))


@pytest.fixture(scope="module")
def as_is() -> Iterator[Container]:
    """The image with nothing mounted: it serves the examples built into it."""
    with Container() as container:
        yield container


# -- the image itself ------------------------------------------------------------------------------


def test_the_image_is_tagged_with_the_version_it_reports(as_is: Container) -> None:
    assert IMAGE.rpartition(":")[2] == VERSION
    printed = docker("run", "--rm", "--network", "host", IMAGE, "--version").stdout.strip()
    assert printed == f"tensorgate {VERSION}"
    assert httpx.get(f"{as_is.url}/v2", timeout=10).json()["version"] == VERSION


def test_size_and_contents() -> None:
    """No compiler, no package lists or caches, nothing of the build stage, no tests, within budget."""
    size_mb = int(docker("image", "inspect", "-f", "{{.Size}}", IMAGE).stdout) / 1e6
    print(f"image {IMAGE}: {size_mb:.0f} MB (budget {size_budget_mb()} MB)")
    assert size_mb <= size_budget_mb()
    survey = r"""
import json, os, shutil, sysconfig
from pathlib import Path
found = {}
found["compilers"] = [c for c in ("gcc", "cc", "c++", "x86_64-linux-gnu-gcc", "clang") if shutil.which(c)]
found["apt lists"] = [p.name for p in Path("/var/lib/apt/lists").glob("*") if p.name not in ("lock", "partial")]
found["apt archives"] = [p.name for p in Path("/var/cache/apt/archives").glob("*.deb")]
found["caches"] = [str(p) for p in (Path("/root/.cache"), Path("/home/tensorgate/.cache")) if p.exists()]
# /wheels stays as the empty mount point of the build's bind mount; nothing may be in it.
found["build leftovers"] = [p for p in ("/src", "/wheels", "/opt/build") if os.path.exists(p) and os.listdir(p)]
package = Path(sysconfig.get_path("purelib")) / "tensorgate"
tests = [p for p in package.rglob("*") if p.name in ("tests", "conftest.py") or p.name.startswith("test_")]
found["tests"] = [str(p) for p in tests]
found["wheels"] = [str(p) for p in Path("/").glob("*/*.whl")]
found["package"] = str(package) if package.is_dir() else ""
print(json.dumps(found))
"""
    done = docker("run", "--rm", "--network", "host", "--user", "0", "--entrypoint", "python", IMAGE, "-c", survey)
    found = yaml.safe_load(done.stdout)
    assert found.pop("package"), "tensorgate is not installed where expected"
    assert found == {key: [] for key in found}, found


# -- as it is --------------------------------------------------------------------------------------


def test_every_process_runs_as_the_non_root_user_on_a_read_only_root(as_is: Container) -> None:
    assert as_is.inspect("{{.HostConfig.ReadonlyRootfs}}") == "true"
    assert as_is.inspect("{{.Config.User}}").split(":")[0] == str(USER_ID)
    init = psutil.Process(as_is.host_pid())
    processes = [init, *init.children(recursive=True)]
    assert any("tensorgate" in " ".join(p.cmdline()) for p in processes[1:])
    assert {p.uids().real for p in processes} == {USER_ID}
    assert {p.uids().effective for p in processes} == {USER_ID}
    refused = as_is.exec("sh", "-c", "echo x > /home/tensorgate/probe")
    assert refused.returncode != 0 and "Read-only file system" in refused.stderr
    assert as_is.exec("sh", "-c", "echo x > /tmp/probe && rm /tmp/probe").returncode == 0


def test_serves_the_bundled_examples_over_http_and_grpc(as_is: Container) -> None:
    features = np.linspace(-1.0, 1.0, 32, dtype=np.float32).reshape(2, 16)
    expected = onnxruntime.InferenceSession(mlp_model().SerializeToString()).run(None, {"features": features})[0]

    http = httpclient.InferenceServerClient(as_is.http_address)
    try:
        assert http.is_server_ready()
        assert {name for name in EXAMPLE_MODELS if http.is_model_ready(name)} == EXAMPLE_MODELS
        x = httpclient.InferInput("features", list(features.shape), "FP32")
        x.set_data_from_numpy(features)
        over_http = http.infer("mlp", [x]).as_numpy("probabilities")
        pixels = np.random.default_rng(7).integers(0, 256, (1, 32, 32, 3), dtype=np.uint8)
        image = httpclient.InferInput("image", [1, 32, 32, 3], "UINT8")
        image.set_data_from_numpy(pixels)
        classes = http.infer("classify", [image]).as_numpy("classes")
    finally:
        http.close()
    grpc = grpcclient.InferenceServerClient(as_is.grpc_address)
    try:
        assert grpc.is_server_live() and grpc.is_server_ready()
        assert grpc.get_server_metadata().version == VERSION
        y = grpcclient.InferInput("features", list(features.shape), "FP32")
        y.set_data_from_numpy(features)
        over_grpc = grpc.infer("mlp", [y]).as_numpy("probabilities")
    finally:
        grpc.close()
    assert over_http is not None and over_grpc is not None and classes is not None
    np.testing.assert_allclose(over_http, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(over_grpc, over_http)
    assert classes.shape == (1, 3) and classes.dtype == np.int64


def test_docker_reports_it_healthy(as_is: Container) -> None:
    """The image's own HEALTHCHECK (every 10 s) passes: it found the port in the ports file."""
    wait_until(lambda: as_is.inspect("{{.State.Health.Status}}") == "healthy", timeout_s=60.0)
    assert as_is.inspect("{{(index .State.Health.Log 0).ExitCode}}") == "0"


# -- mounted repository and config -----------------------------------------------------------------


def test_mounted_repository_and_config_with_a_hot_reload(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    model_dir = write_versioned_model(repo, "m", [1])
    config = tmp_path / "config"
    config.mkdir()
    (config / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "server": {
                    "model_repository": "/models",
                    "model_control": "poll",
                    "repository_poll_s": 0.2,
                    "log_format": "json",
                    "ports_file": "/tmp/tensorgate-ports.json",
                }
            }
        )
    )
    mounts = [(repo, "/models", True), (config, "/config", True)]
    body = {"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 4], "data": [0, 0, 0, 0]}]}
    with Container(mounts=mounts) as container, httpx.Client(base_url=container.url, timeout=10) as client:
        mounted = container.inspect("{{range .Mounts}}{{.Destination}}={{.RW}} {{end}}").split()
        assert sorted(mounted) == ["/config=false", "/models=false"]
        assert client.post("/v2/models/m/infer", json=body).json()["outputs"][0]["data"] == [1.0] * 4
        staging = tmp_path / "staging"
        staging.mkdir()
        write_version(model_dir, 2, staging=staging)  # moved into the mounted folder in one rename

        def serves_version_2() -> bool:
            answer = client.post("/v2/models/m/infer", json=body)
            return answer.status_code == 200 and answer.json()["outputs"][0]["data"] == [2.0] * 4

        wait_until(serves_version_2, timeout_s=60.0)
        assert client.get("/v2/models/m/versions/2/ready").status_code == 200
        messages = [str(r.get("message", "")) for r in container.log_records()]
        assert any(m.startswith("model m version 2 ") and m.endswith("is READY") for m in messages), messages[-20:]


# -- docker stop -----------------------------------------------------------------------------------

CLIENTS = 8
WIDTH = 4
DELAY_MS = 50  # per batch: every client has a request in flight most of the time


@dataclass(frozen=True)
class Call:
    started: float
    ended: float
    outcome: str  # "ok", "refused" (connection refused: nothing sent), or what went wrong
    detail: str = ""


class Clients:
    """``CLIENTS`` threads in a closed loop of inference requests, each on its own keep-alive
    connection, every call recorded. A client stops at its first refused connection (the server has
    closed its listener), at ``stop()``, or after ``max_s`` or ``max_calls``."""

    def __init__(self, url: str, max_s: float = 120.0, max_calls: int = 20000) -> None:
        self.url = url
        self.max_s = max_s
        self.max_calls = max_calls
        self.calls: list[Call] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(CLIENTS)]

    def __enter__(self) -> Clients:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.join(30.0)

    def join(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self._threads), "a client did not stop"

    def snapshot(self) -> list[Call]:
        with self._lock:
            return list(self.calls)

    def _run(self, client: int) -> None:
        deadline = time.monotonic() + self.max_s
        with httpx.Client(base_url=self.url, timeout=30.0) as http:
            for seq in range(self.max_calls):
                if self._stop.is_set() or time.monotonic() > deadline:
                    return
                values = [float(client * 100000 + seq + i) for i in range(WIDTH)]
                body = {"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, WIDTH], "data": values}]}
                started = time.monotonic()
                try:
                    response = http.post("/v2/models/delay/infer", json=body)
                except httpx.ConnectError as exc:
                    outcome, detail = "refused", str(exc)
                except httpx.HTTPError as exc:
                    outcome, detail = type(exc).__name__, str(exc)
                else:
                    if response.status_code != 200:
                        outcome, detail = str(response.status_code), response.text[:200]
                    elif response.json()["outputs"][0]["data"] != [v + 1 for v in values]:
                        outcome, detail = "wrong answer", response.text[:200]
                    else:
                        outcome, detail = "ok", ""
                with self._lock:
                    self.calls.append(Call(started, time.monotonic(), outcome, detail))
                if outcome == "refused":
                    return


def test_docker_stop_drains_under_load(tmp_path: Path) -> None:
    """``docker stop`` with 8 clients sending: tini hands SIGTERM to the server, which turns not
    ready at once, serves on through its drain delay (answering ``Connection: close``, so each
    client reconnects), closes its listeners, finishes what is in flight and exits 0, before the
    grace period would have Docker kill it.

    How requests are counted: every request a client sent must be answered 200 with its own
    answer; the requests in flight when the stop began are among them. Once the listener has
    closed, a client's next connection is refused: that request never left the client, so it is
    counted apart ("refused", as a load balancer would take it elsewhere) and ends that client.
    Anything else (an error status, a reset or closed connection after the request was written,
    a timeout) is a failed request, and there must be none.
    """
    drain_s, exit_s = float(IMAGE_CONFIG["drain_delay_s"]), float(IMAGE_CONFIG["exit_timeout_s"])
    assert drain_s + exit_s < STOP_TIMEOUT_S, "the grace period must cover the drain and the exit timeout"
    repo = tmp_path / "models"
    write_python_model(
        repo,
        "delay",
        width=WIDTH,
        max_batch_size=8,
        parameters={"delay_ms": DELAY_MS},
        dynamic_batching={"max_queue_delay_ms": 1.0},
    )
    with Container(mounts=[(repo, "/models", True)]) as container:
        with Clients(container.url) as clients:
            wait_until(lambda: sum(c.outcome == "ok" for c in clients.snapshot()) >= 100, timeout_s=60.0)
            stop_at = time.monotonic()
            stopping = threading.Thread(target=docker, args=("stop", container.name), daemon=True)
            stopping.start()
            # Not ready at once, and still serving: the clients' requests go on being answered.
            wait_until(lambda: httpx.get(f"{container.url}/v2/health/ready", timeout=5).status_code == 400, 10.0)
            unready_at = time.monotonic()
            stopping.join(STOP_TIMEOUT_S + 15.0)
            stopped_at = time.monotonic()
            assert not stopping.is_alive(), "docker stop did not return"
            clients.join(30.0)
        calls = clients.snapshot()
        exit_code = int(container.state()["ExitCode"])
        messages = [str(r.get("message", "")) for r in container.log_records()]
    outcomes = Counter(c.outcome for c in calls)
    in_flight = [c for c in calls if c.started < stop_at < c.ended]
    during_drain = [c for c in calls if c.started > unready_at and c.outcome == "ok"]
    failed = [c for c in calls if c.outcome not in ("ok", "refused")]
    summary = (
        f"{len(calls)} requests {dict(outcomes)}; {len(in_flight)} in flight at the stop, "
        f"{len(during_drain)} answered after readiness turned false; stopped in {stopped_at - stop_at:.1f} s, "
        f"exit {exit_code}"
        + "".join(
            f"\n  failed: {c.outcome} {c.detail}, sent {c.started - stop_at:.3f} s after the stop, "
            f"failed {c.ended - stop_at:.3f} s after"
            for c in failed[:8]
        )
    )
    print(f"docker stop under {CLIENTS} clients: {summary}")
    assert failed == [], summary
    assert exit_code == 0, summary
    assert any("shutdown requested" in m for m in messages), "the server never saw SIGTERM (tini forwards it)"
    assert any("server stopped" in m for m in messages)
    assert drain_s <= stopped_at - stop_at < STOP_TIMEOUT_S, summary
    assert in_flight and all(c.outcome == "ok" for c in in_flight), summary
    assert during_drain, summary
    assert outcomes["refused"] <= CLIENTS, summary  # one each at most: a refusal ends its client
