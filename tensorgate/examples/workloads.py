"""The bundled workloads: real architectures with random weights, served the way a user deploys them.

- ``yolov8``: a YOLOv8s detector (``yolov8.py``), ``images`` FP32 [-1, 3, 640, 640] ->
  ``detection_boxes`` [-1, 8400, 4] and ``detection_scores`` [-1, 8400, 80]; and ``detect``, a
  pipeline from an encoded image (JPEG or PNG bytes) to boxes in that image's own pixels: ``letterbox``
  (decode and letterbox, Pillow) -> ``yolov8`` -> ``nms`` (vectorized numpy).
- ``resnet50``: torchvision's ResNet-50 (``resnet50.py``) as ONNX, and as a ``torch.export`` program
  (``resnet50_torch``); ``classify_resnet50`` takes raw uint8 pixels [-1, 224, 224, 3] through a
  Python pre-processing step, ``resnet50`` and a top-5 step.
- ``bert``: a BERT-base-shaped classifier (``bert.py``) with ragged inputs (a batch pads to its own
  longest sequence), and ``classify_text``, a pipeline from strings: ``bert_tokenize`` (the trained
  WordPiece tokenizer) -> ``bert``.

They are too big to ship (45 MB, 2 x 100 MB and 440 MB), so they are built on demand, deterministically,
into a cache keyed by a digest of the code that builds them; ``tensorgate examples DIR --workloads``
copies them into a repository. Building needs torch, transformers and tokenizers (the ``workloads``
extra); serving the pipelines needs Pillow and tokenizers. ``size="test"`` builds the same layers at a
fraction of the width (and BERT at two layers), the same code path for the test suite.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

WORKLOADS = ("yolov8", "resnet50", "bert")
# The models each workload writes into a repository.
MODELS = {
    "yolov8": ("yolov8", "letterbox", "nms", "detect"),
    "resnet50": ("resnet50", "resnet50_torch", "resnet50_preprocess", "resnet50_topk", "classify_resnet50"),
    "bert": ("bert", "bert_tokenize", "classify_text"),
}
SIZES = ("full", "test")
MAX_DETECTIONS = 100

YOLOV8_CONFIG = """\
# YOLOv8s at 640x640: images FP32 [N, 3, 640, 640], RGB in [0, 1], letterboxed -> detection_boxes
# [N, 8400, 4] (x1, y1, x2, y2 in the input's pixels) and detection_scores [N, 8400, 80] (per class).
max_batch_size: 8
dynamic_batching:
  max_queue_delay_ms: 5
  max_queue_size: 32          # ~5 MB a queued image: an overload is refused (503), never buffered
instance_group:
  - {count: 1, kind: cpu}
health_check: {timeout_s: 20}       # an idle instance's probe runs one image; give a loaded host room
warmup:                       # every batch size a request meets first, before the version is READY
  - {name: one, inputs: random, batch_size: 1, count: 2}
  - {name: two, inputs: random, batch_size: 2}
  - {name: four, inputs: random, batch_size: 4}
  - {name: full, inputs: random, batch_size: 8}
"""
LETTERBOX_CONFIG = """\
# Pipeline step 1: encoded images (JPEG, PNG: one per row) decoded and letterboxed to 640x640 as
# YOLOv8 was trained (the longer side scaled to 640, the rest padded grey), on instance threads.
backend: python
max_batch_size: 8
dynamic_batching: {max_queue_delay_ms: 2, max_queue_size: 64}
instance_group:
  - {count: 2, kind: cpu}     # Pillow releases the GIL while it decodes and resizes
inputs: [{name: image, datatype: BYTES, shape: [-1]}]
warmup:                       # a 1280x720 JPEG (base64 in the files), alone and eight at once
  - {name: one, inputs: file, file: warmup1.json, count: 2}
  - {name: full, inputs: file, file: warmup8.json}
outputs:
  - {name: images, datatype: FP32, shape: [-1, 3, 640, 640]}
  - {name: letterbox, datatype: FP32, shape: [-1, 3]}      # scale, left pad, top pad
  - {name: image_size, datatype: FP32, shape: [-1, 2]}     # the original width and height
"""
LETTERBOX_MODEL = """\
import io

import numpy as np
from PIL import Image

from tensorgate import PythonModel

SIZE = 640
GREY = 114


