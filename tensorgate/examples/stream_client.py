"""Stream a WAV file to the bundled ``recognizer`` over gRPC, chunk by chunk at real-time pace, and
print the partial transcript after every chunk.

    python -m tensorgate.examples.stream_client speech.wav              # a server on 127.0.0.1:8081
    python -m tensorgate.examples.stream_client speech.wav --url 10.0.0.5:8001 --chunk-ms 160

It uses Triton's own client (``pip install 'tritonclient[grpc]'``): one ``ModelStreamInfer`` stream,
each chunk one request of a sequence (``sequence_id``, ``sequence_start`` on the first chunk,
``sequence_end`` on the last), so it works the same against any server with Triton's sequence
batcher and a model of the same inputs. The server keeps the utterance's state between chunks;
the client sends only audio.

The WAV is read with the standard library: 16-bit PCM, any sample rate (resampled to 16 kHz by
linear interpolation, enough for a demonstration), stereo mixed down. The last chunk is padded with
silence to a whole chunk. The bundled acoustic model has random weights: its transcript is
gibberish, but the same audio always gives the same one.
"""

from __future__ import annotations

import argparse
import math
import queue
import random
import sys
import time
import wave
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tensorgate.types import Array

SAMPLE_RATE = 16_000
MODEL = "recognizer"
DEFAULT_CHUNK_MS = 100


def read_wav(path: Path) -> Array:
    """A 16-bit PCM WAV file as INT16 mono samples at 16 kHz."""
    with wave.open(str(path), "rb") as reader:
        if reader.getsampwidth() != 2:
            raise ValueError(f"{path}: {8 * reader.getsampwidth()}-bit samples; write 16-bit PCM")
        rate, channels = reader.getframerate(), reader.getnchannels()
        raw = np.frombuffer(reader.readframes(reader.getnframes()), dtype="<i2")
    samples = raw.reshape(-1, channels).astype(np.float64).mean(axis=1)
    if rate != SAMPLE_RATE:
        count = math.floor(samples.shape[0] * SAMPLE_RATE / rate)
        samples = np.interp(np.arange(count) * (rate / SAMPLE_RATE), np.arange(samples.shape[0]), samples)
    pcm: Array = np.clip(np.rint(samples), -32768, 32767).astype(np.int16)
    return pcm


def split_chunks(samples: Array, chunk_samples: int) -> list[Array]:
    """Whole chunks of ``chunk_samples``, the last padded with zeros (silence); at least one."""
    count = max(1, math.ceil(samples.shape[0] / chunk_samples))
    padded = np.zeros(count * chunk_samples, np.int16)
    padded[: samples.shape[0]] = samples
    return [padded[i * chunk_samples : (i + 1) * chunk_samples] for i in range(count)]


@dataclass(frozen=True, slots=True)
class Partial:
    """One chunk's answer: its index, the partial transcript, and when it came (seconds from the start)."""

    chunk: int
    transcript: str
    at_s: float


def stream(
    url: str,
    chunks: Sequence[Array],
    *,
    sequence_id: int | str,
    chunk_s: float,
    pace: bool = True,
    model: str = MODEL,
    on_partial: Callable[[Partial], None] = lambda partial: None,
    timeout_s: float = 30.0,
) -> list[Partial]:
    """Send ``chunks`` as one sequence over a gRPC stream, chunk ``k`` at ``k * chunk_s`` seconds from
    the start when ``pace`` (as a microphone would deliver them); return every answer, in order.

    Raises RuntimeError for an error answer, or when an answer does not come within ``timeout_s``.
    """
    import tritonclient.grpc as grpcclient  # imported here: the package runs without tritonclient

    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    partials: list[Partial] = []
    started = time.monotonic()

    def receive(block_until: float) -> None:
        """Take the answers that come before ``block_until`` (monotonic seconds)."""
        while len(partials) < len(chunks):
            try:
                result, error = answers.get(timeout=max(0.0, block_until - time.monotonic()))
            except queue.Empty:
                return
            if error is not None:
                raise RuntimeError(f"chunk {len(partials)}: {error}")
            text = result.as_numpy("transcript")[0, 0]
            partial = Partial(len(partials), text.decode("utf-8", "replace"), time.monotonic() - started)
            partials.append(partial)
            on_partial(partial)

    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        last = len(chunks) - 1
        for index, chunk in enumerate(chunks):
            if pace:  # wait for the chunk's moment, printing the answers that come meanwhile
                receive(started + index * chunk_s)
            audio = grpcclient.InferInput("audio", [1, chunk.shape[0]], "INT16")
            audio.set_data_from_numpy(chunk.reshape(1, -1))
            client.async_stream_infer(
                model,
                [audio],
                request_id=str(index),
                sequence_id=sequence_id,
                sequence_start=index == 0,
                sequence_end=index == last,
            )
        receive(time.monotonic() + timeout_s)
        if len(partials) < len(chunks):
            raise RuntimeError(f"{len(chunks) - len(partials)} chunk(s) unanswered after {timeout_s:g} s")
    finally:
        client.stop_stream()
        client.close()
    return partials


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tensorgate.examples.stream_client", description=__doc__.splitlines()[0]
    )
    parser.add_argument("wav", type=Path, help="16-bit PCM WAV (any rate; resampled to 16 kHz)")
    parser.add_argument("--url", default="127.0.0.1:8081", help="the server's gRPC address (default 127.0.0.1:8081)")
    parser.add_argument("--model", default=MODEL, help=f"the pipeline to stream to (default {MODEL})")
    parser.add_argument("--chunk-ms", type=int, default=DEFAULT_CHUNK_MS, help="audio per request, a multiple of 10")
    parser.add_argument("--sequence-id", type=int, help="the sequence's id (default: a random one)")
    parser.add_argument("--no-pace", action="store_true", help="send every chunk at once, not in real time")
    args = parser.parse_args(argv)
    if args.chunk_ms <= 0 or args.chunk_ms % 10:
        parser.error("--chunk-ms must be a positive multiple of 10")
    try:
        samples = read_wav(args.wav)
    except (OSError, EOFError, wave.Error, ValueError) as exc:
        print(f"cannot read {args.wav}: {exc}", file=sys.stderr)
        return 1
    chunks = split_chunks(samples, SAMPLE_RATE * args.chunk_ms // 1000)
    sequence_id = args.sequence_id if args.sequence_id is not None else random.randrange(1, 2**63)
    print(f"{args.wav}: {samples.shape[0] / SAMPLE_RATE:.2f} s in {len(chunks)} chunks of {args.chunk_ms} ms")

    def show(partial: Partial) -> None:
        print(f"{partial.at_s:7.2f} s  chunk {partial.chunk:3d}  {partial.transcript!r}", flush=True)

    try:
        partials = stream(
            args.url,
            chunks,
            sequence_id=sequence_id,
            chunk_s=args.chunk_ms / 1000,
            pace=not args.no_pace,
            model=args.model,
            on_partial=show,
        )
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # tritonclient's connection errors (InferenceServerException and grpc's)
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"transcript: {partials[-1].transcript!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
