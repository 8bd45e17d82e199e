"""Client-side testing helpers: run a real ``tensorgate serve`` process and wait for readiness.

Used by the project's own end-to-end tests and benchmarks, and public so users can test their
model repositories the same way.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any


class ServerProcess:
    """``tensorgate serve`` on free loopback ports, as a context manager.

    Extra arguments are passed through; ports come back through ``--ports-file`` so tests never
    guess a free port. ``start`` waits for ``/v2/health/ready`` with a deadline, never a fixed sleep.
    """

    def __init__(
        self,
        *args: str,
        ready_timeout_s: float = 60.0,
        wait_ready: bool = True,
        env: dict[str, str] | None = None,
        grpc: bool = False,
        wrapper: Sequence[str] = (),
        tls_ca: Path | None = None,
        command: Sequence[str] | None = None,
    ) -> None:
        self._args = list(args)
        self.tls_ca = tls_ca  # the server speaks TLS: its URL is https, checked against this CA
        self._wrapper = list(wrapper)  # a command the server runs under (a profiler), pid and all
        # What serves, in place of `python -m tensorgate serve`: a program that takes the same flags.
        self._command = [sys.executable, "-m", "tensorgate", "serve"] if command is None else list(command)
        self._ready_timeout_s = ready_timeout_s
        self._wait_ready = wait_ready
        self._env = env
        self._grpc = grpc
        self._tmp = tempfile.TemporaryDirectory(prefix="tensorgate-test-")
        self.ports: dict[str, int] = {}
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = Path(self._tmp.name) / "server.log"

    @property
    def url(self) -> str:
        scheme = "http" if self.tls_ca is None else "https"
        return f"{scheme}://127.0.0.1:{self.ports['http']}"

    @property
    def http_address(self) -> str:
        return f"127.0.0.1:{self.ports['http']}"

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.ports['grpc']}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['metrics']}/metrics"

    def start(self) -> ServerProcess:
        try:
            self._launch()
        except BaseException:
            # A server that never bound its ports or became ready is not left running (the error
            # carries its log).
            self.stop()
            self._tmp.cleanup()
            raise
        return self

    def _launch(self) -> None:
        ports_file = Path(self._tmp.name) / "ports.json"
        command = [*self._wrapper, *self._command, "--http-port", "0"]
        command += ["--ports-file", str(ports_file)]
        if "--no-metrics" not in self._args:
            command += ["--metrics-port", "0"]
        command += self._args
        if not any(a == "--grpc-port" for a in self._args):
            command += ["--grpc-port", "0"]
        env = {**os.environ, **(self._env or {})}
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + self._ready_timeout_s
        while not ports_file.exists():
            self._check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"server did not bind its ports in time; log:\n{self.log()}")
            time.sleep(0.02)
        self.ports = json.loads(ports_file.read_text())
        if self._wait_ready:
            self.wait_ready(deadline - time.monotonic())

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        context = None if self.tls_ca is None else ssl.create_default_context(cafile=str(self.tls_ca))
        while True:
            self._check_alive()
            if self._ready(context):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"server not ready within {timeout_s:.0f} s; log:\n{self.log()}")
            time.sleep(0.02)

    def _ready(self, context: ssl.SSLContext | None) -> bool:
        """One ``GET /v2/health/ready``, with the standard library so this helper needs no HTTP client
        installed (httpx is the bench extra's); False while the server cannot answer yet."""
        port = self.ports["http"]
        connection = (
            http.client.HTTPConnection("127.0.0.1", port, timeout=2.0)
            if context is None
            else http.client.HTTPSConnection("127.0.0.1", port, timeout=2.0, context=context)
        )
        try:
            connection.request("GET", "/v2/health/ready")
            return connection.getresponse().status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            connection.close()

    def wait_loaded(self, timeout_s: float = 60.0) -> None:
        """Wait until model loading has finished, ready or not (a repository with failing models
        never turns ready, but its server still finishes starting)."""
        deadline = time.monotonic() + timeout_s
        while not any(
            str(r.get("message", "")).startswith(("server ready", "server started")) for r in self.log_records()
        ):
            self._check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"server did not finish loading within {timeout_s:.0f} s; log:\n{self.log()}")
            time.sleep(0.02)

    def _check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"server exited with {self.process.returncode}; log:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-20000:]
        except OSError:
            return ""

    def log_records(self) -> list[dict[str, Any]]:
        records = []
        for line in self.log().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
        return records

    def signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, wait for a clean exit (or kill after ``timeout_s``); returns the exit code."""
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        self._tmp.cleanup()
