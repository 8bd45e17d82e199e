"""``backend: python``: loading model.py, its refusals, the declared outputs, and unload."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tensorgate.backends.base import Device, LoadSpec
from tensorgate.backends.python_backend import PythonBackend
from tensorgate.backends.python_model import ModelError
from tensorgate.config.model_config import ModelConfig
from tensorgate.errors import ModelLoadError

HEADER = "import numpy as np\nfrom tensorgate import PythonModel\n\n"
TENSORS = {
    "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [-1, 2]}],
    "outputs": [
        {"name": "OUTPUT", "datatype": "FP32", "shape": [-1, 2]},
        {"name": "LABEL", "datatype": "BYTES", "shape": [-1]},
    ],
}


def _load(tmp_path: Path, code: str, **config: object) -> PythonBackend:
    version = tmp_path / "scorer" / "1"
    version.mkdir(parents=True, exist_ok=True)
    artifact = version / "model.py"
    artifact.write_text(HEADER + code)
    spec = LoadSpec("scorer", 1, artifact, version, ModelConfig(backend="python", **{**TENSORS, **config}), Device())
    backend = PythonBackend()
    backend.load(spec)
    return backend


GOOD = """
class Scorer(PythonModel):
    def load(self, context):
        self.scale = float(context.parameters.get("scale", 1.0))
        self.log = context.directory / "unloaded"

    def execute(self, inputs):
        x = inputs["INPUT"]
        return {"OUTPUT": x * self.scale, "LABEL": np.array([b"row"] * len(x), dtype=object), "EXTRA": x}

    def unload(self):
        self.log.write_text("yes")
"""


def test_a_model_runs_with_its_parameters_and_unloads(tmp_path: Path) -> None:
    backend = _load(tmp_path, GOOD, parameters={"scale": 3})
    outputs = backend.execute({"INPUT": np.ones((2, 2), np.float32)})
    assert set(outputs) == {"OUTPUT", "LABEL"}  # only declared outputs leave the backend
    assert outputs["OUTPUT"].dtype == np.float32 and outputs["OUTPUT"].tolist() == [[3, 3], [3, 3]]
    backend.close()
    assert (tmp_path / "scorer" / "1" / "unloaded").read_text() == "yes"


REUSING = """
class Reusing(PythonModel):
    def load(self, context):
        self.out = np.zeros((8, 2), np.float32)
        self.labels = np.empty(8, dtype=object)

    def execute(self, inputs):
        x = inputs["INPUT"]
        self.labels[: len(x)] = [str(v).encode() for v in x[:, 0]]
        return {"OUTPUT": np.add(x, 1, out=self.out[: len(x)]), "LABEL": self.labels[: len(x)]}
"""


def test_answers_survive_a_model_that_reuses_its_output_buffers(tmp_path: Path) -> None:
    """The next batch may run while this one's answers are still being encoded: they are copies."""
    backend = _load(tmp_path, REUSING)
    first = backend.execute({"INPUT": np.full((2, 2), 1.0, np.float32)})
    backend.execute({"INPUT": np.full((2, 2), 5.0, np.float32)})
    assert first["OUTPUT"].tolist() == [[2.0, 2.0], [2.0, 2.0]]
    assert first["LABEL"].tolist() == [b"1.0", b"1.0"]


def test_numbers_of_a_wider_type_are_cast_to_the_declared_one(tmp_path: Path) -> None:
    code = """
class Scorer(PythonModel):
    def execute(self, inputs):
        n = len(inputs["INPUT"])
        return {"OUTPUT": np.zeros((n, 2), np.float64) + 0.5, "LABEL": np.array(["a"] * n)}
"""
    outputs = _load(tmp_path, code).execute({"INPUT": np.ones((1, 2), np.float32)})
    assert outputs["OUTPUT"].dtype == np.float32 and outputs["OUTPUT"].tolist() == [[0.5, 0.5]]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('return {"LABEL": np.array([b"x"])}', "execute returned no output 'OUTPUT' (it returned ['LABEL'])"),
        (
            'return {"OUTPUT": np.array([["a", "b"]]), "LABEL": np.array([b"x"])}',
            "declared FP32 but execute returned <U1",
        ),
        (
            'return {"OUTPUT": np.zeros((1, 2), np.float32), "LABEL": np.zeros(1)}',
            "declared BYTES but execute returned float64",
        ),
        ("return [1, 2]", "execute returned list, not a dict of output arrays"),
    ],
)
def test_outputs_that_break_the_declaration_fail_with_a_message_naming_them(
    tmp_path: Path, body: str, message: str
) -> None:
    code = f"\nclass Scorer(PythonModel):\n    def execute(self, inputs):\n        {body}\n"
    backend = _load(tmp_path, code)
    with pytest.raises(ModelError) as raised:
        backend.execute({"INPUT": np.ones((1, 2), np.float32)})
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (
            "x = 1\n",
            "must define exactly one tensorgate.PythonModel subclass (or a Triton TritonPythonModel class), found 0",
        ),
        ("class A(PythonModel):\n    pass\n\nclass B(PythonModel):\n    pass\n", "found 2"),
        ("raise ImportError('no such wheel')\n", "model.py raised on import: ImportError: no such wheel"),
        (
            "class A(PythonModel):\n    def load(self, context):\n        raise RuntimeError('weights missing')\n",
            "A.load raised RuntimeError: weights missing",
        ),
    ],
)
def test_a_model_py_that_cannot_load_fails_with_the_reason(tmp_path: Path, code: str, message: str) -> None:
    with pytest.raises(ModelLoadError) as raised:
        _load(tmp_path, code)
    assert message in str(raised.value)


