"""The bundled ``recognizer`` served: utterances streamed chunk by chunk with Triton's client (its gRPC
stream, several utterances at once, and HTTP) get, after every chunk, exactly the partial transcript
the same three steps give in-process (tests/recognizer_reference.py); the stream client of the
README, run as written, prints them at real-time pace.

The speech is spoken by ``espeak-ng`` where it is installed (tests/system_packages.sh installs it),
else synthesized (gliding tones with pauses). The model's weights are random, so the transcripts are
gibberish: the tests compare runs, never words.
"""

from __future__ import annotations

import ast
import concurrent.futures
import re
import shutil
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from recognizer_reference import Recognizer

from tensorgate.examples.stream_client import Partial, read_wav, split_chunks, stream
from tensorgate.testing import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "streaming speech arrives in chunks",
    "hello world",
    "every utterance keeps its own state",
    "one two three four five six",
    "a model server for speech",
]
CHUNK = 1600  # 100 ms at 16 kHz


def _synthetic_wav(path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    t = np.arange(int(1.6 * 22_050)) / 22_050
    pitch = 120 + 40 * seed + 60 * np.sin(2 * np.pi * (0.5 + 0.2 * seed) * t)
    voiced = np.sin(2 * np.pi * np.cumsum(pitch) / 22_050) * (np.sin(2 * np.pi * 2.1 * t + seed) > -0.2)
    samples = np.clip(8000 * voiced + 200 * rng.standard_normal(t.shape), -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(22_050)  # not 16 kHz, as espeak-ng's are not: the client resamples
        writer.writeframes(samples.tobytes())


@pytest.fixture(scope="module")
def wavs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    directory = tmp_path_factory.mktemp("speech")
    espeak = shutil.which("espeak-ng")
    paths = []
    for index, sentence in enumerate(SENTENCES):
        path = directory / f"utterance-{index}.wav"
        if espeak is not None:
            subprocess.run([espeak, "-w", str(path), sentence], check=True, capture_output=True, timeout=60)
        else:
            _synthetic_wav(path, index)
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def reference() -> Recognizer:
    return Recognizer()


def _chunks(path: Path) -> list[np.ndarray]:
    return split_chunks(read_wav(path), CHUNK)


def test_concurrent_streams_equal_the_in_process_reference(
    example_server: ServerProcess, wavs: list[Path], reference: Recognizer
) -> None:
    utterances = [_chunks(path) for path in wavs]
    expected = [reference.utterance(chunks) for chunks in utterances]
    assert any(partials[-1] for partials in expected), "the model should emit some characters"

    def one(index: int) -> list[Partial]:
        # Unpaced, all at once: the chunks of different utterances share the steps' batches.
        return stream(example_server.grpc_address, utterances[index], sequence_id=1000 + index, chunk_s=0.1, pace=False)

    with concurrent.futures.ThreadPoolExecutor(len(utterances)) as pool:
        served = list(pool.map(one, range(len(utterances))))
    for index, partials in enumerate(served):
        assert [p.chunk for p in partials] == list(range(len(utterances[index])))
        assert [p.transcript for p in partials] == expected[index], f"utterance {index} ({SENTENCES[index]!r})"


def test_an_utterance_over_http_with_a_string_id(
    example_server: ServerProcess, wavs: list[Path], reference: Recognizer
) -> None:
    chunks = _chunks(wavs[0])
    client = httpclient.InferenceServerClient(example_server.http_address)
    partials = []
    for index, chunk in enumerate(chunks):
        audio = httpclient.InferInput("audio", [1, CHUNK], "INT16")
        audio.set_data_from_numpy(chunk.reshape(1, -1), binary_data=True)
        result = client.infer(
            "recognizer",
            [audio],
            sequence_id="http-utterance",
            sequence_start=index == 0,
            sequence_end=index == len(chunks) - 1,
        )
        partials.append(result.as_numpy("transcript")[0, 0].decode())
    assert partials == reference.utterance(chunks)


def _readme_command() -> str:
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("### Streaming speech recognition", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S)
    assert block is not None, "the README's streaming section has a bash block"
    commands = [line for line in block.group(1).splitlines() if "stream_client" in line]
    assert len(commands) == 1
    return commands[0].split("  #")[0].strip()


def test_the_readme_stream_client_prints_every_partial_at_real_time_pace(
    example_server: ServerProcess, wavs: list[Path], reference: Recognizer
) -> None:
    command = _readme_command()
    assert command.startswith(".venv/bin/python -m tensorgate.examples.stream_client speech.wav")
    args = command.split()[1:]
    args[args.index("speech.wav")] = str(wavs[2])
    args += ["--url", example_server.grpc_address]
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    expected = reference.utterance(_chunks(wavs[2]))
    lines = [line for line in done.stdout.splitlines() if " chunk " in line]
    assert len(lines) == len(expected)
    printed = [re.match(r"\s*([\d.]+) s\s+chunk\s+(\d+)\s+(.*)$", line) for line in lines]
    assert all(match is not None for match in printed), done.stdout
    assert [ast.literal_eval(m.group(3)) for m in printed if m] == expected
    # Real-time pace: chunk k cannot be answered before it was sent, k * 100 ms after the first
    # (less half the printed resolution: a time printed to 0.01 s may round down by 0.005).
    times = [float(m.group(1)) for m in printed if m]
    assert all(at >= 0.1 * k - 0.005 for k, at in enumerate(times)), times
    assert done.stdout.rstrip().endswith(f"transcript: {expected[-1]!r}")


def test_the_docs_tritonclient_example_streams_as_written(
    example_server: ServerProcess, tmp_path: Path, reference: Recognizer
) -> None:
    page = (ROOT / "docs" / "model-repository.md").read_text(encoding="utf-8")
    section = page[page.index("### Streaming to the bundled `recognizer`") :]
    block = re.search(r"```python\n(.*?)```", section, flags=re.S)
    assert block is not None
    script = tmp_path / "stream.py"
    script.write_text(block.group(1).replace("localhost:8081", example_server.grpc_address))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    silence = [np.zeros(CHUNK, np.int16)] * 10
    assert done.stdout.splitlines() == reference.utterance(silence)
