"""Models listed in the single-file server config (``models:`` with ``model_path``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorgate.config.loading import validate
from tensorgate.config.server_config import FlatModelEntry, ServerConfig
from tensorgate.errors import ConfigError
from tensorgate.repository.flat import from_flat_entries


def _entries(*models: dict[str, object]) -> list[FlatModelEntry]:
    return validate(ServerConfig, {"models": list(models)}, "server.yaml").models


def test_design_form(tmp_path: Path) -> None:
    [source] = from_flat_entries(
        _entries(
            {
                "name": "yolov8",
                "version": 1,
                "model_path": "/models/yolov8/1/model.onnx",
                "input_shape": [1, 3, 640, 640],
                "dynamic_batching": {"max_batch_size": 8, "max_delay_ms": 5},
                "device_id": 0,
            }
        ),
        tmp_path,
        "server.yaml",
    )
    assert source.name == "yolov8"
    assert source.backend == "onnxruntime"
    assert source.request_input_shape == (1, 3, 640, 640)
    assert source.device_id == 0
    assert source.config.max_batch_size == 8
    assert source.config.dynamic_batching is not None
    assert source.config.dynamic_batching.max_queue_delay_ms == 5
    [group] = source.config.instance_group
    assert (group.count, group.kind, group.devices) == (1, "cpu", [0])
    [version] = source.versions
    assert version.version == 1
    assert version.artifact == Path("/models/yolov8/1/model.onnx")


def test_versions_group_by_name_and_paths_are_relative_to_the_file(tmp_path: Path) -> None:
    sources = from_flat_entries(
        _entries(
            {"name": "m", "version": 2, "model_path": "v2.onnx"},
            {"name": "m", "version": 1, "model_path": "sub/v1.onnx"},
            {"name": "n", "model_path": "n.onnx"},
        ),
        tmp_path,
        "server.yaml",
    )
    by_name = {s.name: s for s in sources}
    assert [v.version for v in by_name["m"].versions] == [1, 2]
    assert by_name["m"].versions[0].artifact == tmp_path / "sub" / "v1.onnx"
    assert by_name["n"].config.dynamic_batching is None


def test_om_models_get_the_om_backend(tmp_path: Path) -> None:
    [source] = from_flat_entries(_entries({"name": "m", "model_path": "m.om"}), tmp_path, "server.yaml")
    assert source.backend == "om"


@pytest.mark.parametrize(
    ("models", "message"),
    [
        ([{"name": "..", "model_path": "a.onnx"}], "key 'models.0.name'"),
        ([{"name": "ok", "model_path": "a.onnx"}, {"name": "a/b", "model_path": "a.onnx"}], "key 'models.1.name'"),
        ([{"name": "m", "model_path": "a.onnx"}, {"name": "m", "model_path": "b.onnx"}], "lists a version twice"),
    ],
)
def test_errors(tmp_path: Path, models: list[dict[str, object]], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        from_flat_entries(_entries(*models), tmp_path, "server.yaml")
    assert str(caught.value).startswith("server.yaml: ")
    assert message in str(caught.value)
