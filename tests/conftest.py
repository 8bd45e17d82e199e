from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from build_info import stale_sources

from tensorgate.examples import build_example_repository
from tensorgate.testing import ServerProcess


def pytest_configure(config: pytest.Config) -> None:
    """Refuse to test a compiled module whose source changed since it was built: the tests would
    pass or fail on the old code, whatever the new source says."""
    stale = stale_sources()
    if stale:
        pytest.exit(
            f"compiled modules are older than their sources ({', '.join(stale)}): run `make install` "
            "(or build with TENSORGATE_PURE_PYTHON=1 to run uncompiled)",
            returncode=2,
        )


@pytest.fixture(scope="session")
def example_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_example_repository(tmp_path_factory.mktemp("examples"))


@pytest.fixture(scope="session")
def example_server(example_repo: Path) -> Iterator[ServerProcess]:
    """One server over the example repository, shared by the read-only end-to-end tests of a worker."""
    with ServerProcess("--model-repository", str(example_repo), "--log-level", "info") as server:
        yield server


@pytest.fixture(autouse=True, scope="session")
def _quiet_threads() -> None:
    # onnxruntime in many parallel test workers on 2 cores: keep each session small.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