def letterbox(data):
    image = Image.open(io.BytesIO(data))
    width, height = image.size  # the boxes come back in these pixels
    image.draft("RGB", (SIZE, SIZE))  # a large JPEG decodes at a reduced scale: much less work
    image = image.convert("RGB")
    scale = SIZE / max(width, height)
    new_w, new_h = max(1, round(width * scale)), max(1, round(height * scale))
    canvas = Image.new("RGB", (SIZE, SIZE), (GREY, GREY, GREY))
    left, top = (SIZE - new_w) // 2, (SIZE - new_h) // 2
    canvas.paste(image.resize((new_w, new_h), Image.Resampling.BILINEAR), (left, top))
    return np.asarray(canvas), (scale, left, top), (width, height)


class Letterbox(PythonModel):
    def execute(self, inputs):
        images, boxes, sizes = [], [], []
        for data in inputs["image"]:
            pixels, box, size = letterbox(data)
            images.append(pixels)
            boxes.append(box)
            sizes.append(size)
        batch = np.stack(images).transpose(0, 3, 1, 2).astype(np.float32)
        batch *= np.float32(1 / 255)
        return {
            "images": np.ascontiguousarray(batch),
            "letterbox": np.asarray(boxes, dtype=np.float32),
            "image_size": np.asarray(sizes, dtype=np.float32),
        }
"""
NMS_CONFIG = f"""\
# Pipeline step 3: the detector's 8400 candidates per image to at most {MAX_DETECTIONS} boxes (confidence
# 0.25, IoU 0.45 per class, as ultralytics predicts), in the original image's pixels.
backend: python
max_batch_size: 8
dynamic_batching: {{max_queue_delay_ms: 2, max_queue_size: 64}}
inputs:
  - {{name: detection_boxes, datatype: FP32, shape: [-1, 8400, 4]}}
  - {{name: detection_scores, datatype: FP32, shape: [-1, 8400, 80]}}
  - {{name: letterbox, datatype: FP32, shape: [-1, 3]}}
  - {{name: image_size, datatype: FP32, shape: [-1, 2]}}
outputs:
  - {{name: boxes, datatype: FP32, shape: [-1, {MAX_DETECTIONS}, 4]}}   # x1, y1, x2, y2; rows past detections are 0
  - {{name: classes, datatype: INT64, shape: [-1, {MAX_DETECTIONS}]}}
  - {{name: scores, datatype: FP32, shape: [-1, {MAX_DETECTIONS}]}}
  - {{name: detections, datatype: INT64, shape: [-1]}}     # how many rows of each image hold a box
parameters: {{confidence: 0.25, iou: 0.45, max_detections: {MAX_DETECTIONS}}}
"""
NMS_MODEL = """\
import numpy as np

from tensorgate import PythonModel

MAX_WH = 7680.0  # each class's boxes are moved this far apart, so one pass suppresses within classes


def suppress(boxes, scores, iou):
    \"\"\"Greedy non-maximum suppression: the indices kept, best first.\"\"\"
    x1, y1, x2, y2 = boxes.T
    areas = (x2 - x1).clip(0) * (y2 - y1).clip(0)
    order = np.argsort(-scores, kind="stable")
    keep = []
    while order.size:
        best, rest = order[0], order[1:]
        keep.append(best)
        w = (np.minimum(x2[best], x2[rest]) - np.maximum(x1[best], x1[rest])).clip(0)
        h = (np.minimum(y2[best], y2[rest]) - np.maximum(y1[best], y1[rest])).clip(0)
        inter = w * h
        order = rest[inter <= iou * (areas[best] + areas[rest] - inter)]
    return np.asarray(keep, dtype=np.int64)


class NMS(PythonModel):
    def load(self, context):
        self.confidence = float(context.parameters.get("confidence", 0.25))
        self.iou = float(context.parameters.get("iou", 0.45))
        self.limit = int(context.parameters.get("max_detections", 100))

    def execute(self, inputs):
        n = inputs["detection_boxes"].shape[0]
        boxes = np.zeros((n, self.limit, 4), np.float32)
        classes = np.zeros((n, self.limit), np.int64)
        scores = np.zeros((n, self.limit), np.float32)
        counts = np.zeros(n, np.int64)
        for i in range(n):
            candidates = inputs["detection_scores"][i]
            best = candidates.argmax(1)
            confidence = candidates[np.arange(candidates.shape[0]), best]
            chosen = np.flatnonzero(confidence > self.confidence)
            if chosen.size == 0:
                continue
            found, cls, conf = inputs["detection_boxes"][i][chosen], best[chosen], confidence[chosen]
            keep = suppress(found + (cls * MAX_WH)[:, None], conf, self.iou)[: self.limit]
            scale, left, top = inputs["letterbox"][i]
            width, height = inputs["image_size"][i]
            placed = (found[keep] - np.array([left, top, left, top], np.float32)) / scale
            placed[:, 0::2] = placed[:, 0::2].clip(0, width)
            placed[:, 1::2] = placed[:, 1::2].clip(0, height)
            k = keep.size
            boxes[i, :k], classes[i, :k], scores[i, :k], counts[i] = placed, cls[keep], conf[keep], k
        return {"boxes": boxes, "classes": classes, "scores": scores, "detections": counts}
