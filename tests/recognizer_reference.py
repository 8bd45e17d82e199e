"""The bundled recognizer run in this process, chunk by chunk: the reference its served transcripts
must equal.

The same three steps the ``recognizer`` pipeline runs, from the same sources: the features step's
and the decoder's module (each copied as it is into the example repository as a ``model.py``) and
the acoustic model's ONNX file under onnxruntime. Each sequence's state (the features' sample tail,
the acoustic model's convolution frames and GRU vector, the decoder's last symbol and transcript)
is kept here between chunks, as the server keeps it in its sequence table. ``step`` runs several
sequences' chunks as one batch, as the server's batcher would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from tensorgate.examples.recognizer import ACOUSTIC_MODEL
from tensorgate.examples.recognizer.decode import CAPACITY, CtcDecode
from tensorgate.examples.recognizer.features import N_MELS, TAIL, Features

GRU_UNITS = 128
CONV_FRAMES = 2


@dataclass(slots=True)
class SequenceState:
    """One utterance's state between chunks: zeros at its start, as the server initializes it."""

    pcm_tail: np.ndarray[Any, Any] = field(default_factory=lambda: np.zeros(TAIL, np.float32))
    conv: np.ndarray[Any, Any] = field(default_factory=lambda: np.zeros((CONV_FRAMES, N_MELS), np.float32))
    gru: np.ndarray[Any, Any] = field(default_factory=lambda: np.zeros(GRU_UNITS, np.float32))
    last_token: np.ndarray[Any, Any] = field(default_factory=lambda: np.zeros(1, np.int32))
    text: np.ndarray[Any, Any] = field(default_factory=lambda: np.zeros(CAPACITY, np.int32))


class Recognizer:
    """The pipeline in-process: ``step`` takes one chunk of each of several sequences."""

    def __init__(self, model: Path = ACOUSTIC_MODEL, threads: int = 1) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        self._features = Features()
        self._decode = CtcDecode()

    def step(self, states: Sequence[SequenceState], chunks: Sequence[np.ndarray[Any, Any]]) -> list[str]:
        """One chunk (INT16 ``[S]``) per sequence, as one batch; updates ``states``, returns the partial
        transcripts."""
        features = self._features.execute(
            {"audio": np.stack(chunks), "pcm_tail_in": np.stack([s.pcm_tail for s in states])}
        )
        logits, conv, gru = self._session.run(
            ["logits", "conv_state_out", "gru_state_out"],
            {
                "features": features["features"],
                "conv_state_in": np.stack([s.conv for s in states]),
                "gru_state_in": np.stack([s.gru for s in states]),
            },
        )
        decoded = self._decode.execute(
            {
                "logits": logits,
                "last_token_in": np.stack([s.last_token for s in states]),
                "text_in": np.stack([s.text for s in states]),
            }
        )
        for i, state in enumerate(states):
            state.pcm_tail = features["pcm_tail_out"][i]
            state.conv, state.gru = conv[i], gru[i]
            state.last_token, state.text = decoded["last_token_out"][i], decoded["text_out"][i]
        return [value.decode() for value in decoded["transcript"][:, 0]]

    def utterance(self, chunks: Sequence[np.ndarray[Any, Any]]) -> list[str]:
        """One sequence chunk by chunk: the partial transcript after each chunk."""
        state = SequenceState()
        return [self.step([state], [chunk])[0] for chunk in chunks]
