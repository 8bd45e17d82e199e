"""Bump tensorgate's version everywhere it is written, in one command: ``make release VERSION=x.y.z``.

pyproject.toml holds the version (the package reads it from its metadata); the files below repeat
it because their readers cannot ask the package: the container image's tag in the Kubernetes
manifests and the KServe runtime, the OpenAPI document's ``info.version``, and the commands in the
docs. ``CHANGELOG.md``'s Unreleased section becomes the release's section, dated, under a new,
empty Unreleased.

``python tools/release.py --check`` changes nothing and exits 1 when a file disagrees with
pyproject.toml (``tests/deploy/test_release.py`` runs the same check).
"""

from __future__ import annotations

import argparse
import datetime
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSION = re.compile(r"^\d+\.\d+\.\d+$")
# The image and its variants' tags: tensorgate:<version>, tensorgate:<version>-gpu, -cann.
IMAGE_REFERENCE = re.compile(r"\btensorgate:(\d+\.\d+\.\d+)(?:-(?:gpu|cann))?\b")
RELEASE_HEADING = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", re.M)
UNRELEASED = "## [Unreleased]"
SECTIONS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")


@dataclass(frozen=True)
class Pin:
    """A line in ``path`` that states the version: ``pattern``'s group 1 is the version."""

    path: str
    pattern: re.Pattern[str]

    def versions(self, root: Path) -> list[str]:
        return self.pattern.findall((root / self.path).read_text(encoding="utf-8"))


def _line(text: str) -> re.Pattern[str]:
    """A whole line, with ``{}`` where the version stands."""
    return re.compile("^" + re.escape(text).replace(r"\{\}", r"(\d+\.\d+\.\d+)") + "$", re.M)


# Every place the version is stated outside the image references that IMAGE_REFERENCE finds.
PINS = (
    Pin("pyproject.toml", _line('version = "{}"')),
    Pin("tensorgate/protocols/http/openapi.yaml", _line("  version: {}")),
    Pin("deploy/kubernetes/base/kustomization.yaml", _line("    newTag: {}")),
    Pin("deploy/kubernetes/overlays/gpu/kustomization.yaml", _line("    newTag: {}-gpu")),
    Pin("deploy/kubernetes/overlays/ascend/kustomization.yaml", _line("    newTag: {}-cann")),
    Pin("deploy/kserve/clusterservingruntime.yaml", _line("      image: tensorgate:{}")),
)


def current_version(root: Path = ROOT) -> str:
    (version,) = PINS[0].versions(root)
    return version


def tracked_text_files(root: Path) -> list[Path]:
    """The files git tracks (or, outside a git checkout, every file), less the changelog, whose
    older sections name older versions."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True, timeout=30
        ).stdout.split(b"\0")
        paths = [root / name.decode() for name in listed if name]
    except (OSError, subprocess.CalledProcessError):
        paths = [p for p in root.rglob("*") if ".git" not in p.parts]
    return [p for p in paths if p.is_file() and p.name != "CHANGELOG.md"]


def disagreements(root: Path = ROOT, version: str | None = None) -> list[str]:
    """Each place that states a version other than ``version`` (default: pyproject.toml's)."""
    version = version or current_version(root)
    found = []
    for pin in PINS:
        versions = pin.versions(root)
        if not versions:
            found.append(f"{pin.path}: no line matches {pin.pattern.pattern}")
        found += [f"{pin.path}: {v} (pin {pin.pattern.pattern})" for v in versions if v != version]
    for path in tracked_text_files(root):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for match in IMAGE_REFERENCE.finditer(text):
            if match.group(1) != version:
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{path.relative_to(root)}:{line}: {match.group(0)}")
    return found


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def released(changelog: str) -> list[str]:
    """The versions CHANGELOG.md has a dated section for."""
    return [version for version, _ in RELEASE_HEADING.findall(changelog)]


def cut_changelog(changelog: str, version: str, date: datetime.date) -> str:
    """The Unreleased section's entries become ``version``'s, dated; a new Unreleased is empty."""
    if UNRELEASED not in changelog:
        raise ValueError(f"CHANGELOG.md has no '{UNRELEASED}' heading")
    start = changelog.index(UNRELEASED) + len(UNRELEASED)
    following = RELEASE_HEADING.search(changelog, start)
    end = following.start() if following else len(changelog)
    entries = changelog[start:end].strip("\n")
    if not re.search(r"^- ", entries, re.M):
        raise ValueError("CHANGELOG.md's Unreleased section lists nothing: say what this release changes first")
    return (
        changelog[:start]
        + f"\n\n## [{version}] - {date.isoformat()}\n\n"
        + entries
        + "\n"
        + ("\n" + changelog[end:] if following else "")
    )


def bump(root: Path, version: str, date: datetime.date) -> list[Path]:
    """Write ``version`` everywhere; returns the files changed."""
    if not VERSION.match(version):
        raise ValueError(f"{version!r} is not a version of the form MAJOR.MINOR.PATCH")
    changelog_path = root / "CHANGELOG.md"
    changelog = changelog_path.read_text(encoding="utf-8")
    newest = max(released(changelog) or ["0.0.0"], key=_key)
    if _key(version) <= _key(newest):
        raise ValueError(f"{version} is not newer than {newest}, the newest release in CHANGELOG.md")
    old = current_version(root)
    changes = {changelog_path: cut_changelog(changelog, version, date)}
    for pin in PINS:
        path = root / pin.path
        text = changes.get(path, path.read_text(encoding="utf-8"))

        def replace(match: re.Match[str]) -> str:
            whole = match.group(0)
            return whole[: match.start(1) - match.start(0)] + version + whole[match.end(1) - match.start(0) :]

        changes[path] = pin.pattern.sub(replace, text)
    for path in tracked_text_files(root):
        if path in changes:
            text = changes[path]
        else:
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
        replaced = IMAGE_REFERENCE.sub(lambda m: m.group(0).replace(m.group(1), version, 1), text)
        if replaced != text or path in changes:
            changes[path] = replaced
    written = []
    for path, text in changes.items():
        if text != path.read_text(encoding="utf-8"):
            path.write_text(text, encoding="utf-8")
            written.append(path)
    left = disagreements(root, version)
    if left:
        raise RuntimeError("after the bump from " + old + ", still: " + "; ".join(left))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/release.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("version", nargs="?", help="the new version, MAJOR.MINOR.PATCH")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 where a file disagrees")
    parser.add_argument("--date", type=datetime.date.fromisoformat, default=datetime.date.today())
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.check:
        found = disagreements(args.root)
        for line in found:
            print(line, file=sys.stderr)
        return 1 if found else 0
    if args.version is None:
        parser.error("give the new version (or --check)")
    try:
        written = bump(args.root, args.version, args.date)
    except ValueError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path.relative_to(args.root)}")
    print(
        f"tensorgate {args.version}: review the diff, commit it, tag it (git tag v{args.version}), "
        f"then `make image` builds tensorgate:{args.version}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