"""
DETECT_CONFIG = f"""\
# An encoded image in (JPEG or PNG bytes, one per row), boxes out in that image's own pixels.
backend: pipeline
inputs: [{{name: image, datatype: BYTES, shape: [-1]}}]
outputs:
  - {{name: boxes, datatype: FP32, shape: [-1, {MAX_DETECTIONS}, 4]}}
  - {{name: classes, datatype: INT64, shape: [-1, {MAX_DETECTIONS}]}}
  - {{name: scores, datatype: FP32, shape: [-1, {MAX_DETECTIONS}]}}
  - {{name: detections, datatype: INT64, shape: [-1]}}
steps:
  - model: letterbox
    inputs: {{image: image}}
    outputs: {{images: images, letterbox: letterbox, image_size: image_size}}
  - model: yolov8
    inputs: {{images: images}}
    outputs: {{detection_boxes: detection_boxes, detection_scores: detection_scores}}
  - model: nms
    inputs:
      detection_boxes: detection_boxes
      detection_scores: detection_scores
      letterbox: letterbox
      image_size: image_size
    outputs: {{boxes: boxes, classes: classes, scores: scores, detections: detections}}
"""

RESNET50_CONFIG = """\
# ResNet-50 (torchvision's architecture): image FP32 [N, 3, 224, 224] -> probabilities FP32 [N, 1000].
max_batch_size: 8
dynamic_batching:
  max_queue_delay_ms: 5
  max_queue_size: 64          # ~600 KB a queued image
instance_group:
  - {count: 1, kind: cpu}
health_check: {timeout_s: 10}
warmup:
  - {name: one, inputs: random, batch_size: 1, count: 2}
  - {name: two, inputs: random, batch_size: 2}
  - {name: four, inputs: random, batch_size: 4}
  - {name: full, inputs: random, batch_size: 8}
"""
RESNET50_TORCH_CONFIG = """\
# The same network as resnet50, served by torch (a torch.export program).
backend: torch
max_batch_size: 8
dynamic_batching: {max_queue_delay_ms: 5, max_queue_size: 64}
inputs: [{name: image, datatype: FP32, shape: [-1, 3, 224, 224]}]
outputs: [{name: probabilities, datatype: FP32, shape: [-1, 1000]}]
instance_group:
  - {count: 1, kind: cpu}
health_check: {timeout_s: 20}  # torch runs this network several times slower than onnxruntime here
warmup:
  - {name: one, inputs: random, batch_size: 1, count: 2}
  - {name: two, inputs: random, batch_size: 2}
  - {name: four, inputs: random, batch_size: 4}
  - {name: full, inputs: random, batch_size: 8}
"""
RESNET50_PREPROCESS_CONFIG = """\
# Pipeline step 1: uint8 RGB images as a decoder gives them, [N, 224, 224, 3], to normalized FP32 [N, 3, 224, 224].
backend: python
max_batch_size: 8
dynamic_batching: {max_queue_delay_ms: 2, max_queue_size: 64}
inputs: [{name: image, datatype: UINT8, shape: [-1, 224, 224, 3]}]
outputs: [{name: pixels, datatype: FP32, shape: [-1, 3, 224, 224]}]
"""
RESNET50_PREPROCESS_MODEL = """\
import numpy as np

