"""The server config file and the single-file model form (DESIGN §4)."""

from __future__ import annotations

import pytest

from tensorgate.config.loading import validate
from tensorgate.config.server_config import DEFAULT_MAX_BODY_BYTES, ServerConfig
from tensorgate.errors import ConfigError

DESIGN_FORM = {
    "server": {"http_port": 8080, "grpc_port": 8081, "metrics_port": 9090},
    "models": [
        {
            "name": "yolov8",
            "version": 1,
            "model_path": "/models/yolov8/1/model.onnx",
            "input_shape": [1, 3, 640, 640],
            "dynamic_batching": {"max_batch_size": 8, "max_delay_ms": 5},
            "device_id": 0,
        }
    ],
}


def test_design_form_validates_as_written() -> None:
    config = validate(ServerConfig, DESIGN_FORM, "server.yaml")
    assert config.server.metrics_port == 9090
    assert config.server.max_body_bytes == DEFAULT_MAX_BODY_BYTES == 64 * 1024 * 1024
    [entry] = config.models
    assert entry.input_shape == [1, 3, 640, 640]
    assert entry.device_id == 0
    assert entry.dynamic_batching is not None
    batching = entry.dynamic_batching.to_dynamic_batching()
    assert batching.max_batch_size == 8
    assert batching.max_queue_delay_ms == 5


def test_defaults_bind_loopback() -> None:
    config = validate(ServerConfig, {}, "server.yaml")
    assert config.server.host == "127.0.0.1"
    assert config.models == []


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"server": {"http_prot": 1}}, "key 'server.http_prot': unknown key"),
        ({"server": {"http_port": 70000}}, "key 'server.http_port'"),
        ({"server": {"max_body_bytes": 10}}, "key 'server.max_body_bytes'"),
        ({"models": [{"name": "m"}]}, "key 'models.0.model_path': Field required"),
        ({"models": [{"name": "m", "model_path": "m.onnx", "version": 0}]}, "key 'models.0.version'"),
        (
            {"models": [{"name": "m", "model_path": "m.onnx", "dynamic_batching": {"max_delay_ms": -1}}]},
            "key 'models.0.dynamic_batching.max_delay_ms'",
        ),
        ({"models": [{"name": "m", "model_path": "m.onnx", "device_id": -1}]}, "key 'models.0.device_id'"),
        ({"modles": []}, "key 'modles': unknown key"),
    ],
)
def test_errors(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        validate(ServerConfig, data, "/etc/tg/server.yaml")
    assert str(caught.value).startswith("/etc/tg/server.yaml: ")
    assert message in str(caught.value)
