"""The ONNX Runtime backend without a server: providers by device kind, specs, string tensors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tensorgate.backends.base import Device, LoadSpec
from tensorgate.backends.onnx_backend import OnnxBackend, providers_for
from tensorgate.config.model_config import ModelConfig
from tensorgate.errors import ModelLoadError
from tensorgate.types import DataType, TensorSpec


def _write(path: Path, elem: int, shape: list[object]) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", elem, shape)],
        [helper.make_tensor_value_info("y", elem, shape)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path


def _spec(path: Path, device: Device = Device()) -> LoadSpec:
    return LoadSpec("m", 1, path, path.parent, ModelConfig(), device)


def test_cpu_provider() -> None:
    assert providers_for(Device("cpu")) == ["CPUExecutionProvider"]


@pytest.mark.parametrize(("kind", "provider"), [("gpu", "CUDAExecutionProvider"), ("npu", "CANNExecutionProvider")])
def test_accelerator_providers(monkeypatch: pytest.MonkeyPatch, kind: str, provider: str) -> None:
    monkeypatch.setattr(ort, "get_available_providers", lambda: [provider, "CPUExecutionProvider"])
    assert providers_for(Device(kind, 2)) == [(provider, {"device_id": 2})]  # type: ignore[arg-type]


@pytest.mark.parametrize(("kind", "provider"), [("gpu", "CUDAExecutionProvider"), ("npu", "CANNExecutionProvider")])
def test_missing_provider_fails_without_fallback(monkeypatch: pytest.MonkeyPatch, kind: str, provider: str) -> None:
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    with pytest.raises(ModelLoadError, match=provider):
        providers_for(Device(kind, 0))  # type: ignore[arg-type]


def test_specs_come_from_the_model(tmp_path: Path) -> None:
    backend = OnnxBackend()
    backend.load(_spec(_write(tmp_path / "model.onnx", TensorProto.FLOAT16, ["batch", 3, None])))
    assert backend.inputs() == (TensorSpec("x", DataType.FP16, (-1, 3, -1)),)
    assert backend.outputs() == (TensorSpec("y", DataType.FP16, (-1, 3, -1)),)
    backend.close()


def test_string_tensors_are_bytes_both_ways(tmp_path: Path) -> None:
    backend = OnnxBackend()
    backend.load(_spec(_write(tmp_path / "model.onnx", TensorProto.STRING, ["batch"])))
    text = np.array([b"a", "\u00e9".encode(), b""], dtype=object)
    out = backend.execute({"x": text})["y"]
    assert out.dtype == object
    assert out.tolist() == text.tolist()


def test_load_errors_carry_no_absolute_path(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"not a model")
    with pytest.raises(ModelLoadError) as caught:
        OnnxBackend().load(_spec(path))
    assert "could not load model.onnx" in str(caught.value)
    assert str(tmp_path) not in str(caught.value)
    assert "m/1/model.onnx" in str(caught.value)


def test_one_session_per_backend(tmp_path: Path) -> None:
    path = _write(tmp_path / "model.onnx", TensorProto.FLOAT, ["batch", 2])
    first, second = OnnxBackend(), OnnxBackend()
    first.load(_spec(path))
    second.load(_spec(path))
    x = np.ones((1, 2), dtype=np.float32)
    np.testing.assert_array_equal(first.execute({"x": x})["y"], second.execute({"x": x})["y"])
    onnx.checker.check_model(str(path))


@pytest.mark.parametrize("spinning", [True, False])
def test_thread_options_reach_the_session(tmp_path: Path, spinning: bool) -> None:
    path = _write(tmp_path / "model.onnx", TensorProto.FLOAT, ["batch", 2])
    config = ModelConfig.model_validate({"onnxruntime": {"intra_op_threads": 1, "allow_spinning": spinning}})
    backend = OnnxBackend()
    backend.load(LoadSpec("m", 1, path, path.parent, config, Device()))
    session = backend._session
    assert session is not None
    options = session.get_session_options()
    assert options.intra_op_num_threads == 1
    if not spinning:  # spinning is onnxruntime's default: the entry is only written to turn it off
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    x = np.ones((2, 2), dtype=np.float32)
    np.testing.assert_array_equal(backend.execute({"x": x})["y"], x)
    backend.close()
