"""Debian packages the deployment tests need (nginx, and whatever another helper asks for),
installed by the tests themselves when missing.

``apt-get update`` runs at most once per machine run of the suite, and installs are serialised
across pytest-xdist workers by a file lock, so two workers never race for dpkg's own lock. Debian
images for containers ship a ``policy-rc.d`` that stops a package's service from starting on
install; where one is missing, a daemon the package starts (nginx on port 80) is the package's,
not the tests': the tests start their own processes on their own ports.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

# Shared by every worker of a run (and by later runs: an update already done is not repeated).
_LOCK = Path(tempfile.gettempdir()) / "tensorgate-tests-apt.lock"
_UPDATED = Path(tempfile.gettempdir()) / "tensorgate-tests-apt.updated"
UPDATE_TIMEOUT_S = 300.0
INSTALL_TIMEOUT_S = 600.0


@contextmanager
def _apt_lock() -> Iterator[None]:
    with open(_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
        yield


def _run(command: list[str], timeout_s: float) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        )


def ensure_debian_package(package: str, executable: str) -> str:
    """The path of ``executable``, installing Debian's ``package`` first when it is missing.

    Skips the calling test where packages cannot be installed at all (no apt-get, or not root);
    fails it where apt-get is there but the install fails, so a broken mirror is seen, not hidden.
    """
    found = shutil.which(executable) or _in_sbin(executable)
    if found:
        return found
    if shutil.which("apt-get") is None:
        pytest.skip(f"{executable} is not installed and this is not a Debian system (no apt-get)")
    if os.geteuid() != 0:
        pytest.skip(f"{executable} is not installed and installing Debian's {package} needs root")
    with _apt_lock():
        found = shutil.which(executable) or _in_sbin(executable)  # another worker may have installed it
        if found:
            return found
        install = ["apt-get", "install", "-y", "--no-install-recommends", package]
        if _UPDATED.exists():
            try:
                _run(install, INSTALL_TIMEOUT_S)
            except RuntimeError:  # package lists from an earlier run may have gone stale: refresh once
                _UPDATED.unlink()
        if not _UPDATED.exists():
            _run(["apt-get", "update"], UPDATE_TIMEOUT_S)
            _UPDATED.touch()
            _run(install, INSTALL_TIMEOUT_S)
    found = shutil.which(executable) or _in_sbin(executable)
    if not found:
        raise RuntimeError(f"installed {package}, but {executable} is still not on PATH")
    return found


def _in_sbin(executable: str) -> str | None:
    # nginx lives in /usr/sbin, which a non-login PATH may lack.
    for directory in ("/usr/sbin", "/sbin"):
        path = Path(directory) / executable
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return None
