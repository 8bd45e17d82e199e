"""Build the example models with ``onnx.helper`` and a fixed seed, so every machine gets the same bytes.

- ``mlp``: a tabular classifier, ``features`` FP32 [-1, 16] -> ``probabilities`` FP32 [-1, 3].
- ``cnn``: a small image classifier, ``image`` FP32 [-1, 3, 32, 32] -> ``probabilities`` FP32 [-1, 10].
- ``classify``: a pipeline over ``cnn`` with a Python step on each side (raw pixels in, top 3 out).
- ``recognizer``: a streaming speech recognizer, a pipeline of three sequence models
  (:mod:`tensorgate.examples.recognizer`): 16 kHz PCM chunks in, the partial transcript out.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tensorgate.examples.recognizer import repository as recognizer

SEED = 7
OPSET = 17

MLP_CONFIG = """\
# A tabular classifier: 16 features -> 3 class probabilities.
max_batch_size: 64
dynamic_batching:
  max_queue_delay_ms: 2
  max_queue_size: 1024
instance_group:
  - count: 1
    kind: cpu
warmup:
  - name: zeros
    inputs: zeros
    batch_size: 1
    count: 2
"""

CNN_CONFIG = """\
# A small image classifier: 3x32x32 images -> 10 class probabilities.
max_batch_size: 16
dynamic_batching:
  max_queue_delay_ms: 5
instance_group:
  - count: 1
    kind: cpu
warmup:
  - name: random
    inputs: random
    batch_size: 4
    count: 2
"""


def _init(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
    values = (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)
    return numpy_helper.from_array(values, name)


def mlp_model(in_features: int = 16, hidden: int = 64, classes: int = 3, seed: int = SEED) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits = [
        _init(rng, "w1", (in_features, hidden)),
        _init(rng, "b1", (hidden,)),
        _init(rng, "w2", (hidden, classes)),
        _init(rng, "b2", (classes,)),
    ]
    nodes = [
        helper.make_node("Gemm", ["features", "w1", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["a1"]),
        helper.make_node("Gemm", ["a1", "w2", "b2"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", in_features])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", classes])],
        inits,
    )
    return _finish(graph)


def cnn_model(size: int = 32, classes: int = 10, seed: int = SEED) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits = [
        _init(rng, "c1w", (8, 3, 3, 3)),
        _init(rng, "c1b", (8,)),
        _init(rng, "c2w", (16, 8, 3, 3)),
        _init(rng, "c2b", (16,)),
        _init(rng, "fw", (16, classes)),
        _init(rng, "fb", (classes,)),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "c1w", "c1b"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "c2w", "c2b"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "fw", "fb"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, size, size])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", classes])],
        inits,
    )
    return _finish(graph)


# The image pipeline: raw uint8 pixels (HWC) -> normalized FP32 (CHW) -> cnn -> the top 3 classes.
PREPROCESS_CONFIG = """\
# Pipeline step 1: uint8 images as cameras give them, [N, 32, 32, 3], to the cnn's FP32 [N, 3, 32, 32].
backend: python
max_batch_size: 16
dynamic_batching: {max_queue_delay_ms: 2}
inputs: [{name: image, datatype: UINT8, shape: [-1, 32, 32, 3]}]
outputs: [{name: pixels, datatype: FP32, shape: [-1, 3, 32, 32]}]
"""
PREPROCESS_MODEL = """\
import numpy as np

