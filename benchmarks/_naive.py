"""The naive baseline most teams start from: Flask, the model loaded once globally, one call per request."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

FLASK_APP = """
import json, sys
import numpy as np
import onnxruntime as ort
from flask import Flask, request, jsonify

app = Flask(__name__)
options = ort.SessionOptions()
if len(sys.argv) > 3:  # onnxruntime's threads; its default is one per core
    options.intra_op_num_threads = int(sys.argv[3])
session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])

@app.post("/v2/models/mlp/infer")
def infer():
    body = request.get_json(force=True)
    tensor = body["inputs"][0]
    x = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
    y = session.run(None, {"features": x})[0]
    return jsonify({"outputs": [{"name": "probabilities", "datatype": "FP32", "shape": list(y.shape),
                                 "data": y.ravel().tolist()}]})

if __name__ == "__main__":
    app.run(host="127.0.0.1", port=int(sys.argv[2]), threaded=True)
"""


@contextlib.contextmanager
def flask_baseline(work: Path, model: bytes, body: bytes, ort_threads: int | None = None) -> Iterator[str]:
    """The way most teams start: Flask, the model loaded once globally, called per request. Yields its URL.
    ``ort_threads``: onnxruntime's intra-op threads (None: its default, one per core)."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "naive.onnx").write_bytes(model)
    (work / "naive_app.py").write_text(FLASK_APP)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [
            sys.executable,
            str(work / "naive_app.py"),
            str(work / "naive.onnx"),
            str(port),
            *([] if ort_threads is None else [str(ort_threads)]),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        import httpx

        url = f"http://127.0.0.1:{port}/v2/models/mlp/infer"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.post(url, content=body).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("the Flask baseline did not start")
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(10)
