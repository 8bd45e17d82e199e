"""The recognizer's four model directories, as files to write into the example repository.

The two Python steps' ``model.py`` files are this package's own ``features.py`` and ``decode.py``,
copied byte for byte (so what the server runs is what the tests' in-process reference imports);
the acoustic model is the committed ``acoustic.onnx`` (``tools/build_recognizer.py`` builds it with
torch, so serving it needs none).

Every step is a sequence model with the ``oldest`` strategy: chunks of different utterances share
a batch (at most one chunk per utterance), and any instance can run any utterance's next chunk, its
state travelling with it from the server's sequence table. A sequence silent for 5 s is ended and
its state freed. The pipeline passes each request's ``sequence_id``, ``sequence_start`` and
``sequence_end`` on to its steps.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent

# The same for the three steps: an utterance idle 5 s is over; up to 1 ms waited for batch mates.
_SEQUENCE_BATCHING = """\
sequence_batching:
  max_sequence_idle_microseconds: 5000000
  oldest: {max_candidate_sequences: 512, max_queue_delay_microseconds: 1000}
  state:
"""

FEATURES_CONFIG = (
    """\
# Recognizer step 1: 16 kHz mono INT16 PCM chunks (a multiple of 160 samples, 10 ms) to 40 log-mel
# features per 10 ms frame. Frames overlap chunks: each chunk's last 240 samples wait in the server
# (state pcm_tail) for the sequence's next chunk.
backend: python
max_batch_size: 32
inputs: [{name: audio, datatype: INT16, shape: [-1, -1]}]
outputs: [{name: features, datatype: FP32, shape: [-1, -1, 40]}]
"""
    + _SEQUENCE_BATCHING
    + """\
    - input_name: pcm_tail_in
      output_name: pcm_tail_out
      data_type: TYPE_FP32
      dims: [240]
      initial_state: {name: silence, data_type: TYPE_FP32, dims: [240], zero_data: true}
"""
)

ACOUSTIC_CONFIG = (
    """\
# Recognizer step 2: log-mel frames to scores of 29 CTC symbols per frame (a causal convolution and a
# GRU; random weights). Its inputs and outputs are read from the ONNX graph; the state tensors among
# them are the server's: the convolution's last two frames and the GRU's vector, per sequence.
max_batch_size: 32
instance_group:
  - {count: 1, kind: cpu}
"""
    + _SEQUENCE_BATCHING
    + """\
    - input_name: conv_state_in
      output_name: conv_state_out
      data_type: TYPE_FP32
      dims: [2, 40]
      initial_state: {name: zeros, data_type: TYPE_FP32, dims: [2, 40], zero_data: true}
    - input_name: gru_state_in
      output_name: gru_state_out
      data_type: TYPE_FP32
      dims: [128]
      initial_state: {name: zeros, data_type: TYPE_FP32, dims: [128], zero_data: true}
"""
)

DECODE_CONFIG = (
    """\
# Recognizer step 3: greedy CTC decoding; answers the partial transcript after every chunk. Its
# state: the last symbol of the chunk before (a repeat across chunks is one character) and the
# transcript so far, as symbol numbers.
backend: python
max_batch_size: 32
inputs: [{name: logits, datatype: FP32, shape: [-1, -1, 29]}]
outputs: [{name: transcript, datatype: BYTES, shape: [-1, 1]}]
"""
    + _SEQUENCE_BATCHING
    + """\
    - input_name: last_token_in
      output_name: last_token_out
      data_type: TYPE_INT32
      dims: [1]
      initial_state: {name: blank, data_type: TYPE_INT32, dims: [1], zero_data: true}
    - input_name: text_in
      output_name: text_out
      data_type: TYPE_INT32
      dims: [1024]
      initial_state: {name: empty, data_type: TYPE_INT32, dims: [1024], zero_data: true}
"""
)

RECOGNIZER_CONFIG = """\
# A streaming speech recognizer: send an utterance's audio chunk by chunk as one sequence
# (sequence_id; sequence_start on the first chunk, sequence_end on the last) and get the partial
# transcript after each. Each step keeps its part of the utterance's state in the server.
backend: pipeline
inputs: [{name: audio, datatype: INT16, shape: [-1, -1]}]
outputs: [{name: transcript, datatype: BYTES, shape: [-1, 1]}]
steps:
  - {model: asr_features, inputs: {audio: audio}, outputs: {features: features}}
  - {model: asr_acoustic, inputs: {features: features}, outputs: {logits: logits}}
  - {model: asr_decode, inputs: {logits: logits}, outputs: {transcript: transcript}}
"""

RECOGNIZER_MODELS = frozenset({"asr_features", "asr_acoustic", "asr_decode", "recognizer"})


def recognizer_files(root: Path) -> dict[Path, bytes]:
    """The recognizer's files under repository ``root`` (a pipeline's version directory holds none:
    :func:`recognizer_directories`)."""
    return {
        root / "asr_features" / "config.yaml": FEATURES_CONFIG.encode(),
        root / "asr_features" / "1" / "model.py": (HERE / "features.py").read_bytes(),
        root / "asr_acoustic" / "config.yaml": ACOUSTIC_CONFIG.encode(),
        root / "asr_acoustic" / "1" / "model.onnx": (HERE / "acoustic.onnx").read_bytes(),
        root / "asr_decode" / "config.yaml": DECODE_CONFIG.encode(),
        root / "asr_decode" / "1" / "model.py": (HERE / "decode.py").read_bytes(),
        root / "recognizer" / "config.yaml": RECOGNIZER_CONFIG.encode(),
    }


def recognizer_directories(root: Path) -> list[Path]:
    return [root / "recognizer" / "1"]


def sources() -> list[Path]:
    """The files the recognizer's models are made of: a change to any is a new example repository."""
    return [HERE / name for name in ("repository.py", "features.py", "decode.py", "acoustic.onnx")]
