"""Per-model config.yaml: schema, defaults, and messages that name the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorgate.config.loading import load_file, validate
from tensorgate.config.model_config import DEFAULT_MAX_QUEUE_SIZE, ModelConfig, VersionPolicy
from tensorgate.errors import ConfigError
from tensorgate.models.specs import resolve_specs
from tensorgate.types import DataType, TensorSpec


def test_everything_is_optional() -> None:
    config = validate(ModelConfig, None, "m/config.yaml")
    assert config.backend is None
    assert config.max_batch_size is None
    assert config.inputs is None
    assert len(config.instance_group) == 1
    assert config.instance_group[0].kind == "cpu"
    assert config.version_policy == VersionPolicy()


def test_full_config(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        """
backend: onnxruntime
max_batch_size: 32
inputs: [{name: x, datatype: FP32, shape: [-1, 3, 224, 224]}]
outputs: [{name: y, datatype: FP32, shape: [-1, 1000]}]
dynamic_batching: {max_queue_delay_ms: 2, preferred_batch_sizes: [8, 16], priority_levels: 2, default_priority: 2}
instance_group: [{count: 2, kind: gpu, devices: [0, 1]}]
version_policy: {latest: 2}
"""
    )
    config = load_file(ModelConfig, path)
    assert config.inputs is not None and config.inputs[0].shape == [-1, 3, 224, 224]
    assert config.dynamic_batching is not None
    assert config.dynamic_batching.max_queue_size == DEFAULT_MAX_QUEUE_SIZE
    assert config.dynamic_batching.adaptive_delay  # on unless switched off
    assert config.instance_group[0].devices == [0, 1]
    assert config.version_policy.latest == 2


def test_the_delay_window_can_be_made_unconditional() -> None:
    spec = (TensorSpec("x", DataType.FP32, (-1, 2)),)
    for batching, adaptive in (({}, True), ({"adaptive_delay": False}, False)):
        config = validate(ModelConfig, {"dynamic_batching": batching}, "m/config.yaml")
        assert resolve_specs("m", spec, spec, config).batch.adaptive_delay is adaptive


@pytest.mark.parametrize(
    ("config", "request_rows", "batch_rows"),
    [
        ({"max_batch_size": 8, "dynamic_batching": {}}, 8, 8),
        ({"dynamic_batching": {"max_batch_size": 16}}, 16, 16),  # the form: one limit for both
        ({"max_batch_size": 8, "dynamic_batching": {"max_batch_size": 2}}, 8, 2),  # requests of 8, batches of 2
        ({"max_batch_size": 8, "dynamic_batching": {"max_batch_size": 2, "preferred_batch_sizes": [2, 4]}}, 8, 2),
    ],
)
def test_batch_limits(config: dict[str, object], request_rows: int, batch_rows: int) -> None:
    spec = (TensorSpec("x", DataType.FP32, (-1, 2)),)
    resolved = resolve_specs("m", spec, spec, validate(ModelConfig, config, "m/config.yaml"))
    assert resolved.max_batch_size == request_rows
    assert resolved.batch.max_rows == batch_rows
    assert all(size <= batch_rows for size in resolved.batch.preferred_rows)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("max_batch_size: -1", "key 'max_batch_size': Input should be greater than or equal to 0"),
        ("max_batchsize: 4", "key 'max_batchsize': unknown key"),
        ("backend: tensorflow", "key 'backend': Input should be 'onnxruntime', 'python', 'torch', 'llm' or 'pipeline'"),
        ("inputs: [{name: x, datatype: FP32, shape: [-2]}]", "key 'inputs.0.shape': Value error, dimensions"),
        ("inputs: [{name: x, shape: [1]}]", "key 'inputs.0.datatype': Field required"),
        ("instance_group: [{kind: tpu}]", "key 'instance_group.0.kind': Input should be 'cpu', 'gpu' or 'npu'"),
        ("instance_group: [{count: 0}]", "key 'instance_group.0.count'"),
        ("version_policy: {latest: 1, all: true}", "choose one of latest, all, specific"),
        ("version_policy: {specific: [0]}", "versions are positive integers"),
        ("version_policy: {latest: 0}", "key 'version_policy.latest'"),
        ("dynamic_batching: {priority_levels: 2, default_priority: 3}", "default_priority 3 is above"),
        ("dynamic_batching: {preferred_batch_sizes: [0]}", "preferred_batch_sizes must be positive"),
        ("dynamic_batching: {max_queue_size: 0}", "key 'dynamic_batching.max_queue_size'"),
        ("warmup: [{inputs: file}]", "needs a 'file' key"),
        (
            "max_batch_size: 4\ndynamic_batching: {max_batch_size: 8}",
            "dynamic_batching.max_batch_size 8 is above max_batch_size 4",
        ),
        ("- a\n- b", "expected a mapping at the top level"),
        ("max_batch_size: [1", "not valid YAML"),
        ("!!python/object/apply:os.system ['true']", "not valid YAML"),
    ],
)
def test_errors_name_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_file(ModelConfig, path)
    assert str(caught.value).startswith(f"{path}: ")
    assert message in str(caught.value)


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the file"):
        load_file(ModelConfig, tmp_path / "missing.yaml")


def _pipeline(steps: list[dict[str, object]], outputs: list[str]) -> dict[str, object]:
    tensor = {"datatype": "FP32", "shape": [-1, 4]}
    return {
        "backend": "pipeline",
        "inputs": [{"name": "x", **tensor}],
        "outputs": [{"name": name, **tensor} for name in outputs],
        "steps": steps,
    }


def test_a_pipeline_graph_is_checked_at_load() -> None:
    step = {"model": "a", "inputs": {"INPUT": "x"}, "outputs": {"OUTPUT": "y"}}
    ModelConfig.model_validate(_pipeline([step, {**step, "inputs": {"INPUT": "y"}, "outputs": {"OUTPUT": "z"}}], ["z"]))
    with pytest.raises(ValueError, match="reads 'nope', which is neither a pipeline input"):
        ModelConfig.model_validate(_pipeline([{**step, "inputs": {"INPUT": "nope"}}], ["y"]))
    with pytest.raises(ValueError, match="no step produces the pipeline output"):
        ModelConfig.model_validate(_pipeline([step], ["missing"]))
    with pytest.raises(ValueError, match="reads 'later'"):
        ModelConfig.model_validate(_pipeline([{**step, "when": {"input": "later", "equals": 1}}], ["y"]))
    with pytest.raises(ValueError, match="steps are for backend: pipeline"):
        ModelConfig.model_validate({"steps": [step]})
