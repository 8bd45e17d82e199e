"""Releases a user can pin: one version, written in pyproject.toml and repeated, in agreement,
wherever a reader cannot ask the package (tools/release.py's list), and a changelog in the usual
form.

- Every image reference and version pin in the repository names pyproject.toml's version.
- ``tensorgate --version`` and ``/v2`` report it.
- CHANGELOG.md: Keep a Changelog's form (Unreleased first, then dated releases, newest first, each
  with Added/Changed/... sections of bullet points).
- ``tools/release.py X.Y.Z`` on a copy of the repository's versioned files: everything agrees with
  the new version afterwards, the Unreleased entries became the release's, and it refuses an
  older version and an empty Unreleased section.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import httpx

from tensorgate.testing import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
# Image references written as the scan finds them would be found in this file too: they are made.
IMAGE = "tensorgate"


def _release() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tensorgate_release", ROOT / "tools" / "release.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


release = _release()


def test_every_pin_and_image_reference_names_the_pyproject_version() -> None:
    assert release.current_version() == VERSION
    assert release.disagreements() == []
    # The manifests the image is deployed by, read as their tools read them.
    kustomization = (ROOT / "deploy" / "kubernetes" / "base" / "kustomization.yaml").read_text()
    assert f"    newTag: {VERSION}\n" in kustomization
    runtime = (ROOT / "deploy" / "kserve" / "clusterservingruntime.yaml").read_text()
    assert f"      image: tensorgate:{VERSION}\n" in runtime


def test_the_check_finds_a_disagreement(tmp_path: Path) -> None:
    root = _copy_versioned_files(tmp_path)
    runtime = root / "deploy" / "kserve" / "clusterservingruntime.yaml"
    runtime.write_text(runtime.read_text().replace(f"{IMAGE}:{VERSION}", f"{IMAGE}:0.0.9"))
    (root / "docs" / "extra.md").write_text(f"docker run {IMAGE}:0.0.8-gpu\n")
    found = release.disagreements(root)
    assert any("clusterservingruntime.yaml" in line and "0.0.9" in line for line in found), found
    assert any(line.startswith(f"docs/extra.md:1: {IMAGE}:0.0.8-gpu") for line in found), found


def test_cli_version_and_server_metadata_agree(example_repo: Path) -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "tensorgate", "--version"], capture_output=True, text=True, timeout=60, check=True
    ).stdout.strip()
    assert printed == f"tensorgate {VERSION}"
    with ServerProcess("--model-repository", str(example_repo)) as server:
        assert httpx.get(f"{server.url}/v2", timeout=10).json()["version"] == VERSION


def test_changelog_form() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## (.*)$", text, re.M)
    assert text.startswith("# Changelog\n")
    assert headings[0] == "[Unreleased]"
    dated = [release.RELEASE_HEADING.match(f"## {h}") for h in headings[1:]]
    assert all(dated), f"release headings are '## [X.Y.Z] - YYYY-MM-DD': {headings[1:]}"
    versions = [tuple(int(p) for p in m.group(1).split(".")) for m in dated if m]
    assert versions == sorted(versions, reverse=True), "newest first"
    assert set(re.findall(r"^### (.*)$", text, re.M)) <= set(release.SECTIONS)
    for section in re.split(r"^### .*$", text, flags=re.M)[1:]:
        entries = section.split("\n## ")[0].strip()
        assert entries.startswith("- "), f"a section without entries: {entries[:80]!r}"


def _copy_versioned_files(tmp_path: Path) -> Path:
    """The files that state the version, in a tree of their own (not a git checkout: every file is
    scanned)."""
    root = tmp_path / "repo"
    for path in [*(pin.path for pin in release.PINS), "CHANGELOG.md", "README.md", "docs/deployment.md"]:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, root / path)
    return root


def test_release_bumps_everything_and_cuts_the_changelog(tmp_path: Path) -> None:
    root = _copy_versioned_files(tmp_path)
    before = (root / "CHANGELOG.md").read_text()
    unreleased = before.split("## [Unreleased]\n", 1)[1].split("\n## [", 1)[0].strip()
    code = release.main(["--root", str(root), "--date", "2031-02-03", "97.1.0"])
    assert code == 0
    assert release.current_version(root) == "97.1.0"
    assert release.disagreements(root) == []
    assert "newTag: 97.1.0-gpu" in (root / "deploy/kubernetes/overlays/gpu/kustomization.yaml").read_text()
    assert f"{IMAGE}:97.1.0" in (root / "docs" / "deployment.md").read_text()
    after = (root / "CHANGELOG.md").read_text()
    assert after.split("## [Unreleased]\n", 1)[1].split("\n## [", 1)[0].strip() == ""
    released = after.split("## [97.1.0] - 2031-02-03\n", 1)[1].split("\n## [", 1)[0].strip()
    assert released == unreleased
    # A second release needs entries of its own, and a newer version.
    assert release.main(["--root", str(root), "97.2.0"]) == 2
    (root / "CHANGELOG.md").write_text(after.replace("## [Unreleased]\n", "## [Unreleased]\n\n### Fixed\n\n- x\n"))
    assert release.main(["--root", str(root), "97.1.0"]) == 2
    assert release.main(["--root", str(root), "97.1"]) == 2
    assert release.current_version(root) == "97.1.0"


def test_release_check_mode_exits_zero_here() -> None:
    assert release.main(["--check"]) == 0
