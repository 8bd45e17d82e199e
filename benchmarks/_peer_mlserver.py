"""An MLServer runtime for an ONNX file (MLServer ships none): copied beside ``model-settings.json`` as
``onnx_runtime.py`` by ``_peers.py`` and run in ``benchmarks/.venv-peers``.

MLServer's adaptive batching hands ``predict`` the requests it merged (``max_batch_size``,
``max_batch_time`` in the settings); onnxruntime runs with the threads the settings name.
"""

from __future__ import annotations

import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OnnxModel(MLModel):
    async def load(self) -> bool:
        extra = self.settings.parameters.extra or {}
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(extra.get("threads", 0))
        self._session = ort.InferenceSession(
            str(self.settings.parameters.uri), options, providers=["CPUExecutionProvider"]
        )
        self._outputs = [o.name for o in self._session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {request_input.name: NumpyCodec.decode_input(request_input) for request_input in payload.inputs}
        results = self._session.run(self._outputs, feeds)
        return InferenceResponse(
            model_name=self.name,
            outputs=[NumpyCodec.encode_output(name, array) for name, array in zip(self._outputs, results, strict=True)],
        )
