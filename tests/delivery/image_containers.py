"""Containers of the image under test (``TENSORGATE_IMAGE``), driven through the Docker client
(``DOCKER``), both named by ``make image-test``.

Every container uses the host network: this machine allows no container network, so none is ever
created. Each binds loopback ports of its own, chosen here and passed as flags after the image's
own CMD (the image's config binds 0.0.0.0:8080-8082, which on the host network would be the
machine's). Each runs as the image makes it run (its user, its entrypoint) with a read-only root
file system and a tmpfs at /tmp, the one path the server writes.
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

DOCKER = os.environ.get("DOCKER", "docker")
IMAGE = os.environ.get("TENSORGATE_IMAGE", "")
START_TIMEOUT_S = 120.0  # an image's first start on a busy 2-core machine imports numpy, onnx, grpc
STOP_TIMEOUT_S = 40  # `docker stop`'s grace: past the image config's drain 5 s + exit timeout 30 s

_names = itertools.count()


def docker(*args: str, timeout_s: float = 120.0, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout_s, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


def image_cmd(image: str = IMAGE) -> list[str]:
    cmd: list[str] = json.loads(docker("image", "inspect", "-f", "{{json .Config.Cmd}}", image).stdout)
    return cmd


def free_ports(count: int) -> list[int]:
    """Loopback ports free at this instant (all held at once, so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


class ContainerExited(RuntimeError):
    pass


class Container:
    """``docker run -d`` of the image: its CMD plus ``serve_args``, on loopback ports of its own.

    ``mounts``: (host path, container path, read_only) bind mounts. ``start`` waits for
    ``/v2/health/ready`` with a deadline (never a fixed sleep); leaving the context removes the
    container and its anonymous volumes.
    """

    def __init__(
        self,
        *serve_args: str,
        mounts: Sequence[tuple[Path, str, bool]] = (),
        image: str = IMAGE,
        wait_ready: bool = True,
    ) -> None:
        self.serve_args = list(serve_args)
        self.mounts = list(mounts)
        self.image = image
        self.wait_for_ready = wait_ready
        self.name = f"tensorgate-test-{os.getpid()}-{next(_names)}"
        self.ports: dict[str, int] = {}
        self.started_at = 0.0

    @property
    def http_address(self) -> str:
        return f"127.0.0.1:{self.ports['http']}"

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.ports['grpc']}"

    @property
    def url(self) -> str:
        return f"http://{self.http_address}"

    def run_command(self) -> list[str]:
        mounts = []
        for source, target, read_only in self.mounts:
            mounts += ["--mount", f"type=bind,source={source},target={target}" + (",readonly" if read_only else "")]
        return [
            "run",
            "--detach",
            "--name",
            self.name,
            "--network",
            "host",
            "--read-only",
            "--tmpfs",
            "/tmp",
            "--stop-timeout",
            str(STOP_TIMEOUT_S),
            *mounts,
            self.image,
            *image_cmd(self.image),
            "--host",
            "127.0.0.1",
            "--http-port",
            str(self.ports["http"]),
            "--grpc-port",
            str(self.ports["grpc"]),
            "--metrics-port",
            str(self.ports["metrics"]),
            *self.serve_args,
        ]

    def start(self) -> Container:
        for attempt in range(3):  # a free port can be taken by another process before the server binds it
            self.ports = dict(zip(("http", "grpc", "metrics"), free_ports(3), strict=True))
            self.started_at = time.monotonic()
            docker(*self.run_command())
            try:
                if self.wait_for_ready:
                    self.wait_ready()
                return self
            except ContainerExited:
                if attempt == 2 or "address already in use" not in self.logs().lower():
                    raise
                self.remove()
        raise AssertionError("unreachable")

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = json.loads(docker("inspect", "-f", "{{json .State}}", self.name).stdout)
        return state

    def running(self) -> bool:
        return bool(self.state()["Running"])

    def _ready(self) -> bool:
        connection = http.client.HTTPConnection("127.0.0.1", self.ports["http"], timeout=2.0)
        try:
            connection.request("GET", "/v2/health/ready")
            return connection.getresponse().status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            connection.close()

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not self._ready():
            if not self.running():
                raise ContainerExited(f"{self.name} exited with {self.state()['ExitCode']}; logs:\n{self.logs()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} not ready within {timeout_s:.0f} s; logs:\n{self.logs()}")
            time.sleep(0.05)

    def logs(self, tail_chars: int | None = 20000) -> str:
        done = docker("logs", self.name, check=False)
        text = done.stdout + done.stderr
        return text if tail_chars is None else text[-tail_chars:]

    def log_records(self) -> list[dict[str, Any]]:
        records = []
        for line in self.logs(tail_chars=None).splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
        return records

    def inspect(self, template: str) -> str:
        return docker("inspect", "-f", template, self.name).stdout.strip()

    def exec(self, *command: str) -> subprocess.CompletedProcess[str]:
        return docker("exec", self.name, *command, check=False)

    def host_pid(self) -> int:
        """The container's PID 1 (tini) as this machine sees it."""
        return int(self.inspect("{{.State.Pid}}"))

    def wait_exited(self, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while self.running():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} still running after {timeout_s} s")
            time.sleep(0.02)
        return int(self.state()["ExitCode"])

    def remove(self) -> None:
        docker("rm", "--force", "--volumes", self.name, check=False)

    def __enter__(self) -> Container:
        try:
            return self.start()
        except BaseException:
            self.remove()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.remove()
