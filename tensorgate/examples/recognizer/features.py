"""The recognizer's first step: 16 kHz mono PCM chunks to log-mel features, with numpy alone.

Frames are 25 ms (400 samples) every 10 ms (160 samples), Hann-windowed, as speech recognizers
usually take them; a 512-point FFT's power spectrum goes through 40 triangular mel filters (HTK's
mel scale, 20 Hz to 8 kHz) and a log. A chunk of ``S`` samples (a multiple of 160) gives ``S / 160``
frames. Frames overlap, so the first frame of a chunk needs the last 240 samples of the chunk
before it: those samples are this step's state (``pcm_tail``), which the server keeps per sequence
and feeds back with the next chunk (zeros at a sequence's start, as if the utterance began after
silence). Every row of a batch is computed on its own, so a sequence's features never depend on
which other sequences shared its batch.

This file is both a module of the package (the tests' in-process reference imports it) and, copied
as it is, the ``asr_features`` model's ``1/model.py``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tensorgate import PythonModel
from tensorgate.types import Array

SAMPLE_RATE = 16_000
FRAME = 400  # samples per analysis window: 25 ms
HOP = 160  # samples between frames: 10 ms
TAIL = FRAME - HOP  # samples a chunk carries over to the next one's first frame
N_FFT = 512
N_MELS = 40
F_MIN, F_MAX = 20.0, 8000.0
LOG_FLOOR = 1e-6  # log(0) guard: silence gives log(1e-6), not -inf


def _hz_to_mel(hz: Array) -> Array:
    return 2595.0 * np.log10(1.0 + hz / 700.0)


def _mel_to_hz(mel: Array) -> Array:
    return 700.0 * (10.0 ** (mel / 2595.0) - 1.0)


def mel_filterbank(n_mels: int = N_MELS, n_fft: int = N_FFT, sample_rate: int = SAMPLE_RATE) -> Array:
    """Triangular filters on HTK's mel scale, FP32 ``[n_fft // 2 + 1, n_mels]`` (power spectrum @ bank)."""
    edges_hz = _mel_to_hz(np.linspace(_hz_to_mel(np.array(F_MIN)), _hz_to_mel(np.array(F_MAX)), n_mels + 2))
    bins_hz = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)
    lower, centre, upper = edges_hz[:-2, None], edges_hz[1:-1, None], edges_hz[2:, None]
    rising = (bins_hz[None, :] - lower) / (centre - lower)
    falling = (upper - bins_hz[None, :]) / (upper - centre)
    bank: Array = np.maximum(0.0, np.minimum(rising, falling)).T.astype(np.float32)
    return bank


WINDOW = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(FRAME) / FRAME)).astype(np.float32)  # periodic Hann
BANK = mel_filterbank()


def pcm_to_float(pcm: Array) -> Array:
    """INT16 samples to FP32 in [-1, 1); FP32 samples pass as they are."""
    if pcm.dtype == np.int16:
        return pcm.astype(np.float32) / 32768.0
    return pcm.astype(np.float32, copy=False)


def log_mel(samples: Array, tail: Array) -> tuple[Array, Array]:
    """One sequence's chunk: FP32 samples ``[S]`` and the previous chunk's last ``TAIL`` samples to
    log-mel features ``[S / HOP, N_MELS]`` and the tail to keep for the next chunk."""
    if samples.shape[0] % HOP:
        raise ValueError(f"a chunk must hold a multiple of {HOP} samples (10 ms at 16 kHz), got {samples.shape[0]}")
    buffer = np.concatenate([tail.astype(np.float32, copy=False), samples])
    frames = np.lib.stride_tricks.sliding_window_view(buffer, FRAME)[::HOP]
    spectrum = np.fft.rfft(frames * WINDOW, n=N_FFT, axis=-1)
    power = (spectrum.real**2 + spectrum.imag**2).astype(np.float32)
    features = np.log(np.maximum(power @ BANK, LOG_FLOOR)).astype(np.float32)
    return features, buffer[-TAIL:].copy()


class Features(PythonModel):
    """``audio`` INT16 ``[N, S]`` (and the state ``pcm_tail`` FP32 ``[N, 240]``) to ``features`` FP32
    ``[N, S / 160, 40]`` (and ``pcm_tail`` for the next chunk)."""

    def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        audio, tails = pcm_to_float(inputs["audio"]), inputs["pcm_tail_in"]
        rows = [log_mel(audio[i], tails[i]) for i in range(audio.shape[0])]
        return {
            "features": np.stack([features for features, _ in rows]),
            "pcm_tail_out": np.stack([tail for _, tail in rows]),
        }
