"""The documentation: the MkDocs site under docs/ builds in strict mode, and the README stays a short
front door whose links all lead somewhere."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# [text](target) and ![alt](target), not inside code spans; the target ends at whitespace or ')'.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    """Broken links, missing anchors, pages left out of the nav and bad config all fail the build."""
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "index.html").is_file()


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) < 200, f"README.md has {len(lines)} lines; the reference belongs in docs/"


def _readme_links() -> list[str]:
    text = README.read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)  # fenced blocks hold no links
    text = re.sub(r"`[^`\n]*`", "", text)  # nor do code spans
    return LINK.findall(text)


def test_readme_relative_links_point_at_files() -> None:
    links = _readme_links()
    relative = [link for link in links if not re.match(r"^[a-z][a-z0-9+.-]*:", link) and not link.startswith("#")]
    assert relative, "README.md links nothing in the repository"
    missing = [link for link in relative if not (ROOT / link.split("#", 1)[0]).is_file()]
    assert missing == [], f"README.md links to files that do not exist: {missing}"
