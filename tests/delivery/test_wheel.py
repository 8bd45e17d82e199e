"""The release files (``TENSORGATE_DIST``, the folder ``make dist`` fills) installed as users install
them: each into a fresh virtual environment whose PATH holds no C compiler (and ``CC`` names a
missing one), from PyPI as configured on this machine.

- The files: one sdist, holding the package and its build files and nothing else; a pure wheel
  (py3-none-any), always; where setup.py compiled modules, a wheel whose tags name this CPython's
  ABI and platform only, and which holds the compiled modules.
- The pure wheel: ``tensorgate --version`` and ``/v2`` report pyproject.toml's version, and it
  serves the bundled examples to tritonclient over HTTP and gRPC.
- The compiled wheel, where there is one: the same, its modules loaded compiled.
- The sdist: with no compiler its build falls back to pure Python, and the install serves.
- Each extra (llm, torch, otel, bench) resolves in a clean environment (``pip install --dry-run``),
  torch to the CPU build 2.13.0 that this machine keeps in /opt/wheels, with no CUDA package.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tensorgate.examples import EXAMPLE_MODELS

pytestmark = pytest.mark.timeout(900)  # installs from PyPI on a busy 2-core machine

ROOT = Path(__file__).resolve().parents[2]
DIST = Path(os.environ.get("TENSORGATE_DIST", "dist")).resolve()
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
LOCAL_WHEELS = Path("/opt/wheels")  # this machine's CPU build of torch
COMPILERS = ("cc", "gcc", "c++", "g++", "clang", "x86_64-linux-gnu-gcc")
INSTALL_TIMEOUT_S = 600.0


def wheel_tags(wheel: Path) -> tuple[set[str], bool]:
    """The tags a wheel's WHEEL file declares, and whether it says it is pure (Root-Is-Purelib)."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/WHEEL"))
        lines = archive.read(name).decode().splitlines()
    tags = {line.split(": ", 1)[1] for line in lines if line.startswith("Tag: ")}
    return tags, "Root-Is-Purelib: true" in lines


def artifacts() -> tuple[Path, Path, Path | None]:
    """(sdist, pure wheel, compiled wheel or None)."""
    sdists = sorted(DIST.glob(f"tensorgate-{VERSION}.tar.gz"))
    wheels = sorted(DIST.glob(f"tensorgate-{VERSION}-*.whl"))
    assert len(sdists) == 1, f"one sdist of {VERSION} in {DIST}: {sorted(DIST.iterdir())}"
    pure = [w for w in wheels if w.name.endswith("-py3-none-any.whl")]
    compiled = [w for w in wheels if w not in pure]
    assert len(pure) == 1 and len(compiled) <= 1, wheels
    return sdists[0], pure[0], compiled[0] if compiled else None


