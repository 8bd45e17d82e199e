"""httpx is the bench extra's: serving never imports it, and ``tensorgate bench`` says what to install.

Absence is made the way ``test_optional_runtimes.py`` makes it: a ``sitecustomize`` on PYTHONPATH
makes importing httpx raise ``ModuleNotFoundError``, as an install without the extra does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
from model_builders import v2_body, write_python_model

from tensorgate.testing import ServerProcess

ABSENT = """
import sys


class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "httpx":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
"""


def _without_httpx(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(ABSENT)
    return {"PYTHONPATH": str(site)}


def test_the_server_and_the_command_do_not_import_httpx() -> None:
    script = (
        "import sys\n"
        "import tensorgate.cli.main, tensorgate.server, tensorgate.testing\n"
        "print(sorted(m for m in sys.modules if m.partition('.')[0] in {'httpx', 'matplotlib'}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


def test_serve_runs_without_httpx(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_python_model(repo, "plain", parameters={"delay_ms": 0})
    with ServerProcess("--model-repository", str(repo), env=_without_httpx(tmp_path)) as server:
        answer = httpx.post(server.url + "/v2/models/plain/infer", json=v2_body([[1, 2, 3, 4]]), timeout=10.0)
        assert answer.status_code == 200
    assert "httpx" not in server.log()


def test_bench_without_httpx_names_the_extra(tmp_path: Path) -> None:
    env = {**os.environ, **_without_httpx(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "tensorgate", "bench", "mlp", "-n", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 1
    assert "pip install 'tensorgate[bench]'" in done.stderr
    assert "Traceback" not in done.stderr
