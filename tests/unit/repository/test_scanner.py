"""Scanning a repository on disk: layouts, version policy, and paths that must stay inside the root."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorgate.repository.scanner import scan_repository
from tensorgate.repository.source import ModelSource


def _model(root: Path, name: str, versions: list[str], config: str | None = None, artifact: str = "model.onnx") -> Path:
    directory = root / name
    directory.mkdir(parents=True)
    for v in versions:
        (directory / v).mkdir()
        (directory / v / artifact).write_bytes(b"onnx")
    if config is not None:
        (directory / "config.yaml").write_text(config)
    return directory


def _by_name(root: Path) -> dict[str, ModelSource]:
    return {s.name: s for s in scan_repository(root)}


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    (tmp_path / "repo").mkdir()
    return tmp_path / "repo"


def test_layouts_and_policies(root: Path) -> None:
    _model(root, "default", ["1", "2", "10"])
    _model(root, "all", ["1", "2", "3"], "version_policy: {all: true}\n")
    _model(root, "latest", ["1", "2", "3"], "version_policy: {latest: 2}\n")
    _model(root, "specific", ["1", "2", "3"], "version_policy: {specific: [1, 3, 7]}\n")
    _model(root, "python", ["1"], artifact="model.py")
    llm = root / "llm" / "1"
    llm.mkdir(parents=True)
    (llm / "config.json").write_text("{}")
    sources = _by_name(root)
    assert [v.version for v in sources["default"].versions] == [10]
    assert [v.version for v in sources["all"].versions] == [1, 2, 3]
    assert [v.version for v in sources["latest"].versions] == [2, 3]
    assert [v.version for v in sources["specific"].versions] == [1, 3]
    assert sources["default"].backend == "onnxruntime"
    assert sources["default"].versions[0].artifact == root.resolve() / "default" / "10" / "model.onnx"
    assert sources["python"].backend == "python"
    assert sources["llm"].backend == "llm"
    assert sources["llm"].versions[0].artifact == root.resolve() / "llm" / "1"
    assert all(not s.problems for s in sources.values())


def test_ignored_entries(root: Path) -> None:
    directory = _model(root, "m", ["3"])
    for name in ("0", "01", "x", "1.5", "-1", "\u0661", "1" * 19):
        (directory / name).mkdir()
    (directory / "7").write_text("a file, not a directory")
    _model(root, ".hidden", ["1"])
    _model(root, "-bad", ["1"])
    (root / "README.md").write_text("not a model")
    sources = _by_name(root)
    assert list(sources) == ["m"]
    assert [v.version for v in sources["m"].versions] == [3]


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        ("max_batch_size: x\n", "key 'max_batch_size'"),
        ("bogus: 1\n", "key 'bogus': unknown key"),
        ("name: other\n", "key 'name' is 'other', expected the directory name"),
        ("version_policy: {specific: [9]}\n", "the version policy selects no version on disk"),
    ],
)
def test_problems_are_recorded_per_model(root: Path, config: str, problem: str) -> None:
    _model(root, "bad", ["1"], config)
    _model(root, "good", ["1"])
    sources = _by_name(root)
    assert not sources["good"].problems
    assert any(problem in p for p in sources["bad"].problems), sources["bad"].problems
    assert all(str(root) not in p for p in sources["bad"].problems)


def test_missing_artifact(root: Path) -> None:
    (root / "empty" / "1").mkdir(parents=True)
    _model(root, "partial", ["1", "2"])
    (root / "partial" / "2" / "model.onnx").unlink()
    sources = _by_name(root)
    assert "no version directory holds a model" in sources["empty"].problems[0]
    assert "model.onnx is missing" in sources["partial"].problems[0]


def test_symlink_escapes_are_refused(tmp_path: Path, root: Path) -> None:
    outside = tmp_path / "outside"
    _model(outside, "target", ["1"], "max_batch_size: 2\n")
    (root / "dir_link").symlink_to(outside / "target", target_is_directory=True)
    (root / "version_link").mkdir()
    (root / "version_link" / "1").symlink_to(outside / "target" / "1", target_is_directory=True)
    (root / "file_link" / "1").mkdir(parents=True)
    (root / "file_link" / "1" / "model.onnx").symlink_to(outside / "target" / "1" / "model.onnx")
    _model(root, "config_link", ["1"])
    (root / "config_link" / "config.yaml").symlink_to(outside / "target" / "config.yaml")
    (root / "dangling" / "1").mkdir(parents=True)
    (root / "dangling" / "1" / "model.onnx").symlink_to(tmp_path / "nowhere.onnx")
    _model(root, "inside", ["1"])
    (root / "alias").symlink_to(root / "inside", target_is_directory=True)
    sources = _by_name(root)
    for name in ("dir_link", "version_link", "file_link", "config_link"):
        assert sources[name].problems, name
        assert any("outside" in p for p in sources[name].problems), sources[name].problems
        assert all(str(tmp_path) not in p for p in sources[name].problems)
    assert sources["dangling"].problems
    assert not sources["dangling"].versions
    assert not sources["alias"].problems
    assert [v.version for v in sources["alias"].versions] == [1]
