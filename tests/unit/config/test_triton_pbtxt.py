"""Triton's config.pbtxt read into tensorgate's configuration: the text format, the mapping, refusals."""

from __future__ import annotations

import pytest

from tensorgate.config.loading import validate
from tensorgate.config.model_config import ModelConfig
from tensorgate.config.triton_pbtxt import parse_text_proto, triton_config
from tensorgate.errors import ConfigError

SIMPLE = """
# Triton's docs/examples/model_repository/simple/config.pbtxt
name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "OUTPUT1", data_type: TYPE_INT32, dims: [ 16 ] }
]
"""


def _config(text: str) -> ModelConfig:
    return validate(ModelConfig, triton_config(text, "m/config.pbtxt"), "m/config.pbtxt")


def test_the_text_format() -> None:
    message = parse_text_proto(
        'a: 1 b: -2.5e3 c: "x\\ty\\101\\x42" d: TYPE_FP32 e: True f { g: [1, 2] g: 3 } h < i: "j" "k" >;'
        "l [ { m: 1 }, { m: 2 } ] # a comment\n n: inf"
    )
    assert message["a"] == [1] and message["b"] == [-2500.0] and message["c"] == ["x\tyAB"]
    assert message["d"] == ["TYPE_FP32"] and message["e"] == [True]
    assert message["f"] == [{"g": [1, 2, 3]}] and message["h"] == [{"i": ["jk"]}]
    assert message["l"] == [{"m": [1]}, {"m": [2]}] and message["n"] == [float("inf")]


@pytest.mark.parametrize("text", ['name: "x', "input [ { name: 1 ", "a: }", "a b c"])
def test_malformed_text_is_refused_saying_where(text: str) -> None:
    with pytest.raises(ConfigError, match="not a text-format model configuration"):
        triton_config(text, "m/config.pbtxt")


def test_tritons_simple_example() -> None:
    config = _config(SIMPLE)
    assert config.name == "simple" and config.backend == "onnxruntime" and config.max_batch_size == 8
    assert [(t.name, t.datatype, t.shape) for t in config.inputs or []] == [
        ("INPUT0", "INT32", [-1, 16]),
        ("INPUT1", "INT32", [-1, 16]),
    ]
    assert [t.name for t in config.outputs or []] == ["OUTPUT0", "OUTPUT1"]
    assert config.dynamic_batching is None  # Triton runs each request alone unless dynamic_batching is set


def test_strings_identity_and_no_batch_dimension() -> None:
    config = _config(
        'name: "simple_identity" backend: "python" max_batch_size: 0 '
        'input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ] '
        'output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]'
    )
    assert config.backend == "python" and config.max_batch_size == 0
    assert (config.inputs or [])[0].datatype == "BYTES" and (config.inputs or [])[0].shape == [-1]


def test_batching_queue_instances_versions_warmup_parameters() -> None:
    config = _config(
        SIMPLE
        + """
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 5000
  priority_levels: 2
  default_priority_level: 2
  default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 250000 max_queue_size: 64 }
}
instance_group [ { count: 2 kind: KIND_CPU }, { kind: KIND_GPU gpus: [ 0, 1 ] } ]
version_policy: { latest: { num_versions: 2 } }
model_warmup [ { name: "z" batch_size: 4 count: 3
  inputs { key: "INPUT0" value: { data_type: TYPE_INT32 dims: [ 16 ] zero_data: true } } } ]
parameters { key: "threshold" value: { string_value: "0.5" } }
parameters: [ { key: "mode" value: { string_value: "fast" } } ]
response_cache { enable: true }
"""
    )
    batching = config.dynamic_batching
    assert batching is not None
    assert batching.preferred_batch_sizes == [4, 8] and batching.max_queue_delay_ms == 5.0
    assert not batching.adaptive_delay  # Triton's window is waited out as written
    assert (batching.priority_levels, batching.default_priority) == (2, 2)
    assert (batching.default_timeout_ms, batching.max_queue_size) == (250.0, 64)
    assert [(g.count, g.kind, g.devices) for g in config.instance_group] == [(2, "cpu", []), (1, "gpu", [0, 1])]
    assert config.version_policy.latest == 2
    assert [(w.name, w.inputs, w.batch_size, w.count) for w in config.warmup] == [("z", "zeros", 4, 3)]
    assert config.parameters == {"threshold": "0.5", "mode": "fast"}
    assert config.response_cache.enable


