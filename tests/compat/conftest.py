"""One server over Triton's example repository (rebuilt by ``triton_repository.py``), as a team moving
from Triton would start it: the repository unchanged, system shared memory on, and the server's
name ``triton`` (Triton's health examples check it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from triton_repository import build_triton_repository

from tensorgate.testing import ServerProcess


@pytest.fixture(scope="session")
def triton_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_triton_repository(tmp_path_factory.mktemp("triton-repo"))


@pytest.fixture(scope="session")
def triton_server(triton_repo: Path) -> Iterator[ServerProcess]:
    with ServerProcess(
        "--model-repository", str(triton_repo), "--shared-memory", "system", "--server-name", "triton"
    ) as server:
        yield server