from tensorgate import PythonModel

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(1, 3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(1, 3, 1, 1)
SCALE, SHIFT = 1 / (255 * STD), MEAN / STD  # (x / 255 - mean) / std as one multiply-add


class Preprocess(PythonModel):
    def execute(self, inputs):
        chw = inputs["image"].transpose(0, 3, 1, 2).astype(np.float32)
        return {"pixels": np.ascontiguousarray(chw * SCALE - SHIFT, dtype=np.float32)}
"""
RESNET50_TOPK_CONFIG = """\
# Pipeline step 3: the 1000 class probabilities to the five likeliest classes and their scores.
backend: python
max_batch_size: 8
dynamic_batching: {max_queue_delay_ms: 2, max_queue_size: 64}
inputs: [{name: probabilities, datatype: FP32, shape: [-1, 1000]}]
outputs:
  - {name: classes, datatype: INT64, shape: [-1, 5]}
  - {name: scores, datatype: FP32, shape: [-1, 5]}
parameters: {k: 5}
"""
TOPK_MODEL = """\
import numpy as np

from tensorgate import PythonModel


class TopK(PythonModel):
    def load(self, context):
        self.k = int(context.parameters.get("k", 5))

    def execute(self, inputs):
        probabilities = inputs["probabilities"]
        top = np.argpartition(-probabilities, self.k, axis=1)[:, : self.k]
        order = np.argsort(-np.take_along_axis(probabilities, top, axis=1), axis=1, kind="stable")
        classes = np.take_along_axis(top, order, axis=1)
        return {"classes": classes.astype(np.int64), "scores": np.take_along_axis(probabilities, classes, axis=1)}
"""
CLASSIFY_RESNET50_CONFIG = """\
# Raw uint8 pixels in, the five likeliest classes out: preprocess -> resnet50 -> top 5.
backend: pipeline
inputs: [{name: image, datatype: UINT8, shape: [-1, 224, 224, 3]}]
outputs:
  - {name: classes, datatype: INT64, shape: [-1, 5]}
  - {name: scores, datatype: FP32, shape: [-1, 5]}
steps:
  - {model: resnet50_preprocess, inputs: {image: image}, outputs: {pixels: pixels}}
  - {model: resnet50, inputs: {image: pixels}, outputs: {probabilities: probabilities}}
  - {model: resnet50_topk, inputs: {probabilities: probabilities}, outputs: {classes: classes, scores: scores}}
"""

BERT_CONFIG = """\
# A BERT-base-shaped classifier: token ids [N, L] -> logits FP32 [N, 2]. The inputs are ragged:
# requests of different lengths share a batch, padded (with 0, [PAD] and "no attention") to the
# batch's own longest sequence rather than to a fixed maximum.
max_batch_size: 8
dynamic_batching:
  max_queue_delay_ms: 5
  max_queue_size: 256
inputs:
  - {name: input_ids, datatype: INT64, shape: [-1, -1], ragged: {pad_value: 0}}
  - {name: attention_mask, datatype: INT64, shape: [-1, -1], ragged: {pad_value: 0}}
  - {name: token_type_ids, datatype: INT64, shape: [-1, -1], ragged: {pad_value: 0}}
outputs:
  - {name: logits, datatype: FP32, shape: [-1, 2]}
instance_group:
  - {count: 1, kind: cpu}
health_check: {timeout_s: 10}
warmup:
  - {name: one, inputs: file, file: warmup1.json, count: 2}
  - {name: full, inputs: file, file: warmup8.json}
"""
BERT_TOKENIZE_CONFIG = """\
# Pipeline step 1: strings (UTF-8, one per row) to BERT's inputs, each request alone, so its tokens
# are as long as its own longest text (the batch that bert forms pads no further than its longest).
backend: python
max_batch_size: 0
inputs: [{name: text, datatype: BYTES, shape: [-1]}]
outputs:
  - {name: input_ids, datatype: INT64, shape: [-1, -1]}
  - {name: attention_mask, datatype: INT64, shape: [-1, -1]}
  - {name: token_type_ids, datatype: INT64, shape: [-1, -1]}
"""
BERT_TOKENIZE_MODEL = """\
import numpy as np
from tokenizers import Tokenizer

from tensorgate import PythonModel


class Tokenize(PythonModel):
    def load(self, context):
        self.tokenizer = Tokenizer.from_file(str(context.directory / "tokenizer.json"))
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # to the longest text of the request

    def execute(self, inputs):
        texts = [t.decode("utf-8", "replace") if isinstance(t, bytes) else str(t) for t in inputs["text"].reshape(-1)]
        encoded = self.tokenizer.encode_batch(texts)
        return {
            "input_ids": np.array([e.ids for e in encoded], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encoded], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encoded], dtype=np.int64),
        }
