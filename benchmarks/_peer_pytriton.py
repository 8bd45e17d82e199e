"""Triton through PyTriton, serving one ONNX file with onnxruntime (run in ``benchmarks/.venv-peers``).

Usage: ``_peer_pytriton.py MODEL.onnx NAME THREADS MAX_BATCH DELAY_US HTTP_PORT GRPC_PORT METRICS_PORT``.
The inputs and outputs are read from the ONNX file; the batch axis is Triton's (``max_batch_size``),
the others as the file declares them (-1 where dynamic). ``@batch`` hands the function the batch
Triton's dynamic batcher formed, concatenated along axis 0.
"""

from __future__ import annotations

import sys

import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

TYPES = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(uint8)": np.uint8}


def main() -> None:
    path, name, threads, max_batch, delay_us, http, grpc, metrics = sys.argv[1:9]
    options = ort.SessionOptions()
    options.intra_op_num_threads = int(threads)
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    def spec(node: ort.NodeArg) -> Tensor:
        dims = tuple(d if isinstance(d, int) else -1 for d in node.shape[1:])
        return Tensor(name=node.name, dtype=TYPES[node.type], shape=dims)

    output_names = [o.name for o in session.get_outputs()]

    @batch
    def infer(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        return dict(zip(output_names, session.run(output_names, inputs), strict=True))

    config = TritonConfig(http_port=int(http), grpc_port=int(grpc), metrics_port=int(metrics), http_address="127.0.0.1")
    with Triton(config=config) as triton:
        triton.bind(
            model_name=name,
            infer_func=infer,
            inputs=[spec(i) for i in session.get_inputs()],
            outputs=[spec(o) for o in session.get_outputs()],
            config=ModelConfig(
                max_batch_size=int(max_batch),
                batcher=DynamicBatcher(max_queue_delay_microseconds=int(delay_us)),
            ),
            strict=False,
        )
        triton.serve()


if __name__ == "__main__":
    main()
