"""The bundled recognizer's three steps in-process: the committed ONNX file is what its build script
makes; features, acoustic scores and transcripts computed chunk by chunk equal those of the whole
utterance at once (the state each step carries is what makes streaming exact); a sequence's results
do not depend on its batch mates; greedy CTC decoding merges repeats across a chunk boundary."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import onnxruntime as ort
import pytest
from recognizer_reference import Recognizer

from tensorgate.examples.recognizer import ACOUSTIC_MODEL
from tensorgate.examples.recognizer.decode import ALPHABET, CAPACITY, CtcDecode, greedy_step, spell
from tensorgate.examples.recognizer.features import BANK, HOP, N_MELS, TAIL, Features, log_mel, pcm_to_float

ROOT = Path(__file__).resolve().parents[2]
SYMBOLS = len(ALPHABET) + 1


def _speechlike(seconds: float, seed: int) -> np.ndarray:
    """Tones that glide and pause, with a little noise: enough structure for the model to vary."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16_000)) / 16_000
    pitch = 150 + 80 * np.sin(2 * np.pi * 0.7 * t)
    voice = np.sin(2 * np.pi * np.cumsum(pitch) / 16_000) * (np.sin(2 * np.pi * 2.3 * t) > -0.3)
    return np.clip(9000 * voice + 300 * rng.standard_normal(t.shape), -32768, 32767).astype(np.int16)


def _build_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_recognizer", ROOT / "tools" / "build_recognizer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["build_recognizer"] = module
    spec.loader.exec_module(module)
    return module


def test_the_committed_acoustic_model_is_what_the_build_script_makes() -> None:
    pytest.importorskip("torch")
    assert _build_script().build() == ACOUSTIC_MODEL.read_bytes()


def test_the_mel_filterbank_covers_the_band() -> None:
    assert BANK.shape == (257, N_MELS) and BANK.dtype == np.float32
    assert (BANK >= 0).all() and (BANK.max(axis=0) > 0).all()  # every filter reaches at least one bin
    assert np.argmax(BANK, axis=0).tolist() == sorted(np.argmax(BANK, axis=0).tolist())  # rising centres


def test_features_streamed_chunk_by_chunk_equal_the_whole_utterance() -> None:
    audio = pcm_to_float(_speechlike(1.2, seed=1))
    whole, _ = log_mel(audio, np.zeros(TAIL, np.float32))
    tail = np.zeros(TAIL, np.float32)
    parts = []
    for start in range(0, audio.shape[0], 1600):
        features, tail = log_mel(audio[start : start + 1600], tail)
        parts.append(features)
    streamed = np.concatenate(parts)
    assert streamed.shape == (audio.shape[0] // HOP, N_MELS)
    np.testing.assert_allclose(streamed, whole, rtol=1e-5, atol=1e-5)


def test_a_chunk_must_be_whole_hops() -> None:
    with pytest.raises(ValueError, match="multiple of 160"):
        log_mel(np.zeros(1000, np.float32), np.zeros(TAIL, np.float32))


def test_the_acoustic_model_streamed_equals_the_whole_utterance_and_ignores_batch_mates() -> None:
    session = ort.InferenceSession(str(ACOUSTIC_MODEL), providers=["CPUExecutionProvider"])
    features, _ = log_mel(pcm_to_float(_speechlike(1.0, seed=2)), np.zeros(TAIL, np.float32))
    conv, gru = np.zeros((1, 2, N_MELS), np.float32), np.zeros((1, 128), np.float32)
    whole = session.run(["logits"], {"features": features[None], "conv_state_in": conv, "gru_state_in": gru})[0]
    parts = []
    for start in range(0, features.shape[0], 10):
        logits, conv, gru = session.run(
            None, {"features": features[None, start : start + 10], "conv_state_in": conv, "gru_state_in": gru}
        )
        parts.append(logits)
    np.testing.assert_allclose(np.concatenate(parts, axis=1), whole, rtol=1e-4, atol=1e-4)
    assert whole.shape == (1, features.shape[0], SYMBOLS)
    # One row alone and the same row among 5 others: the same bits.
    rng = np.random.default_rng(3)
    batch = {
        "features": rng.standard_normal((6, 10, N_MELS)).astype(np.float32),
        "conv_state_in": rng.standard_normal((6, 2, N_MELS)).astype(np.float32),
        "gru_state_in": rng.standard_normal((6, 128)).astype(np.float32),
    }
    together = session.run(None, batch)
    alone = session.run(None, {name: value[4:5] for name, value in batch.items()})
    for joint, single in zip(together, alone, strict=True):
        assert np.array_equal(joint[4:5], single)


def test_greedy_decoding_merges_repeats_across_a_chunk_boundary() -> None:
    def frames(*symbols: int) -> np.ndarray:
        logits = np.zeros((len(symbols), SYMBOLS), np.float32)
        logits[np.arange(len(symbols)), symbols] = 1.0
        return logits

    a, b = ALPHABET.index("a") + 1, ALPHABET.index("b") + 1
    last, text = greedy_step(frames(a, a, 0, a, b), 0, np.zeros(CAPACITY, np.int32))
    assert spell(text) == "aab" and last == b
    last, text = greedy_step(frames(b, b, 0), last, text)  # continues the b of the last chunk
    assert spell(text) == "aab" and last == 0
    last, text = greedy_step(frames(b), last, text)  # after a blank, a b is a new character
    assert spell(text) == "aabb"


def test_a_full_transcript_keeps_its_latest_characters() -> None:
    a, b = ALPHABET.index("a") + 1, ALPHABET.index("b") + 1
    text = np.full(CAPACITY, a, np.int32)
    logits = np.zeros((1, SYMBOLS), np.float32)
    logits[0, b] = 1.0
    _, text = greedy_step(logits, 0, text)
    assert spell(text) == "a" * (CAPACITY - 1) + "b"


def test_the_steps_answer_each_row_on_its_own() -> None:
    audio = np.stack([_speechlike(0.1, seed=s) for s in range(5)])
    tails = np.random.default_rng(4).standard_normal((5, TAIL)).astype(np.float32)
    together = Features().execute({"audio": audio, "pcm_tail_in": tails})
    alone = Features().execute({"audio": audio[2:3], "pcm_tail_in": tails[2:3]})
    assert np.array_equal(together["features"][2:3], alone["features"])
    assert np.array_equal(together["pcm_tail_out"][2:3], alone["pcm_tail_out"])
    decoded = CtcDecode().execute(
        {
            "logits": np.zeros((2, 3, SYMBOLS), np.float32),
            "last_token_in": np.zeros((2, 1), np.int32),
            "text_in": np.zeros((2, CAPACITY), np.int32),
        }
    )
    assert decoded["transcript"].shape == (2, 1) and decoded["text_out"].shape == (2, CAPACITY)


def test_the_reference_transcript_of_speech_like_audio_is_not_empty_and_streams_exactly() -> None:
    audio = _speechlike(2.0, seed=5)
    chunks = [audio[i : i + 1600] for i in range(0, audio.shape[0], 1600)]
    partials = Recognizer().utterance(chunks)
    assert partials[-1], "the random model should emit some characters for voiced audio"
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(partials))
    # The whole utterance through the model at once gives the same transcript as the stream.
    state_free = Recognizer().utterance([audio])
    assert state_free[-1] == partials[-1]
