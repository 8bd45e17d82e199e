"""The bundled workloads end to end, as ``tensorgate examples DIR --workloads`` writes them (at the
test size: the same layers and code, slimmed): the detector answers an encoded image with boxes in
that image's own pixels and the seed's V1 request with its two outputs; texts of different lengths
share BERT's batches and each gets what it gets alone; ResNet-50 answers alike under onnxruntime,
torch and its raw-pixel pipeline; and each exported network computes what its torch module does."""

from __future__ import annotations

import base64
import concurrent.futures
import importlib.util
import io
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import orjson
import pytest
import tritonclient.http as httpclient

from tensorgate.testing import ServerProcess

pytest.importorskip("torch")
pytest.importorskip("PIL")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("workloads")
    written = subprocess.run(
        [sys.executable, "-m", "tensorgate", "examples", str(root), "--workloads", "--workload-size", "test"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert written.returncode == 0, written.stderr
    assert "wrote yolov8, letterbox, nms, detect, resnet50" in written.stdout
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    with ServerProcess("--model-repository", str(repo), "--log-level", "warning", ready_timeout_s=180) as running:
        yield running


def _module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"step_{path.parent.parent.name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _png(width: int, height: int) -> bytes:
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (width, height), (30, 90, 160))
    ImageDraw.Draw(image).rectangle((width // 4, height // 4, width // 2, height // 2), fill=(240, 200, 20))
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def _detect(server: ServerProcess, images: list[bytes]) -> dict[str, np.ndarray]:
    client = httpclient.InferenceServerClient(server.http_address)
    x = httpclient.InferInput("image", [len(images)], "BYTES")
    x.set_data_from_numpy(np.array(images, dtype=object))
    result = client.infer("detect", [x])
    return {name: result.as_numpy(name) for name in ("boxes", "classes", "scores", "detections")}


def test_the_detector_answers_an_encoded_image_with_boxes_in_its_own_pixels(repo: Path, server: ServerProcess) -> None:
    photo = (repo / "detect" / "example.jpg").read_bytes()
    wide = _png(300, 120)
    answer = _detect(server, [photo, wide])
    assert answer["boxes"].shape == (2, 100, 4) and answer["detections"].shape == (2,)
    # The same steps composed by hand, in this process: decode and letterbox, the ONNX file, NMS.
    letterbox = _module(repo / "letterbox" / "1" / "model.py").Letterbox()
    nms = _module(repo / "nms" / "1" / "model.py").NMS()
    nms.confidence, nms.iou, nms.limit = 0.25, 0.45, 100
    session = ort.InferenceSession(str(repo / "yolov8" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    prepared = letterbox.execute({"image": np.array([photo, wide], dtype=object)})
    boxes, scores = session.run(None, {"images": prepared["images"]})
    expected = nms.execute(
        {
            "detection_boxes": boxes,
            "detection_scores": scores,
            "letterbox": prepared["letterbox"],
            "image_size": prepared["image_size"],
        }
    )
    assert np.array_equal(answer["detections"], expected["detections"])
    assert answer["detections"][0] > 0, "the calibrated head finds candidates in the sample photograph"
    np.testing.assert_allclose(answer["boxes"], expected["boxes"], rtol=1e-4, atol=1e-2)
    np.testing.assert_allclose(answer["scores"], expected["scores"], rtol=1e-4, atol=1e-5)
    for index, (width, height) in enumerate([(1280, 720), (300, 120)]):
        found = answer["detections"][index]
        kept = answer["boxes"][index, :found]
        assert (kept[:, 0::2] >= 0).all() and (kept[:, 0::2] <= width).all()  # the original image's pixels
        assert (kept[:, 1::2] >= 0).all() and (kept[:, 1::2] <= height).all()
        assert (answer["scores"][index, :found] > 0.25).all()
        assert (np.diff(answer["scores"][index, :found]) <= 0).all()  # best first
        assert not answer["boxes"][index, found:].any()


def test_a_letterbox_maps_boxes_back_through_its_scale_and_padding(repo: Path) -> None:
    letterbox = _module(repo / "letterbox" / "1" / "model.py")
    pixels, (scale, left, top), size = letterbox.letterbox(_png(300, 120))
    assert size == (300, 120) and pixels.shape == (640, 640, 3)
    assert scale == pytest.approx(640 / 300) and left == 0 and top == (640 - 256) // 2
    assert (pixels[:top] == 114).all() and (pixels[top + 256 :] == 114).all()  # grey bands, as YOLOv8 trained
    # The yellow rectangle drawn at (75, 30)-(150, 60) lands at its scaled place in the letterbox.
    assert tuple(pixels[top + int(45 * scale), int(110 * scale)]) == pytest.approx((240, 200, 20), abs=3)


def test_the_seeds_v1_request_gets_its_two_outputs(server: ServerProcess) -> None:
    images = np.random.default_rng(0).uniform(0, 1, (1, 3, 640, 640)).astype(np.float32)
    body = orjson.dumps({"inputs": {"images": images.tolist()}})
    assert len(body) > 10_000_000  # the seed's 10 MB bodies
    response = httpx.post(f"{server.url}/v1/models/yolov8:predict", content=body, timeout=60)
    assert response.status_code == 200, response.text
    outputs = orjson.loads(response.content)["outputs"]
    assert sorted(outputs) == ["detection_boxes", "detection_scores"]
    assert np.asarray(outputs["detection_boxes"]).shape == (1, 8400, 4)
    scores = np.asarray(outputs["detection_scores"])
    assert scores.shape == (1, 8400, 80) and ((scores >= 0) & (scores <= 1)).all()


def _bert_inputs(length: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, 900, (1, length)).astype(np.int64)
    ids[0, 0], ids[0, -1] = 2, 3  # [CLS] ... [SEP]
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def _infer(client: httpclient.InferenceServerClient, model: str, inputs: dict[str, np.ndarray]) -> np.ndarray:
    tensors = []
    for name, array in inputs.items():
        tensor = httpclient.InferInput(name, list(array.shape), "INT64")
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return client.infer(model, tensors).as_numpy("logits")


def _bert_stats(server: ServerProcess) -> dict[str, Any]:
    stats = httpx.get(f"{server.url}/v2/models/bert/stats").json()["model_stats"][0]
    return {"inferences": stats["inference_count"], "executions": stats["execution_count"]}


def test_texts_of_different_lengths_share_batches_and_get_what_they_get_alone(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_address, concurrency=1)
    lengths = [3 + (7 * i) % 40 for i in range(48)]
    alone = [_infer(client, "bert", _bert_inputs(n, i)) for i, n in enumerate(lengths)]
    before = _bert_stats(server)

    def send(index: int) -> np.ndarray:
        own = httpclient.InferenceServerClient(server.http_address)
        return _infer(own, "bert", _bert_inputs(lengths[index], index))

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        together = list(pool.map(send, range(len(lengths))))
    after = _bert_stats(server)
    for mine, expected in zip(together, alone, strict=True):
        np.testing.assert_allclose(mine, expected, rtol=1e-4, atol=1e-5)
    runs = after["executions"] - before["executions"]
    assert after["inferences"] - before["inferences"] == len(lengths)
    assert runs < len(lengths), "requests of different lengths shared batches"


def test_the_text_pipeline_takes_strings(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_address)
    texts = [b"The bread was fresh.", "Le caf\u00e9 \u00e9tait excellent, merci beaucoup !".encode()]
    x = httpclient.InferInput("text", [2], "BYTES")
    x.set_data_from_numpy(np.array(texts, dtype=object))
    both = client.infer("classify_text", [x]).as_numpy("logits")
    assert both.shape == (2, 2) and np.isfinite(both).all()
    for row, text in enumerate(texts):  # one request of two texts pads the shorter within itself only
        x = httpclient.InferInput("text", [1], "BYTES")
        x.set_data_from_numpy(np.array([text], dtype=object))
        np.testing.assert_allclose(client.infer("classify_text", [x]).as_numpy("logits")[0], both[row], atol=1e-5)


def test_resnet50_answers_alike_under_onnxruntime_torch_and_its_pipeline(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_address)
    pixels = np.random.default_rng(1).integers(0, 256, (2, 224, 224, 3), dtype=np.uint8)
    x = httpclient.InferInput("image", [2, 224, 224, 3], "UINT8")
    x.set_data_from_numpy(pixels)
    top = client.infer("classify_resnet50", [x])
    normalized = (
        pixels.transpose(0, 3, 1, 2) / 255.0 - np.array([0.485, 0.456, 0.406]).reshape(1, 3, 1, 1)
    ) / np.array([0.229, 0.224, 0.225]).reshape(1, 3, 1, 1)
    image = httpclient.InferInput("image", [2, 3, 224, 224], "FP32")
    image.set_data_from_numpy(normalized.astype(np.float32))
    by_onnx = client.infer("resnet50", [image]).as_numpy("probabilities")
    by_torch = client.infer("resnet50_torch", [image]).as_numpy("probabilities")
    np.testing.assert_allclose(by_onnx, by_torch, rtol=1e-3, atol=1e-5)
    assert top.as_numpy("classes").shape == (2, 5)
    np.testing.assert_array_equal(top.as_numpy("classes")[:, 0], by_onnx.argmax(1))
    np.testing.assert_allclose(top.as_numpy("scores")[:, 0], by_onnx.max(1), rtol=1e-4)


def test_the_warm_up_files_carry_an_encoded_image(repo: Path) -> None:
    sample = orjson.loads((repo / "letterbox" / "1" / "warmup8.json").read_bytes())
    images = [base64.b64decode(e) for e in sample["image"]["data_base64"]]
    assert len(images) == 8 and images[0][:2] == b"\xff\xd8"  # JPEG


def test_each_exported_network_computes_what_its_torch_module_does(tmp_path: Path) -> None:
    import torch

    from tensorgate.examples import bert, resnet50, yolov8

    detector = yolov8.build("test")
    classifier = resnet50.build(width=8)
    encoder = bert.build(layers=2, hidden=64, heads=2, intermediate=128)
    images = yolov8.reference_images(1, 3)
    ids = torch.tensor([[2, 40, 41, 42, 3]])
    with torch.no_grad():
        boxes, scores = (t.numpy() for t in detector(images))
        probabilities = classifier(images[:, :, :224, :224]).numpy()
        encoded = encoder(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript-based exporter's deprecation
        yolov8.export_onnx(detector, str(tmp_path / "yolo.onnx"))
        resnet50.export_onnx(classifier, str(tmp_path / "resnet.onnx"))
        bert.export_onnx(encoder, str(tmp_path / "bert.onnx"))
    run = {name: ort.InferenceSession(str(tmp_path / f"{name}.onnx")) for name in ("yolo", "resnet", "bert")}
    onnx_boxes, onnx_scores = run["yolo"].run(None, {"images": images.numpy()})
    np.testing.assert_allclose(onnx_boxes, boxes, rtol=1e-3, atol=1e-2)
    np.testing.assert_allclose(onnx_scores, scores, rtol=1e-3, atol=1e-4)
    assert onnx_boxes.shape == (1, yolov8.anchor_count(), 4)
    onnx_probabilities = run["resnet"].run(None, {"image": images[:, :, :224, :224].numpy()})[0]
    np.testing.assert_allclose(onnx_probabilities, probabilities, rtol=1e-3, atol=1e-6)
    mask = np.ones((1, 5), np.int64)
    feed = {"input_ids": ids.numpy(), "attention_mask": mask, "token_type_ids": np.zeros_like(mask)}
    np.testing.assert_allclose(run["bert"].run(None, feed)[0], encoded, rtol=1e-4, atol=1e-5)


def test_the_cli_refuses_an_unknown_workload_and_a_repository_that_holds_one(repo: Path, tmp_path: Path) -> None:
    def examples(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "tensorgate", "examples", *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)

    unknown = examples(str(tmp_path / "r"), "--workloads", "yolov9")
    assert unknown.returncode == 2 and "unknown workload(s) yolov9" in unknown.stderr
    again = examples(str(repo), "--workloads", "bert", "--workload-size", "test")
    assert again.returncode == 1 and "already holds bert" in again.stderr