def test_an_ensemble_is_a_pipeline() -> None:
    config = _config(
        'name: "ens" platform: "ensemble" max_batch_size: 8 '
        'input [ { name: "RAW" data_type: TYPE_UINT8 dims: [ -1 ] } ] '
        'output [ { name: "PROB" data_type: TYPE_FP32 dims: [ 10 ] } ] '
        "ensemble_scheduling { step [ "
        '{ model_name: "pre" model_version: -1 input_map { key: "IN" value: "RAW" } '
        'output_map { key: "OUT" value: "img" } },'
        '{ model_name: "net" model_version: 2 input_map { key: "x" value: "img" } '
        'output_map { key: "y" value: "PROB" } }'
        " ] }"
    )
    assert config.backend == "pipeline"
    steps = config.steps or []
    assert [(s.model, s.version, s.inputs, s.outputs) for s in steps] == [
        ("pre", None, {"IN": "RAW"}, {"OUT": "img"}),
        ("net", 2, {"x": "img"}, {"y": "PROB"}),
    ]


def test_every_key_not_applied_is_named_at_once() -> None:
    text = (
        SIMPLE
        + "optimization { graph { level: 1 } } model_transaction_policy { decoupled: True other: 1 } "
        + "dynamic_batching { priority_queue_policy { key: 1 value: { max_queue_size: 4 } } } "
        + 'instance_group [ { kind: KIND_MODEL host_policy: "x" } ] '
        + 'input [ { name: "IMG" data_type: TYPE_FP32 dims: [ 3 ] format: FORMAT_NCHW reshape: { shape: [ 3 ] } } ]'
    )
    with pytest.raises(ConfigError) as caught:
        triton_config(text, "m/config.pbtxt")
    message = str(caught.value)
    for key in (
        "optimization",
        "model_transaction_policy.other",
        "dynamic_batching.priority_queue_policy",
        "instance_group[0].kind KIND_MODEL",
        "instance_group[0].host_policy",
        "input[2].reshape",
        "input[2].format",
    ):
        assert key in message, key
    assert message.startswith("m/config.pbtxt: tensorgate does not apply")


def test_unknown_platform_and_duplicate_scalars() -> None:
    with pytest.raises(ConfigError, match="platform 'tensorflow_graphdef' is not one tensorgate serves"):
        triton_config('name: "x" platform: "tensorflow_graphdef"', "m/config.pbtxt")
    with pytest.raises(ConfigError, match="max_batch_size is given 2 times"):
        triton_config("max_batch_size: 1 max_batch_size: 2", "m/config.pbtxt")


REPEAT = """
# python_backend's examples/decoupled/repeat_config.pbtxt
name: "repeat_int32"
backend: "python"
max_batch_size: 0
model_transaction_policy {
  decoupled: True
}
input [
  { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
  { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] }
]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }
]
"""


def test_a_decoupled_model_is_applied() -> None:
    config = _config(REPEAT)
    assert config.model_transaction_policy.decoupled
    assert not _config(SIMPLE).model_transaction_policy.decoupled
    assert not _config(REPEAT.replace("True", "false")).model_transaction_policy.decoupled


def test_a_transaction_policy_that_is_not_a_flag_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"model_transaction_policy\.decoupled 'maybe' is not true or false"):
        triton_config(REPEAT.replace("True", '"maybe"'), "m/config.pbtxt")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('platform: "onnxruntime_onnx"', "decoupled is for Python models"),
        ("response_cache { enable: true }", "response_cache cannot be enabled for a decoupled model"),
    ],
)
def test_decoupled_needs_a_python_model_without_a_cache(extra: str, message: str) -> None:
    text = REPEAT.replace('backend: "python"', "") + extra
    with pytest.raises(ConfigError, match=message):
        _config(text)
