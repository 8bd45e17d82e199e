"""Triton (through PyTriton) and MLServer beside tensorgate, serving the same ONNX file with the same
onnxruntime threads and the same batching (max batch 8, 5 ms), for ``bench_workloads.py``.

Their servers live in a virtual environment of the benchmark's own (``benchmarks/.venv-peers``, made
on first use with pip: ``nvidia-pytriton``, ``mlserver``, ``onnxruntime``), never in tensorgate's
dependencies. Each server is a process of that environment started on free loopback ports:

- Triton: ``_peer_pytriton.py`` binds an onnxruntime session as a PyTriton model (``@batch``, a
  ``DynamicBatcher`` with a 5 ms queue delay); Triton's own HTTP and gRPC front ends serve it.
- MLServer: a model settings folder naming ``_peer_mlserver.py``'s ``OnnxModel`` runtime (MLServer
  has no ONNX runtime of its own), with adaptive batching (``max_batch_size`` 8, ``max_batch_time``
  5 ms) and MLServer's defaults otherwise, but for ``parallel_workers: 0`` (inference in the server's
  own process): its default worker process exits at start here, with ``RuntimeError: There is no
  current event loop in thread 'MainThread'`` (MLServer 1.7.1, Python 3.11.7).

PyTriton's Python backend stub embeds a CPython 3.11 older than this interpreter's 3.11.7 standard
library, whose multiprocessing resource tracker then fails with ``AttributeError: '_thread.RLock'
object has no attribute '_recursion_count'`` (pytriton issue 51): the environment gets a
``sitecustomize.py`` that hands the tracker the pure-Python RLock, which has the method.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENV = HERE / ".venv-peers"
PACKAGES = ["nvidia-pytriton==0.7.0", "mlserver==1.7.1", "onnxruntime>=1.17,<2", "numpy<2"]
SITECUSTOMIZE = """\
# Written by benchmarks/_peers.py: Triton's Python backend stub embeds a CPython 3.11 whose C RLock
# lacks _recursion_count, while it runs this interpreter's newer 3.11 standard library, whose
# multiprocessing resource tracker calls it (pytriton issue 51).
import threading

if not hasattr(threading.RLock(), "_recursion_count"):
    import multiprocessing.resource_tracker as _tracker

    _tracker._resource_tracker._lock = threading._PyRLock()
"""


def ensure_venv() -> tuple[Path | None, str]:
    """The peers' Python, installing their environment when missing; (None, why) when it cannot."""
    python = VENV / "bin" / "python"
    stamp = VENV / ".installed"
    wanted = "\n".join(PACKAGES)
    if stamp.exists() and stamp.read_text() == wanted:
        return python, ""
    try:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, capture_output=True, timeout=300)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", *PACKAGES],
            check=True,
            capture_output=True,
            text=True,
            timeout=1800,
        )
    except subprocess.CalledProcessError as exc:
        return None, f"pip could not install {' '.join(PACKAGES)}: {(exc.stderr or '')[-600:]}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"the peers' environment could not be made: {exc}"
    site = subprocess.run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True, text=True, check=True
    ).stdout.strip()
    Path(site, "sitecustomize.py").write_text(SITECUSTOMIZE)
    stamp.write_text(wanted)
    return python, ""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except OSError:
        return 0


class Peer:
    """One peer server process; ``url`` (HTTP) and ``grpc`` (host:port) once ready."""

    name = "peer"

    def __init__(self) -> None:
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._work = Path(tempfile.mkdtemp(prefix=f"tensorgate-{self.name}-"))
        self.log_path = self._work / "server.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def _launch(self, command: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                command,
                cwd=cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                start_new_session=True,  # its own process group: Triton and its stubs stop with it
            )

    def wait_ready(self, model: str, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while _get(f"{self.url}/v2/models/{model}/ready") != 200:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}: {self.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} not ready in {timeout_s:.0f} s: {self.log()[-3000:]}")
            time.sleep(0.2)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def pids(self) -> list[int]:
        """The server's process tree (for its memory)."""
        import psutil

        if self.process is None:
            return []
        try:
            root = psutil.Process(self.process.pid)
            return [root.pid, *(c.pid for c in root.children(recursive=True))]
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
            except ProcessLookupError:
                pass
        shutil.rmtree(self._work, ignore_errors=True)


class PyTriton(Peer):
    name = "pytriton"

    def __init__(
        self, python: Path, onnx: Path, model: str, threads: int, max_batch: int = 8, delay_ms: float = 5
    ) -> None:
        super().__init__()
        self._launch(
            [
                str(python),
                str(HERE / "_peer_pytriton.py"),
                str(onnx),
                model,
                str(threads),
                str(max_batch),
                str(int(delay_ms * 1000)),
                str(self.http_port),
                str(self.grpc_port),
                str(self.metrics_port),
            ],
            self._work,
            {"OMP_NUM_THREADS": str(threads), "PYTRITON_HOME": str(self._work / "home")},
        )


class MLServer(Peer):
    name = "mlserver"

    def __init__(
        self,
        python: Path,
        onnx: Path,
        model: str,
        threads: int,
        signature: dict[str, list[dict[str, object]]],
        max_batch: int = 8,
        delay_ms: float = 5,
    ) -> None:
        super().__init__()
        folder = self._work / "models" / model
        folder.mkdir(parents=True)
        shutil.copyfile(HERE / "_peer_mlserver.py", folder / "onnx_runtime.py")
        settings = {
            "name": model,
            "implementation": "onnx_runtime.OnnxModel",
            "max_batch_size": max_batch,
            "max_batch_time": delay_ms / 1000,
            "inputs": signature["inputs"],
            "outputs": signature["outputs"],
            "parameters": {"uri": str(onnx), "extra": {"threads": threads}},
        }
        (folder / "model-settings.json").write_text(json.dumps(settings))
        server = {
            "host": "127.0.0.1",
            "http_port": self.http_port,
            "grpc_port": self.grpc_port,
            "metrics_port": self.metrics_port,
            "debug": False,
            "parallel_workers": 0,
            "grpc_max_message_length": 64 * 2**20,  # its default (4 MB) refuses the detector's 4.9 MB image
        }
        (self._work / "models" / "settings.json").write_text(json.dumps(server))
        mlserver = python.parent / "mlserver"
        self._launch(
            [str(mlserver), "start", str(self._work / "models")], self._work, {"OMP_NUM_THREADS": str(threads)}
        )