def no_compiler_env(venv: Path) -> dict[str, str]:
    """This environment with PATH holding only the virtual environment's scripts, and CC missing."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "TENSORGATE_PURE_PYTHON")}
    env.update(PATH=str(venv / "bin"), CC="/nonexistent/cc", VIRTUAL_ENV=str(venv))
    return env


def fresh_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=120)
    assert [c for c in COMPILERS if shutil.which(c, path=no_compiler_env(path)["PATH"])] == []
    return path


def pip(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    links = ["--find-links", str(LOCAL_WHEELS)] if LOCAL_WHEELS.is_dir() else []
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", *args, *links],
        cwd=cwd,
        env=no_compiler_env(venv),
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"pip {' '.join(args)}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


def install(tmp: Path, what: Path) -> tuple[Path, subprocess.CompletedProcess[str]]:
    venv = fresh_venv(tmp / "venv")
    return venv, pip(venv, "install", "--no-input", str(what), cwd=tmp)


def run_in(venv: Path, *command: str, cwd: Path) -> str:
    done = subprocess.run(
        [str(venv / "bin" / command[0]), *command[1:]],
        cwd=cwd,
        env=no_compiler_env(venv),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.strip()


def serve_and_check(venv: Path, tmp: Path) -> None:
    """``tensorgate serve`` from the environment (the bundled examples, free ports): both protocols
    answer, with the version ``tensorgate --version`` printed."""
    assert run_in(venv, "tensorgate", "--version", cwd=tmp) == f"tensorgate {VERSION}"
    ports_file = tmp / "ports.json"
    env = {**no_compiler_env(venv), "XDG_CACHE_HOME": str(tmp / "cache")}
    command = [str(venv / "bin" / "tensorgate"), "serve", "--ports-file", str(ports_file)]
    command += ["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"]
    with open(tmp / "server.log", "wb") as log:
        server = subprocess.Popen(command, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120.0
        while not ports_file.exists():
            assert server.poll() is None, (tmp / "server.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "no ports file in 120 s"
            time.sleep(0.05)
        ports = json.loads(ports_file.read_text())
        http = httpclient.InferenceServerClient(f"127.0.0.1:{ports['http']}")
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc']}")
        try:
            while not http.is_server_ready():
                assert server.poll() is None and time.monotonic() < deadline, (tmp / "server.log").read_text()[-4000:]
                time.sleep(0.05)
            assert httpx.get(f"http://127.0.0.1:{ports['http']}/v2", timeout=10).json()["version"] == VERSION
            assert {name for name in EXAMPLE_MODELS if http.is_model_ready(name)} == EXAMPLE_MODELS
            features = np.ones((1, 16), np.float32)
            x = httpclient.InferInput("features", [1, 16], "FP32")
            x.set_data_from_numpy(features)
            y = grpcclient.InferInput("features", [1, 16], "FP32")
            y.set_data_from_numpy(features)
            over_http = http.infer("mlp", [x]).as_numpy("probabilities")
            over_grpc = grpc.infer("mlp", [y]).as_numpy("probabilities")
            assert over_http is not None and over_http.shape == (1, 3)
            np.testing.assert_array_equal(over_grpc, over_http)
        finally:
            http.close()
            grpc.close()
    finally:
        server.terminate()
        assert server.wait(60) == 0, (tmp / "server.log").read_text()[-4000:]


def loaded_from(venv: Path, module: str, tmp: Path) -> str:
    return run_in(venv, "python", "-c", f"import {module}; print({module}.__file__)", cwd=tmp)


# -- the files -------------------------------------------------------------------------------------


def test_the_files_and_their_tags() -> None:
    sdist, pure, compiled = artifacts()
    tags, purelib = wheel_tags(pure)
    assert tags == {"py3-none-any"} and purelib
    if compiled is not None:
        tags, purelib = wheel_tags(compiled)
        interpreter = f"cp{sys.version_info[0]}{sys.version_info[1]}"
        platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
        print(f"{compiled.name}: serves {', '.join(sorted(tags))} only; {pure.name} everywhere else")
        assert tags == {f"{interpreter}-{interpreter}-{platform}"} and not purelib
        with zipfile.ZipFile(compiled) as archive:
            assert any(n.startswith("tensorgate_native__mypyc") and n.endswith(".so") for n in archive.namelist())
    with tarfile.open(sdist) as archive:
        names = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    assert {"pyproject.toml", "setup.py", "README.md", "CHANGELOG.md", "tensorgate/server.py"} <= names
    assert "tensorgate/protocols/http/openapi.yaml" in names  # package data
    unwanted = [
        n
        for n in names
        if n.startswith(("tests/", ".venv/", "build/", "dist/")) or n.endswith((".so", ".pyc", "_build.json"))
    ]
    assert unwanted == []


# -- installed -------------------------------------------------------------------------------------


def test_the_pure_wheel_installs_without_a_compiler_and_serves(tmp_path: Path) -> None:
    _, pure, _ = artifacts()
    venv, _ = install(tmp_path, pure)
    assert loaded_from(venv, "tensorgate.types", tmp_path).startswith(str(venv))
    assert loaded_from(venv, "tensorgate.types", tmp_path).endswith(".py")
    serve_and_check(venv, tmp_path)


def test_the_compiled_wheel_installs_without_a_compiler_and_serves(tmp_path: Path) -> None:
    _, _, compiled = artifacts()
    if compiled is None:
        pytest.skip("the build compiled nothing: the pure wheel is the only one")
    venv, _ = install(tmp_path, compiled)
    assert loaded_from(venv, "tensorgate.types", tmp_path).endswith(".so")
    serve_and_check(venv, tmp_path)


def test_the_sdist_falls_back_to_pure_python_without_a_compiler(tmp_path: Path) -> None:
    sdist, _, compiled = artifacts()
    venv = fresh_venv(tmp_path / "venv")
    done = pip(venv, "install", "--no-input", "--verbose", str(sdist), cwd=tmp_path)
    if compiled is not None:  # the build compiles where it can: here it could not, and says so
        assert "no C compiler found" in done.stdout + done.stderr
    assert loaded_from(venv, "tensorgate.types", tmp_path).endswith(".py")
    serve_and_check(venv, tmp_path)


# -- extras ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def clean_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield fresh_venv(tmp_path_factory.mktemp("extras") / "venv")


@pytest.mark.parametrize("extra", ["llm", "torch", "otel", "bench"])
def test_each_extra_resolves_in_a_clean_environment(clean_venv: Path, tmp_path: Path, extra: str) -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    wants_torch = any(r.startswith("torch") for r in extras[extra])
    if wants_torch and not LOCAL_WHEELS.is_dir():
        pytest.skip("no local CPU build of torch (/opt/wheels): PyPI's torch for Linux is the CUDA build")
    _, pure, _ = artifacts()
    report = tmp_path / "report.json"
    requirement = f"tensorgate[{extra}] @ {pure.as_uri()}"
    pip(
        clean_venv,
        "install",
        "--dry-run",
        "--ignore-installed",
        "--quiet",
        "--report",
        str(report),
        requirement,
        cwd=tmp_path,
    )
    resolved = {
        canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    print(f"[{extra}]: {len(resolved)} packages" + (f", torch {resolved['torch']}" if "torch" in resolved else ""))
    assert resolved["tensorgate"] == VERSION
    for wanted in extras[extra]:
        name = canonicalize_name(Requirement(wanted).name)
        assert name in resolved, f"[{extra}] did not bring {name}"
    if wants_torch:
        assert resolved["torch"] == "2.13.0+cpu"
        cuda = sorted(n for n in resolved if n.startswith("nvidia-") or n == "triton")
        assert cuda == [], f"[{extra}] would install CUDA packages: {cuda}"
    assert not any(p.name.startswith("tensorgate") for p in (clean_venv / "lib").rglob("*.dist-info"))
