"""The recognizer's last step: greedy CTC decoding, one chunk at a time, the transcript so far out.

The acoustic model scores, for every 10 ms frame, 29 symbols: the CTC blank, a space, ``a``-``z`` and
an apostrophe. Greedy decoding takes each frame's best symbol, merges a symbol repeated in
consecutive frames into one, and drops blanks. Done chunk by chunk, a repeat can straddle two
chunks, so the step keeps per sequence, as state the server feeds back with the next chunk:

- ``last_token`` INT32 ``[1]``: the previous chunk's last symbol (0, the blank, at a start);
- ``text`` INT32 ``[1024]``: the transcript so far as symbol numbers, zero-padded (a symbol is never
  0: blanks are not kept). Past 1024 symbols the oldest are dropped: the partial transcript is
  then the utterance's last 1024 characters.

Each chunk's answer is the whole partial transcript (``transcript`` BYTES ``[N, 1]``, UTF-8), so a
client that missed one answer loses nothing. Every row of a batch is decoded on its own.

This file is both a module of the package (the tests' in-process reference imports it) and, copied
as it is, the ``asr_decode`` model's ``1/model.py``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tensorgate import PythonModel
from tensorgate.types import Array

ALPHABET = " abcdefghijklmnopqrstuvwxyz'"  # symbol k + 1; symbol 0 is the blank
BLANK = 0
CAPACITY = 1024  # symbols of transcript a sequence keeps


def greedy_step(logits: Array, last_token: int, text: Array) -> tuple[int, Array]:
    """One sequence's chunk: frame scores ``[T, 29]``, the previous chunk's last symbol and the
    transcript so far (``[CAPACITY]``, zero-padded) to the new last symbol and transcript."""
    best = np.argmax(logits, axis=-1).astype(np.int32)
    previous = np.concatenate([np.array([last_token], np.int32), best[:-1]])
    emitted = best[(best != BLANK) & (best != previous)]
    kept = text[text != BLANK]
    merged = np.concatenate([kept, emitted])[-CAPACITY:]
    new_text = np.zeros(CAPACITY, np.int32)
    new_text[: merged.shape[0]] = merged
    return (int(best[-1]) if best.shape[0] else last_token), new_text


def spell(text: Array) -> str:
    """Symbol numbers (zero-padded) to characters."""
    return "".join(ALPHABET[int(symbol) - 1] for symbol in text if symbol != BLANK)


class CtcDecode(PythonModel):
    """``logits`` FP32 ``[N, T, 29]`` (and the states ``last_token_in`` INT32 ``[N, 1]``, ``text_in``
    INT32 ``[N, 1024]``) to ``transcript`` BYTES ``[N, 1]`` (and the states' next values)."""

    def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        logits, last, texts = inputs["logits"], inputs["last_token_in"], inputs["text_in"]
        rows = [greedy_step(logits[i], int(last[i, 0]), texts[i]) for i in range(logits.shape[0])]
        return {
            "transcript": np.array([[spell(text).encode()] for _, text in rows], dtype=object).reshape(-1, 1),
            "last_token_out": np.array([[token] for token, _ in rows], np.int32).reshape(-1, 1),
            "text_out": np.stack([text for _, text in rows]) if rows else np.zeros((0, CAPACITY), np.int32),
        }
