"""The curl examples of the README and of ``docs/*.md``, run as written against the bundled example models.

Only the addresses change (the test server listens on free ports). ``curl -f`` turns any HTTP error
into a failed command, so an example that stops working fails here. Every ```` ```sh ```` block must
run against the bundled examples; examples that need other models are fenced as ```` ```bash ````.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tensorgate.testing import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _commands() -> list[str]:
    blocks = [
        block
        for page in PAGES
        if page.exists()
        for block in re.findall(r"^```sh\n(.*?)^```", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    ]
    commands: list[str] = []
    for block in blocks:
        joined = re.sub(r"\\\n\s*", " ", block)
        lines: list[str] = []
        for raw in joined.splitlines():
            code, hash_, _comment = raw.partition("  #")
            line = code.rstrip() if hash_ and code.count("'") % 2 == 0 else raw
            if lines and lines[-1].count("'") % 2 == 1:  # inside a quoted JSON body spread over lines
                lines[-1] += "\n" + line
            else:
                lines.append(line)
        commands += [line for line in lines if line.startswith(("curl ", "python3 "))]
    return commands


COMMANDS = _commands()


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
@pytest.mark.skipif(not COMMANDS, reason="no README or docs examples found")
def test_readme_examples(example_server: ServerProcess, tmp_path: Path) -> None:
    assert len(COMMANDS) >= 10
    for command in COMMANDS:
        command = command.replace("localhost:8080", example_server.http_address)
        command = command.replace("localhost:8082", f"127.0.0.1:{example_server.ports['metrics']}")
        if command.startswith("curl "):
            command = "curl -sSf " + command[len("curl ") :]
        else:
            command = f"{sys.executable} " + command[len("python3 ") :]
        result = subprocess.run(
            ["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=30, check=False
        )
        assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