"""
CLASSIFY_TEXT_CONFIG = """\
# Strings in (UTF-8, one per row), the classifier's logits out: bert_tokenize -> bert.
backend: pipeline
inputs: [{name: text, datatype: BYTES, shape: [-1]}]
outputs: [{name: logits, datatype: FP32, shape: [-1, 2]}]
steps:
  - model: bert_tokenize
    inputs: {text: text}
    outputs: {input_ids: input_ids, attention_mask: attention_mask, token_type_ids: token_type_ids}
  - model: bert
    inputs: {input_ids: input_ids, attention_mask: attention_mask, token_type_ids: token_type_ids}
    outputs: {logits: logits}
"""
# bert's warm-up (1/warmup1.json, 1/warmup8.json) runs a text of a typical length through it (a
# sequence of one token would leave longer sequences' first allocations to the first clients).
BERT_WARMUP_TEXT = "The service was slow and the soup was cold, but the waiter apologised and brought us fresh bread."


def _quiet_export(build: Callable[[], None]) -> None:
    """torch warns that its TorchScript-based ONNX exporter is deprecated; it is the one that needs no
    onnxscript and exports these networks exactly (checked against torch in the tests)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build()


def _build_yolov8(directory: Path, size: str) -> None:
    import base64

    import orjson

    from tensorgate.examples import yolov8

    model = yolov8.build("s" if size == "full" else "test")
    (directory / "yolov8" / "1").mkdir(parents=True)
    _quiet_export(lambda: yolov8.export_onnx(model, str(directory / "yolov8" / "1" / "model.onnx")))
    photo = sample_jpeg()
    (directory / "detect").mkdir(parents=True)
    (directory / "detect" / "example.jpg").write_bytes(photo)
    (directory / "letterbox" / "1").mkdir(parents=True)
    encoded = base64.b64encode(photo).decode()
    for rows in (1, 8):
        sample = {"image": {"data_base64": [encoded] * rows}}
        (directory / "letterbox" / "1" / f"warmup{rows}.json").write_bytes(orjson.dumps(sample))


