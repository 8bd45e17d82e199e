"""The shipped nginx file in front of three containers of the image (``TENSORGATE_IMAGE``).

tests/deploy/test_nginx.py runs deploy/nginx/tensorgate.conf in front of three ``tensorgate serve``
processes; here the replicas are containers of the image, on the host network with three port
sets, and everything else is that test's own: the file rendered with only addresses, ports and
log paths replaced, Debian's nginx, the 16-client closed-loop load and the access-log bookkeeping.
The model (a Python model with a known delay) comes from a repository mounted read-only into all
three; each container's model marks a running batch in a folder of its own, mounted writable.

- ``docker kill`` of one container while a batch runs on it: zero non-2xx over HTTP, the requests
  it held sent on by nginx to the other two. One thing nginx cannot send on: an answer the killed
  replica had begun to write. uvicorn writes a response's head and its body in two writes, and
  nginx passes the head to the client as soon as it has it; a kill between the two leaves the
  client a 200 head without its body. Such a request (at most one per client, each on the victim
  when it was killed) is counted apart, as test_nginx.py counts the gRPC calls a kill loses; any
  other failure fails the test.
- ``docker stop`` of one container (its drain): zero failures over HTTP and gRPC.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from image_containers import Container, docker
from model_builders import wait_until, write_python_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "deploy"))
from test_nginx import (
    CLIENTS,
    DELAY_MS,
    MODEL,
    REPLICAS,
    WIDTH,
    Entry,
    FaultRun,
    Load,
    Nginx,
    fail_timeout_s,
    nginx_binary,
)

__all__ = ["nginx_binary"]  # the fixture, taken from test_nginx

pytestmark = pytest.mark.timeout(300)  # containers start slowly on a busy 2-core machine

DRAIN_S = 1.0


@dataclass
class ContainerFleet:
    """Three containers and their nginx; what test_nginx's FaultRun reads of a fleet."""

    replicas: list[Container]
    nginx: Nginx
    running: list[Path]  # each container's folder where its model marks a running batch

    def index(self, address: str) -> int:
        for i, replica in enumerate(self.replicas):
            if address in (replica.http_address, replica.grpc_address):
                return i
        raise KeyError(address)

    def served_by(self, entries: list[Entry]) -> Counter[int]:
        return Counter(self.index(e.served_by) for e in entries if e.served_by)

    def batch_running(self, i: int) -> bool:
        return any(self.running[i].iterdir())


@pytest.fixture()
def fleet(tmp_path: Path, nginx_binary: str) -> Iterator[ContainerFleet]:
    repo = tmp_path / "models"
    write_python_model(
        repo,
        MODEL,
        width=WIDTH,
        max_batch_size=8,
        parameters={"delay_ms": DELAY_MS, "running_dir": "/running"},
        dynamic_batching={"max_queue_delay_ms": 1.0},
    )
    running = [tmp_path / f"running-{i}" for i in range(REPLICAS)]
    for folder in running:
        folder.mkdir()
        folder.chmod(0o777)  # the image's user writes its marks there
    replicas = [
        Container(
            "--replica-id",
            f"r{i}",
            "--drain-delay",
            str(DRAIN_S),
            "--grpc-refuse-when-unready",
            "--log-level",
            "warning",
            mounts=[(repo, "/models", True), (running[i], "/running", False)],
        )
        for i in range(REPLICAS)
    ]
    try:
        with ThreadPoolExecutor(REPLICAS) as pool:
            list(pool.map(Container.__enter__, replicas))
        (tmp_path / "nginx").mkdir()
        nginx = Nginx(nginx_binary, tmp_path / "nginx", replicas, lambda text: text).start()  # type: ignore[arg-type]
    except BaseException:
        for replica in replicas:
            replica.remove()
        raise
    yield ContainerFleet(replicas, nginx, running)
    nginx.stop()
    for replica in replicas:
        replica.remove()


def docker_kill(container: Container) -> None:
    docker("kill", container.name)


def docker_stop(container: Container) -> None:
    docker("stop", "--time", "30", container.name, timeout_s=60.0)


def run_fault(fleet: ContainerFleet, protocol: str, fault: Callable[[Container], None], victim: int = 1) -> FaultRun:
    """test_nginx's run_fault, with a container as the victim: steady load; once every replica has
    answered, the fault hits ``victim`` while a batch runs on it; the load goes on until nginx has
    skipped the victim and tried it again (fail_timeout)."""
    target = fleet.nginx.url if protocol == "http" else fleet.nginx.grpc_address
    container = fleet.replicas[victim]
    with Load(protocol, target) as load:
        wait_until(lambda: load.ok_count() >= 50 and len(fleet.served_by(fleet.nginx.entries())) == REPLICAS, 60.0)
        wait_until(lambda: fleet.batch_running(victim), 10.0)
        fault_at = time.monotonic()
        fault(container)
        exit_code = container.wait_exited(DRAIN_S + 40.0)
        dead_at = time.monotonic()
        wait_until(lambda: time.monotonic() > fault_at + DRAIN_S + fail_timeout_s() + 0.5, 30.0)
    return FaultRun(load.snapshot(), fleet.nginx.entries(), fault_at, dead_at, victim, exit_code)


def test_docker_kill_one_container_under_load(fleet: ContainerFleet) -> None:
    """A container killed (SIGKILL to every process in it) while a batch runs on it."""
    run = run_fault(fleet, "http", docker_kill)
    summary = run.summary(fleet)  # type: ignore[arg-type]
    print(f"docker kill, http: {summary}")
    assert run.exit_code == 137, summary  # killed by SIGKILL
    by_rid = {e.rid: e for e in run.entries}
    victim = fleet.replicas[run.victim].http_address
    cut = [c for c in run.failures() if c.outcome == "RemoteProtocolError" and "complete message body" in c.detail]
    assert [c for c in run.failures() if c not in cut] == [], summary
    assert {c.rid for c in cut} <= run.in_flight_on_victim(fleet), summary  # type: ignore[arg-type]
    assert all(by_rid[c.rid].status == 200 and by_rid[c.rid].tried == (victim,) for c in cut), summary
    assert len(cut) <= CLIENTS, summary
    assert any(e.tried[0] == victim and len(e.tried) > 1 and e.status == 200 for e in run.entries), summary
    assert sum(c.ok for c in run.calls) >= 100, summary
    assert len(run.calls) >= CLIENTS


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_docker_stop_one_container_under_load(fleet: ContainerFleet, protocol: str) -> None:
    """A container stopped: its server drains (ready false, serving on) and exits 0."""
    run = run_fault(fleet, protocol, docker_stop)
    summary = run.summary(fleet)  # type: ignore[arg-type]
    print(f"docker stop, {protocol}: {summary}")
    assert run.exit_code == 0, summary
    assert run.failures() == [], summary
    assert sum(c.ok for c in run.calls) >= 100, summary
