from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tensorgate.examples import build_example_repository
from tensorgate.testing import ServerProcess


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
