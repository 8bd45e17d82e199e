"""tensorgate's own HTTP app served by Granian: the same server behind another HTTP front end.

``python benchmarks/_granian_tensorgate.py PORT MODEL_REPOSITORY`` runs Granian (HTTP in Rust; one
worker, one runtime thread, uvloop) through its ASGI interface with lifespan. At lifespan startup,
inside Granian's worker process and on its event loop, a real :class:`tensorgate.server.Server` starts
with the configuration ``tensorgate serve --model-repository REPO`` gets from ``ServerProcess``
(metrics on, gRPC on; those and the server's own uvicorn listener bind free ports and stay idle),
and every HTTP request goes to the :class:`~tensorgate.protocols.http.app.HttpApp` that server
built (``Server.http_app``). So the model, the scheduler, the metrics and the app are the same as
under ``tensorgate serve``; only the HTTP protocol (parsing, keep-alive, writes) is Granian's. At
lifespan shutdown the server shuts down in order.

Granian imports this module by name in its worker, so the repository travels in an environment
variable, and ``bench_front_end.py`` starts it with this directory as the working directory.
"""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

REPOSITORY_ENV = "TENSORGATE_BENCH_GRANIAN_REPOSITORY"


class GranianApp:
    """An ASGI app: lifespan starts and stops a tensorgate Server; HTTP goes to its app."""

    def __init__(self) -> None:
        self.server: Any = None
        self.http: Any = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        await self.http(scope, receive, send)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self._start()
                except Exception as exc:  # reported to Granian, which logs it and stops the worker
                    await send({"type": "lifespan.startup.failed", "message": f"tensorgate did not start: {exc!r}"})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.server is not None:
                    await self.server.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _start(self) -> None:
        from tensorgate.config.loading import validate
        from tensorgate.config.server_config import ServerConfig
        from tensorgate.models.status import StatusReport
        from tensorgate.observability.logging import configure_logging
        from tensorgate.protocols.http.app import HttpApp, HttpSettings
        from tensorgate.protocols.http.v2_codec import DecodeLimits
        from tensorgate.security.hosts import HostAllowlist
        from tensorgate.server import Server

        # What ServerProcess passes to `tensorgate serve`: every port free (0), log level warning.
        section = {
            "model_repository": os.environ[REPOSITORY_ENV],
            "http_port": 0,
            "grpc_port": 0,
            "metrics_port": 0,
            "log_level": "warning",
        }
        config = validate(ServerConfig, {"server": section}, "benchmarks/_granian_tensorgate.py")
        configure_logging(config.server.log_level, config.server.log_format, config.server.access_log, None)
        self.server = Server(config, config_dir=Path.cwd(), config_source="benchmarks/_granian_tensorgate.py")
        await self.server.start()
        if not self.server.service.ready():
            raise RuntimeError("the models did not load")
        # The app `tensorgate serve` would put behind its own listener, built from the server's parts.
        section = config.server
        self.http = HttpApp(
            self.server.service,
            HttpSettings(
                max_body_bytes=section.max_body_bytes,
                limits=DecodeLimits(max_elements=section.max_elements, max_json_depth=section.max_json_depth),
                tenancy=self.server.tenancy,
            ),
            self.server.clock,
            self.server.access_log,
            self.server.tracer,
            self.server.gate,
            HostAllowlist.for_bind(section.host, section.allowed_hosts),
            self.server.shared_memory,
            StatusReport(self.server.service, self.server.clock, self.server.metrics.status),
        )


app = GranianApp()


def serve(port: int, repository: Path) -> None:
    from granian import Granian
    from granian.constants import Interfaces, Loops
    from granian.log import LogLevels

    os.environ[REPOSITORY_ENV] = str(repository.resolve())
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")  # as `tensorgate serve` sets it
    Granian(
        "_granian_tensorgate:app",
        address="127.0.0.1",
        port=port,
        interface=Interfaces.ASGI,  # with lifespan, which starts the server (ASGINL has none)
        workers=1,
        runtime_threads=1,
        loop=Loops.uvloop,
        websockets=False,
        log_level=LogLevels.warning,
    ).serve()


class GranianTensorgate:
    """This module's server in a child process, for ``bench_front_end.py``. Its output (the access log
    among it) goes to a file, as ``ServerProcess`` sends ``tensorgate serve``'s."""

    def __init__(self, repository: Path, env: dict[str, str]) -> None:
        here = Path(__file__).resolve().parent
        sys.path.insert(0, str(here))
        from _echo import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.NamedTemporaryFile(prefix="granian-tensorgate-", suffix=".log")  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, str(here / "_granian_tensorgate.py"), str(self.port), str(repository)],
            cwd=here,
            env={**os.environ, **env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Until ``/v2/health/ready`` answers 200 (polled: the server is another process, loading a model)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                connection.request("GET", "/v2/health/ready")
                if connection.getresponse().status == 200:
                    return
            except OSError:
                pass
            finally:
                connection.close()
            if time.monotonic() > deadline or self.process.poll() is not None:
                tail = Path(self._log.name).read_text(errors="replace")[-2000:]
                raise RuntimeError(f"tensorgate on Granian did not start (exit status {self.process.poll()}):\n{tail}")
            time.sleep(0.05)

    def worker_pid(self) -> int:
        """Granian's worker process: where the server, its event loop and the Rust HTTP threads run."""
        return psutil.Process(self.process.pid).children()[0].pid

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self._log.close()


if __name__ == "__main__":
    serve(int(sys.argv[1]), Path(sys.argv[2]))
