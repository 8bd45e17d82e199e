"""The test harness's server process: a server that never becomes ready is not left running."""

from __future__ import annotations

from pathlib import Path

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
