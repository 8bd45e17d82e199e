"""``tensorgate bench --sequences`` against a real server and the bundled ``recognizer``: its per-chunk
latencies agree with a client timed by hand (tritonclient's stream, one thread per sequence, the
same pace), the server sees every sequence begin and end, and every protocol runs without error.

The bench (a process of its own, as a user runs it) and the hand-timed client run at the same time,
so the host's load, which moves on a shared two-core machine, weighs on both alike. The agreement is
still asserted loosely: only a gross disagreement (a driver that sends late, times the wrong span
or loses chunks) fails it.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from model_builders import metric

from tensorgate.cli.main import main
from tensorgate.testing import ServerProcess

SEQUENCES, CHUNKS, INTERVAL_S = 4, 30, 0.05
AUDIO = [1, 1600]


def _hand_timed(address: str, first_id: int, start_at: float) -> list[float]:
    """Each thread one sequence: chunk k due k * interval after the sequence's start (the starts
    spread over one interval, as the bench spreads them), sent when due or when the previous chunk
    is answered, timed from when it was due to its answer."""
    latencies: list[float] = []
    lock = threading.Lock()
    failures: list[str] = []

    def speaker(slot: int) -> None:
        client = grpcclient.InferenceServerClient(address)
        answers: queue.Queue[tuple[float, Any]] = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((time.monotonic(), error)))
        audio = grpcclient.InferInput("audio", AUDIO, "INT16")
        audio.set_data_from_numpy(np.random.default_rng(slot).integers(0, 100, AUDIO).astype(np.int16))
        try:
            begin = start_at + slot * INTERVAL_S / SEQUENCES
            for index in range(CHUNKS):
                due = begin + index * INTERVAL_S
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)  # the pace of real time, as a microphone's
                client.async_stream_infer(
                    "recognizer",
                    [audio],
                    sequence_id=first_id + slot,
                    sequence_start=index == 0,
                    sequence_end=index == CHUNKS - 1,
                )
                answered, error = answers.get(timeout=30)
                if error is not None:
                    failures.append(str(error))
                    return
                with lock:
                    latencies.append(answered - due)
        finally:
            client.stop_stream()
            client.close()

    threads = [threading.Thread(target=speaker, args=(slot,)) for slot in range(SEQUENCES)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures, failures
    assert len(latencies) == SEQUENCES * CHUNKS
    return latencies


def _arguments(url: str, protocol: str, report: Path) -> list[str]:
    arguments = ["bench", "recognizer", "-u", url, "--protocol", protocol, "--shape", "audio=1,1600"]
    arguments += ["--sequences", str(SEQUENCES), "--chunks-per-sequence", str(CHUNKS)]
    arguments += ["--chunk-interval-ms", str(INTERVAL_S * 1000), "--json", str(report)]
    return [*arguments, "--slo", "p50=10s"]  # the verdict is not this test's: a shared host is slow at times


def _bench(tmp_path: Path, protocol: str, url: str) -> dict[str, Any]:
    report = tmp_path / f"{protocol}.json"
    assert main(_arguments(url, protocol, report)) == 0
    document: dict[str, Any] = json.loads(report.read_text())
    return document


def test_the_bench_agrees_with_a_hand_timed_client_beside_it(example_server: ServerProcess, tmp_path: Path) -> None:
    ended = metric(example_server.metrics_url, "tensorgate_sequences_ended_total", model="asr_decode", reason="end")
    report = tmp_path / "bench.json"
    command = [sys.executable, "-m", "tensorgate", *_arguments(example_server.grpc_address, "grpc-stream", report)]
    bench = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # The bench starts its sequences once it has the model's metadata and its connections (about
        # a second); the hand-timed ones start then too, and both run for 1.5 s.
        hand = np.percentile(_hand_timed(example_server.grpc_address, 5_000_000, time.monotonic() + 1.0), [50, 90])
        out, _ = bench.communicate(timeout=60)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    assert bench.returncode == 0, out
    assert "4 concurrent sequences of 30 chunks, one every 50 ms" in out
    run = json.loads(report.read_text())["runs"][0]
    assert run["requests"] == run["successes"] == SEQUENCES * CHUNKS and run["errors"] == {}
    assert run["sequences"]["completed"] == SEQUENCES
    measured = np.array([run["latency_s"]["p50"], run["latency_s"]["p90"]])
    # Loose: within a factor of three plus 25 ms either way (both are a few ms on a quiet host).
    assert (measured <= 3 * hand + 0.025).all() and (hand <= 3 * measured + 0.025).all(), (measured, hand)
    after = metric(example_server.metrics_url, "tensorgate_sequences_ended_total", model="asr_decode", reason="end")
    assert after - ended == 2 * SEQUENCES  # the hand-timed client's and the bench's, each ended by its last chunk


@pytest.mark.parametrize("protocol", ["grpc", "v2-binary", "v2-json"])
def test_every_protocol_sends_whole_sequences(example_server: ServerProcess, tmp_path: Path, protocol: str) -> None:
    url = example_server.grpc_address if protocol == "grpc" else example_server.url
    run = _bench(tmp_path, protocol, url)["runs"][0]
    assert run["requests"] == run["successes"] == SEQUENCES * CHUNKS and run["errors"] == {}
    assert run["sequences"] == {
        "concurrent": SEQUENCES,
        "chunks_per_sequence": CHUNKS,
        "chunk_interval_s": INTERVAL_S,
        "completed": SEQUENCES,
        "failed": 0,
    }


def test_the_search_reports_the_most_sequences_within_the_slo(example_server: ServerProcess, tmp_path: Path) -> None:
    report = tmp_path / "search.json"
    arguments = ["bench", "recognizer", "-u", example_server.grpc_address, "--shape", "audio=1,1600"]
    arguments += ["--sequences", "1", "--search", "--max-sequences", "4", "--chunks-per-sequence", "4"]
    arguments += ["--chunk-interval-ms", "50", "--slo", "p99=10s", "--json", str(report)]
    assert main(arguments) == 0
    document = json.loads(report.read_text())
    assert [run["level"] for run in document["runs"]] == [1, 2, 4]
    assert document["search"] == {"sustained": 4, "first_failed": None, "slos": ["p99=10s"]}


def test_a_refused_chunk_ends_its_sequence_and_the_report_says_why(
    example_server: ServerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    # 1000 samples are not whole 10 ms hops: the features step refuses the first chunk, and the
    # sequence's other chunks are not sent.
    arguments = ["bench", "recognizer", "-u", example_server.grpc_address, "--shape", "audio=1,1000"]
    arguments += ["--sequences", "1", "--chunks-per-sequence", "3", "--chunk-interval-ms", "20"]
    assert main(arguments) == 3  # the SLOs are missed: no chunk was answered
    out = capsys.readouterr().out
    assert "grpc stream error: 1" in out
    assert "skipped (an earlier chunk of its sequence failed): 2" in out
    assert "0 sequences completed, 1 cut short" in out
