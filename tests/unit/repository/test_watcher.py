"""The repository watcher's settle rule, driven scan by scan (no clock: each ``poll`` is one scan)."""

from __future__ import annotations

import os
from pathlib import Path

from tensorgate.repository.watcher import RepositoryWatcher, fingerprint_repository

CONFIG = (
    "backend: python\n"
    "inputs: [{name: x, datatype: FP32, shape: [-1, 1]}]\n"
    "outputs: [{name: y, datatype: FP32, shape: [-1, 1]}]\n"
)


def _model(root: Path, name: str, *versions: int) -> Path:
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "config.yaml").write_text(CONFIG)
    for version in versions:
        (root / name / str(version)).mkdir(exist_ok=True)
        (root / name / str(version) / "model.py").write_text(f"# version {version}\n")
    return root / name


def _watcher(root: Path) -> RepositoryWatcher:
    return RepositoryWatcher(root, fingerprint_repository(root))


def test_nothing_changed_nothing_reported(tmp_path: Path) -> None:
    _model(tmp_path, "m", 1)
    watcher = _watcher(tmp_path)
    assert watcher.poll() == [] and watcher.poll() == []


def test_a_new_version_is_reported_once_two_scans_agree_and_only_once(tmp_path: Path) -> None:
    model = _model(tmp_path, "m", 1)
    watcher = _watcher(tmp_path)
    (model / "2").mkdir()
    (model / "2" / "model.py").write_text("# version 2\n")
    assert watcher.poll() == []  # seen once: it may still be being written
    [change] = watcher.poll()
    assert change.name == "m" and change.source is not None
    assert [v.version for v in change.source.on_disk] == [1, 2]
    assert all(v.revision for v in change.source.on_disk)
    assert watcher.poll() == []


def test_a_file_that_keeps_growing_is_never_reported_until_it_stops(tmp_path: Path) -> None:
    model = _model(tmp_path, "m", 1)
    watcher = _watcher(tmp_path)
    (model / "2").mkdir()
    with open(model / "2" / "model.onnx", "wb") as out:
        for _ in range(20):
            out.write(b"x" * 4096)
            out.flush()
            assert watcher.poll() == []  # its size moved since the last scan
    # The loop's last scan saw it complete; the next one agrees, and only then is it reported.
    assert [c.name for c in watcher.poll()] == ["m"]


def test_a_file_rewritten_in_place_with_the_same_size_is_a_change(tmp_path: Path) -> None:
    model = _model(tmp_path, "m", 1)
    watcher = _watcher(tmp_path)
    path = model / "1" / "model.py"
    before = path.stat()
    path.write_text("# version 9\n")  # same length
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))
    watcher.poll()
    [change] = watcher.poll()
    assert change.source is not None and change.source.on_disk[0].revision


def test_config_edits_and_new_models_are_reported_per_model(tmp_path: Path) -> None:
    model = _model(tmp_path, "m", 1)
    _model(tmp_path, "other", 1)
    watcher = _watcher(tmp_path)
    (model / "config.yaml").write_text(CONFIG + "max_batch_size: 4\n")
    _model(tmp_path, "new", 1)
    watcher.poll()
    assert sorted(c.name for c in watcher.poll()) == ["m", "new"]


def test_a_removed_model_is_reported_with_no_source(tmp_path: Path) -> None:
    model = _model(tmp_path, "m", 1)
    watcher = _watcher(tmp_path)
    for path in sorted(model.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    model.rmdir()
    assert watcher.poll() == []
    [change] = watcher.poll()
    assert change.name == "m" and change.source is None
    assert watcher.poll() == []
