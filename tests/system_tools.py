"""The Debian programs the deployment and page tests drive (nginx, Chromium, kubectl), found on the
machine: ``tests/system_packages.sh`` installs them before the suite runs (``make test`` calls it),
so a test never installs anything itself.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


def system_tool(executable: str) -> str:
    """The path of ``executable``. Where it is missing: the test skips where the installer could not
    have installed it (no apt-get, or not root), and fails otherwise, so a machine on which
    ``tests/system_packages.sh`` was not run, or failed, is seen rather than hidden."""
    found = shutil.which(executable) or _in_sbin(executable)
    if found:
        return found
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        pytest.skip(f"{executable} is not installed (tests/system_packages.sh installs it on Debian, as root)")
    pytest.fail(f"{executable} is not installed: run tests/system_packages.sh (make test runs it)")


def _in_sbin(executable: str) -> str | None:
    # nginx lives in /usr/sbin, which a non-login PATH may lack.
    for directory in ("/usr/sbin", "/sbin"):
        path = Path(directory) / executable
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return None
