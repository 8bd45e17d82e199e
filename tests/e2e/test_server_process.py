"""The test harness's server process: a server that never becomes ready is not left running."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tensorgate.testing import ServerProcess


def test_a_server_that_never_becomes_ready_is_stopped(tmp_path: Path) -> None:
    (tmp_path / "broken" / "1").mkdir(parents=True)
    (tmp_path / "broken" / "config.yaml").write_text("backend: no-such-backend\n")  # fails to load
    server = ServerProcess("--model-repository", str(tmp_path), ready_timeout_s=3)
    with pytest.raises(TimeoutError, match="not ready"):
        server.start()
    assert server.process is not None
    assert server.process.poll() is not None  # exited, not left behind


def test_a_wrapper_runs_the_server_in_the_same_process(example_repo: Path) -> None:
    """What a profiler needs (``benchmarks/_callgrind.py``): the wrapper execs the server, so the
    pid the harness holds is the server's own, and stopping it stops the server."""
    wrapper = ["env", "TENSORGATE_WRAPPED=1"]
    with ServerProcess("--model-repository", str(example_repo), wrapper=wrapper) as server:
        assert server.process is not None
        assert httpx.get(f"{server.url}/v2/health/ready", timeout=5).status_code == 200
        environ = Path(f"/proc/{server.process.pid}/environ").read_bytes().split(b"\0")
        assert b"TENSORGATE_WRAPPED=1" in environ
        assert Path(f"/proc/{server.process.pid}/cmdline").read_bytes().split(b"\0")[1:4] == [
            b"-m",
            b"tensorgate",
            b"serve",
        ]
    assert server.process.poll() == 0
