"""The bundled streaming speech recognizer: three steps served as the ``recognizer`` pipeline.

- ``asr_features`` (:mod:`.features`): 16 kHz INT16 PCM chunks to log-mel features;
- ``asr_acoustic`` (``acoustic.onnx``): a convolution and a GRU over the frames, scores for 29 CTC
  symbols per 10 ms frame (random weights from a fixed seed; ``tools/build_recognizer.py`` builds it);
- ``asr_decode`` (:mod:`.decode`): greedy CTC decoding, the partial transcript after every chunk.

Each step is a sequence model: the state one chunk leaves (samples, frames, the recurrent vector,
the transcript so far) is kept by the server per sequence and fed back with the next chunk.
``tensorgate.examples.stream_client`` streams a WAV file to it.
"""

from pathlib import Path

ACOUSTIC_MODEL = Path(__file__).resolve().parent / "acoustic.onnx"

__all__ = ["ACOUSTIC_MODEL"]