def test_a_python_model_must_declare_its_tensors(tmp_path: Path) -> None:
    version = tmp_path / "bare" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(HEADER + GOOD)
    spec = LoadSpec("bare", 1, version / "model.py", version, ModelConfig(backend="python"), Device())
    with pytest.raises(ModelLoadError, match=r"declares its inputs in config\.yaml; bare has none"):
        PythonBackend().load(spec)


class Sink:
    """What an instance hands the backend for one request of a decoupled model: records what it gets."""

    def __init__(self) -> None:
        self.sent: list[tuple[object, str | None, bool]] = []
        self.cancelled = False

    def send(self, outputs: object, error: str | None, final: bool) -> None:
        self.sent.append((outputs, error, final))

    def is_cancelled(self) -> bool:
        return self.cancelled


DECOUPLED = """
class Scorer(PythonModel):
    def execute_decoupled(self, inputs, sender):
        x = inputs["INPUT"]
        if sender.is_cancelled():
            sender.send(error="cancelled before it began", final=True)
            return
        sender.send({"OUTPUT": x.astype(np.float64)})
        sender.send({"LABEL": np.array([b"a"], dtype=object)}, final=True)
        try:
            sender.send({"OUTPUT": x})
        except RuntimeError as exc:
            self.after = str(exc)
        if x[0, 0] < 0:
            raise ValueError("negative")
"""


def test_a_decoupled_python_model_answers_each_request_through_its_sink(tmp_path: Path) -> None:
    backend = _load(tmp_path, DECOUPLED, model_transaction_policy={"decoupled": True})
    sinks = [Sink(), Sink()]
    sinks[1].cancelled = True
    backend.execute_decoupled([{"INPUT": np.ones((1, 2), np.float32)}] * 2, sinks)
    (outputs, error, final), (labels, _, last) = sinks[0].sent
    assert outputs["OUTPUT"].dtype == np.float32 and error is None and not final  # type: ignore[index]
    assert list(labels) == ["LABEL"] and last  # type: ignore[call-overload]  # a response may carry some outputs
    assert sinks[1].sent == [(None, "cancelled before it began", True)]


def test_a_decoupled_model_that_raises_has_its_senders_closed(tmp_path: Path) -> None:
    backend = _load(tmp_path, DECOUPLED, model_transaction_policy={"decoupled": True})
    with pytest.raises(ValueError, match="negative"):
        backend.execute_decoupled([{"INPUT": -np.ones((1, 2), np.float32)}], [Sink()])


def test_a_decoupled_configuration_needs_execute_decoupled(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not implement execute_decoupled"):
        _load(tmp_path, GOOD, model_transaction_policy={"decoupled": True})


@pytest.mark.parametrize(
    ("response", "message"),
    [
        ('{"NOPE": np.ones(1)}', r"carries output\(s\) \['NOPE'\] that the model does not declare"),
        ('{"OUTPUT": np.array(["x"])}', "output 'OUTPUT' is declared FP32"),
    ],
)
def test_a_response_is_checked_against_the_declared_outputs(tmp_path: Path, response: str, message: str) -> None:
    code = "class Scorer(PythonModel):\n    def execute_decoupled(self, inputs, sender):\n"
    code += f"        sender.send({response})\n"
    backend = _load(tmp_path, code, model_transaction_policy={"decoupled": True})
    with pytest.raises(ModelError, match=message):
        backend.execute_decoupled([{"INPUT": np.ones((1, 2), np.float32)}], [Sink()])
