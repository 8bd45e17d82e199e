"""``tensorgate bench --sequences`` against a real server and the bundled ``recognizer``: its per-chunk
latencies agree with a client timed by hand (tritonclient's stream, one thread per sequence, the
same pace), the server sees every sequence begin and end, and every protocol runs without error.

The agreement is asserted loosely: both run on a shared two-core host beside the server, so only a
gross disagreement (a driver that sends late, times the wrong span or loses chunks) fails it.
"""

from __future__ import annotations

import json
import queue
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

SEQUENCES, CHUNKS, INTERVAL_S = 4, 12, 0.05
AUDIO = [1, 1600]


def _hand_timed(address: str, first_id: int) -> list[float]:
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

    start_at = time.monotonic() + 0.2  # every stream open before the first chunk is due
    threads = [threading.Thread(target=speaker, args=(slot,)) for slot in range(SEQUENCES)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures, failures
    assert len(latencies) == SEQUENCES * CHUNKS
    return latencies


def _bench(server: ServerProcess, tmp_path: Path, protocol: str, url: str) -> dict[str, Any]:
    report = tmp_path / f"{protocol}.json"
    arguments = ["bench", "recognizer", "-u", url, "--protocol", protocol, "--shape", "audio=1,1600"]
    arguments += ["--sequences", str(SEQUENCES), "--chunks-per-sequence", str(CHUNKS)]
    arguments += ["--chunk-interval-ms", str(INTERVAL_S * 1000), "--json", str(report)]
    arguments += ["--slo", "p50=10s"]  # the verdict is not this test's: a shared host is slow at times
    assert main(arguments) == 0
    document: dict[str, Any] = json.loads(report.read_text())
    return document


def test_the_bench_agrees_with_a_hand_timed_client(
    example_server: ServerProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ended = metric(example_server.metrics_url, "tensorgate_sequences_ended_total", model="asr_decode", reason="end")
    hand = np.percentile(_hand_timed(example_server.grpc_address, first_id=5_000_000), [50, 90])
    run = _bench(example_server, tmp_path, "grpc-stream", example_server.grpc_address)["runs"][0]
    assert run["requests"] == run["successes"] == SEQUENCES * CHUNKS and run["errors"] == {}
    assert run["sequences"]["completed"] == SEQUENCES
    bench = np.array([run["latency_s"]["p50"], run["latency_s"]["p90"]])
    # Loose: within a factor of three plus 20 ms either way (both are a few ms when the host is quiet).
    assert (bench <= 3 * hand + 0.020).all() and (hand <= 3 * bench + 0.020).all(), (bench, hand)
    after = metric(example_server.metrics_url, "tensorgate_sequences_ended_total", model="asr_decode", reason="end")
    assert after - ended == 2 * SEQUENCES  # the hand-timed client's and the bench's, each ended by its last chunk
    assert "4 concurrent sequences of 12 chunks, one every 50 ms" in capsys.readouterr().out


@pytest.mark.parametrize("protocol", ["grpc", "v2-binary", "v2-json"])
def test_every_protocol_sends_whole_sequences(example_server: ServerProcess, tmp_path: Path, protocol: str) -> None:
    url = example_server.grpc_address if protocol == "grpc" else example_server.url
    run = _bench(example_server, tmp_path, protocol, url)["runs"][0]
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