def sample_jpeg(width: int = 1280, height: int = 720, seed: int = 7, quality: int = 90) -> bytes:
    """A synthetic photograph as a camera would send it: a colour gradient with shapes on it, as JPEG."""
    import io

    import numpy as np
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    corners = rng.uniform(0, 255, (2, 3))
    ramp = np.linspace(0, 1, width, dtype=np.float32)[None, :, None]
    fall = np.linspace(0, 1, height, dtype=np.float32)[:, None, None]
    field = corners[0] * (1 - ramp) * (1 - fall / 2) + corners[1] * ramp * (0.5 + fall / 2)
    field += rng.normal(0, 6, (height, width, 3))  # sensor noise: JPEG has real work to do
    image = Image.fromarray(field.clip(0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(image)
    for _ in range(14):
        x0, y0 = int(rng.integers(0, width - 60)), int(rng.integers(0, height - 60))
        x1, y1 = x0 + int(rng.integers(40, width // 3)), y0 + int(rng.integers(40, height // 2))
        fill = tuple(int(v) for v in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.4 else draw.rectangle)((x0, y0, x1, y1), fill=fill)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=quality)
    return out.getvalue()


def _build_resnet50(directory: Path, size: str) -> None:
    from tensorgate.examples import resnet50

    model = resnet50.build(width=64 if size == "full" else 8)
    for name in ("resnet50", "resnet50_torch"):
        (directory / name / "1").mkdir(parents=True)
    _quiet_export(lambda: resnet50.export_onnx(model, str(directory / "resnet50" / "1" / "model.onnx")))
    resnet50.export_program(model, str(directory / "resnet50_torch" / "1" / "model.pt2"))


def _build_bert(directory: Path, size: str) -> None:
    from tensorgate.examples import bert

    tokenizer = directory / "bert_tokenize" / "1" / "tokenizer.json"
    bert.train_tokenizer(tokenizer)
    model = bert.build() if size == "full" else bert.build(layers=2, hidden=64, heads=2, intermediate=128)
    (directory / "bert" / "1").mkdir(parents=True)
    bert.export_onnx(model, str(directory / "bert" / "1" / "model.onnx"))
    for rows in (1, 8):
        (directory / "bert" / "1" / f"warmup{rows}.json").write_bytes(_bert_warmup(tokenizer, rows))


def _bert_warmup(tokenizer_path: Path, rows: int) -> bytes:
    import orjson
    from tokenizers import Tokenizer

    encoded = Tokenizer.from_file(str(tokenizer_path)).encode(BERT_WARMUP_TEXT)
    shape = [rows, len(encoded.ids)]
    sample = {
        "input_ids": {"data": [encoded.ids] * rows, "shape": shape},
        "attention_mask": {"data": [encoded.attention_mask] * rows, "shape": shape},
        "token_type_ids": {"data": [encoded.type_ids] * rows, "shape": shape},
    }
    return orjson.dumps(sample)


_BUILDERS: dict[str, Callable[[Path, str], None]] = {
    "yolov8": _build_yolov8,
    "resnet50": _build_resnet50,
    "bert": _build_bert,
}
# Text files beside the built weights, per workload.
_FILES: dict[str, dict[str, str]] = {
    "yolov8": {
        "yolov8/config.yaml": YOLOV8_CONFIG,
        "letterbox/config.yaml": LETTERBOX_CONFIG,
        "letterbox/1/model.py": LETTERBOX_MODEL,
        "nms/config.yaml": NMS_CONFIG,
        "nms/1/model.py": NMS_MODEL,
        "detect/config.yaml": DETECT_CONFIG,
    },
    "resnet50": {
        "resnet50/config.yaml": RESNET50_CONFIG,
        "resnet50_torch/config.yaml": RESNET50_TORCH_CONFIG,
        "resnet50_preprocess/config.yaml": RESNET50_PREPROCESS_CONFIG,
        "resnet50_preprocess/1/model.py": RESNET50_PREPROCESS_MODEL,
        "resnet50_topk/config.yaml": RESNET50_TOPK_CONFIG,
        "resnet50_topk/1/model.py": TOPK_MODEL,
        "classify_resnet50/config.yaml": CLASSIFY_RESNET50_CONFIG,
    },
    "bert": {
        "bert/config.yaml": BERT_CONFIG,
        "bert_tokenize/config.yaml": BERT_TOKENIZE_CONFIG,
        "bert_tokenize/1/model.py": BERT_TOKENIZE_MODEL,
        "classify_text/config.yaml": CLASSIFY_TEXT_CONFIG,
    },
}
_PIPELINES = {"yolov8": "detect", "resnet50": "classify_resnet50", "bert": "classify_text"}


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tensorgate"


def _digest(workload: str, size: str) -> str:
    """What the built files depend on: this module, the network's module, the corpus, torch's version."""
    import torch

    here = Path(__file__).parent
    sources = [Path(__file__), here / f"{workload}.py"]
    if workload == "bert":
        sources.append(here / "data" / "corpus.txt")
    digest = hashlib.sha256(f"{workload}:{size}:{torch.__version__}".encode())
    for source in sources:
        digest.update(source.read_bytes())
    return digest.hexdigest()[:12]


def built(workload: str, size: str = "full", cache: Path | None = None) -> Path:
    """The workload's repository fragment in the cache, built first when missing (safe when two
    processes race: each builds in a folder of its own and the first to finish names it)."""
    if workload not in _BUILDERS:
        raise ValueError(f"unknown workload {workload!r}; the workloads are {', '.join(WORKLOADS)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; the sizes are {', '.join(SIZES)}")
    base = cache or cache_root()
    target = base / f"workload-{workload}-{size}-{_digest(workload, size)}"
    if target.exists():
        return target
    base.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=base, prefix=f".build-{workload}-"))
    try:
        _BUILDERS[workload](scratch, size)
        for relative, text in _FILES[workload].items():
            (scratch / relative).parent.mkdir(parents=True, exist_ok=True)
            (scratch / relative).write_text(text)
        (scratch / _PIPELINES[workload] / "1").mkdir(parents=True, exist_ok=True)  # a pipeline's version holds no file
        try:
            os.rename(scratch, target)
        except OSError:  # another process named it first: theirs is the same bytes
            if not target.exists():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def _link_or_copy(source: Path, destination: Path) -> None:
    destination.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, destination)  # the weights are hundreds of MB: share the cache's copy
    except OSError:
        shutil.copy2(source, destination)


def build_workload_repository(root: Path, workloads: Iterable[str] = WORKLOADS, size: str = "full") -> list[str]:
    """Write the workloads' models into the repository ``root``; returns the model names written.
    Configuration and model code are written as files of their own (edit them freely); weights are
    hard links to the cache where the file system allows."""
    written: list[str] = []
    for workload in workloads:
        source = built(workload, size)
        for path in sorted(source.rglob("*")):
            relative = path.relative_to(source)
            destination = root / relative
            if path.is_dir():
                destination.mkdir(parents=True, exist_ok=True)
            elif path.suffix in (".yaml", ".py", ".json", ".jpg"):
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, destination)
            else:
                _link_or_copy(path, destination)
        written += MODELS[workload]
    return written
