"""The fuzz tests import their harness (``fuzz_targets``) from this folder; its event loop (the HTTP/2
target's) is closed once the session is done."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fuzz_targets import close_loop


@pytest.fixture(autouse=True, scope="session")
def _fuzz_loop() -> Iterator[None]:
    yield
    close_loop()