from tensorgate import PythonModel

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(1, 3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(1, 3, 1, 1)


class Preprocess(PythonModel):
    def execute(self, inputs):
        chw = inputs["image"].astype(np.float32).transpose(0, 3, 1, 2) / 255.0
        return {"pixels": np.ascontiguousarray((chw - MEAN) / STD, dtype=np.float32)}
"""
TOPK_CONFIG = """\
# Pipeline step 3: class probabilities to the three likeliest classes and their scores.
backend: python
max_batch_size: 16
dynamic_batching: {max_queue_delay_ms: 2}
inputs: [{name: probabilities, datatype: FP32, shape: [-1, 10]}]
outputs:
  - {name: classes, datatype: INT64, shape: [-1, 3]}
  - {name: scores, datatype: FP32, shape: [-1, 3]}
"""
TOPK_MODEL = """\
import numpy as np

from tensorgate import PythonModel


class TopK(PythonModel):
    def execute(self, inputs):
        probabilities = inputs["probabilities"]
        classes = np.argsort(-probabilities, axis=1, kind="stable")[:, :3]
        return {"classes": classes.astype(np.int64), "scores": np.take_along_axis(probabilities, classes, axis=1)}
"""
CLASSIFY_CONFIG = """\
# A pipeline (Triton's ensembles): each step is a model of this repository, batched by its own scheduler.
backend: pipeline
inputs: [{name: image, datatype: UINT8, shape: [-1, 32, 32, 3]}]
outputs:
  - {name: classes, datatype: INT64, shape: [-1, 3]}
  - {name: scores, datatype: FP32, shape: [-1, 3]}
steps:
  - {model: preprocess, inputs: {image: image}, outputs: {pixels: pixels}}
  - {model: cnn, inputs: {image: pixels}, outputs: {probabilities: probabilities}}
  - {model: topk, inputs: {probabilities: probabilities}, outputs: {classes: classes, scores: scores}}
"""

# A decoupled model: COUNT responses per request, streamed from a thread of its own (docs/model-repository.md).
COUNTDOWN_CONFIG = """\
backend: python
max_batch_size: 0
model_transaction_policy: {decoupled: true}
inputs:
  - {name: COUNT, datatype: INT32, shape: [1]}
outputs:
  - {name: VALUE, datatype: INT32, shape: [1]}
"""
COUNTDOWN_MODEL = """\
import threading

import numpy as np
from tensorgate import PythonModel


class Countdown(PythonModel):
    def execute_decoupled(self, inputs, sender):  # one request: answer through its sender
        count = int(inputs["COUNT"][0])
        threading.Thread(target=self.stream, args=(sender, count), daemon=True).start()

    def stream(self, sender, count):  # after execute_decoupled returned: the instance serves others
        for i in range(count):
            if sender.is_cancelled():  # the client went away, or the deadline passed
                break
            sender.send({"VALUE": np.array([i], np.int32)})
        sender.send(final=True)  # the request's last word; nothing can be sent after it
"""


def _finish(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="tensorgate")
    model.ir_version = 8  # readable by every onnxruntime we support
    onnx.checker.check_model(model)
    return model


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


# The models build_example_repository writes.
EXAMPLE_MODELS = frozenset({"mlp", "cnn", "preprocess", "topk", "classify", "countdown"}) | recognizer.RECOGNIZER_MODELS


def build_example_repository(root: Path) -> Path:
    """Write the example repository under ``root`` (idempotent; safe when two servers race)."""
    files = {
        root / "mlp" / "config.yaml": MLP_CONFIG.encode(),
        root / "mlp" / "1" / "model.onnx": mlp_model().SerializeToString(),
        root / "cnn" / "config.yaml": CNN_CONFIG.encode(),
        root / "cnn" / "1" / "model.onnx": cnn_model().SerializeToString(),
        root / "preprocess" / "config.yaml": PREPROCESS_CONFIG.encode(),
        root / "preprocess" / "1" / "model.py": PREPROCESS_MODEL.encode(),
        root / "topk" / "config.yaml": TOPK_CONFIG.encode(),
        root / "topk" / "1" / "model.py": TOPK_MODEL.encode(),
        root / "classify" / "config.yaml": CLASSIFY_CONFIG.encode(),
        root / "countdown" / "config.yaml": COUNTDOWN_CONFIG.encode(),
        root / "countdown" / "1" / "model.py": COUNTDOWN_MODEL.encode(),
        **recognizer.recognizer_files(root),
    }
    # A pipeline's version holds no file.
    for directory in [root / "classify" / "1", *recognizer.recognizer_directories(root)]:
        directory.mkdir(parents=True, exist_ok=True)
    for path, data in files.items():
        if not path.exists() or path.read_bytes() != data:
            _write_atomic(path, data)
    return root


def default_example_repository() -> Path:
    """The examples in the user's cache directory, keyed by a digest of the files they are made from."""
    hasher = hashlib.sha256()
    for source in [Path(__file__), *recognizer.sources()]:
        hasher.update(source.read_bytes())
    digest = hasher.hexdigest()[:12]
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return build_example_repository(base / "tensorgate" / f"examples-{digest}")
