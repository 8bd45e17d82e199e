"""``tensorgate bench --sequences``: the chunks' wire form against Triton's own client, the real-time
driver on virtual time (when each chunk goes, what it carries, what counts), the split over client
processes, the search for the most sequences within the SLO, the report and the argument checks."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as triton_pb2
from tritonclient.grpc._utils import _get_inference_request
from virtual_time import run as run_virtual

from tensorgate.bench.inputs import Tensor
from tensorgate.bench.job import Job
from tensorgate.bench.parallel import split
from tensorgate.bench.report import build_report, render_table, report_json, search_summary
from tensorgate.bench.results import RunResult, merge
from tensorgate.bench.sequences import SKIPPED, SequenceSpec, run_sequences
from tensorgate.bench.slo import real_time_speech
from tensorgate.bench.stream_search import StreamSearch
from tensorgate.bench.targets.base import Endpoint, Outcome
from tensorgate.bench.targets.sequence_encoding import GrpcChunks, HttpChunks
from tensorgate.cli.main import main

AUDIO = np.arange(-8, 8, dtype=np.int16).reshape(1, 16)
TENSORS = (Tensor("audio", "INT16", AUDIO),)
ENDPOINT = Endpoint("127.0.0.1", 8080, "")


# -- the wire ------------------------------------------------------------------------------------


def _triton_grpc(sequence_id: int | str, start: bool, end: bool) -> triton_pb2.ModelInferRequest:
    audio = grpcclient.InferInput("audio", [1, 16], "INT16")
    audio.set_data_from_numpy(AUDIO)
    return _get_inference_request(
        "recognizer", [audio], "", "", None, sequence_id, start, end, priority=0, timeout=None, parameters=None
    )


@pytest.mark.parametrize(
    ("sequence_id", "start", "end"), [(7, True, False), (2**62 + 5, False, True), ("utt-a", True, True)]
)
def test_grpc_chunks_are_the_messages_tritonclient_sends(sequence_id: int | str, start: bool, end: bool) -> None:
    ours = triton_pb2.ModelInferRequest.FromString(
        GrpcChunks("recognizer", None, [TENSORS]).message(0, sequence_id, start, end)
    )
    assert ours == _triton_grpc(sequence_id, start, end)


def test_grpc_chunks_are_framed_for_a_unary_call() -> None:
    chunks = GrpcChunks("recognizer", "2", [TENSORS])
    body = chunks.framed(0, 9, True, False)
    assert body[0] == 0 and int.from_bytes(body[1:5], "big") == len(body) - 5
    assert triton_pb2.ModelInferRequest.FromString(body[5:]).model_version == "2"


def _http_body(request: bytes) -> tuple[dict[str, object], bytes]:
    head, _, body = request.partition(b"\r\n\r\n")
    headers = dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:])
    assert int(headers["Content-Length"]) == len(body)
    length = int(headers.get("Inference-Header-Content-Length", len(body)))
    return orjson.loads(body[:length]), body[length:]


@pytest.mark.parametrize("binary", [True, False])
def test_http_chunks_carry_tritonclients_parameters(binary: bool) -> None:
    audio = httpclient.InferInput("audio", [1, 16], "INT16")
    audio.set_data_from_numpy(AUDIO, binary_data=binary)
    expected, _ = httpclient.InferenceServerClient.generate_request_body(
        [audio], sequence_id="s-1", sequence_start=True, sequence_end=False
    )
    header, blob = _http_body(
        HttpChunks(ENDPOINT, "recognizer", None, [TENSORS], binary).request(0, "s-1", True, False)
    )
    triton_header = orjson.loads(expected[: len(expected) - (AUDIO.nbytes if binary else 0)])
    for name in ("sequence_id", "sequence_start", "sequence_end"):
        assert header["parameters"][name] == triton_header["parameters"][name]  # type: ignore[index]
    assert header["inputs"] == triton_header["inputs"]
    assert blob == (AUDIO.tobytes() if binary else b"")


# -- the driver, on virtual time -----------------------------------------------------------------


@dataclass
class Sent:
    at: float
    slot: int
    sequence_id: int | str
    start: bool
    end: bool


class ServiceTarget:
    """Answers each chunk after ``service_s`` of (virtual) time; ``verdict`` may fail or hang one."""

    def __init__(self, service_s: float, verdict: Callable[[Sent], str | None] = lambda sent: None) -> None:
        self.service_s = service_s
        self.verdict = verdict
        self.sent: list[Sent] = []
        self.opened = 0

    async def open(self, slots: int) -> None:
        self.opened = slots

    async def send(self, slot: int, variant: int, sequence_id: int | str, start: bool, end: bool) -> Outcome:
        sent = Sent(asyncio.get_running_loop().time(), slot, sequence_id, start, end)
        self.sent.append(sent)
        error = self.verdict(sent)
        if error == "hang":
            await asyncio.Event().wait()
        await asyncio.sleep(self.service_s)
        return Outcome(error)

    async def aclose(self) -> None:
        pass


class LoopClock:
    def now(self) -> float:
        return asyncio.get_running_loop().time()


def _drive(target: ServiceTarget, spec: SequenceSpec) -> tuple[RunResult, float]:
    async def main() -> tuple[RunResult, float]:
        started = asyncio.get_running_loop().time()
        return await run_sequences(target, spec, LoopClock()), started

    return run_virtual(main())


def test_chunks_go_at_real_time_pace_with_the_sequence_flags() -> None:
    target = ServiceTarget(service_s=0.004)
    spec = SequenceSpec(slots=4, chunks=5, interval_s=0.1, first_id=100)
    result, t0 = _drive(target, spec)
    assert target.opened == 4
    assert result.successes == 20 and result.errors == {} and result.sequences == 4
    assert result.latencies == pytest.approx([0.004] * 20)
    for slot in range(4):
        mine = [s for s in target.sent if s.slot == slot]
        assert [s.at - t0 for s in mine] == pytest.approx([slot * 0.025 + k * 0.1 for k in range(5)])
        assert {s.sequence_id for s in mine} == {100 + slot}
        assert [(s.start, s.end) for s in mine] == [
            (True, False),
            (False, False),
            (False, False),
            (False, False),
            (False, True),
        ]


def test_a_slow_server_is_charged_from_when_each_chunk_was_due() -> None:
    # 150 ms to answer a chunk due every 100 ms: each chunk waits for the one before it.
    target = ServiceTarget(service_s=0.15)
    result, t0 = _drive(target, SequenceSpec(slots=1, chunks=4, interval_s=0.1))
    assert [s.at - t0 for s in target.sent] == pytest.approx([0.0, 0.15, 0.30, 0.45])
    assert result.latencies == pytest.approx([0.15, 0.20, 0.25, 0.30])


def test_with_a_duration_slots_run_sequences_back_to_back_and_end_every_one() -> None:
    target = ServiceTarget(service_s=0.001)
    spec = SequenceSpec(slots=2, chunks=3, interval_s=0.1, duration_s=0.55, warmup_s=0.1, first_id=1)
    result, t0 = _drive(target, spec)
    starts = [s for s in target.sent if s.start]
    ends = [s for s in target.sent if s.end]
    assert len(starts) == len(ends) == result.sequences
    assert len({s.sequence_id for s in starts}) == len(starts)  # a new id for every sequence
    # The window is [0.1, 0.65) s. Slot 0's sequences begin at 0, 0.3, 0.6 s; slot 1's at 0.05, 0.35
    # (0.65 is the window's end: not begun). The one begun at 0.6 runs to its end, at 0.8.
    assert [round(s.at - t0, 3) for s in starts] == [0.0, 0.05, 0.3, 0.35, 0.6]
    assert round(max(s.at for s in ends) - t0, 3) == 0.8
    due_inside = [s for s in target.sent if 0.1 <= s.at - t0 < 0.65]
    assert result.completed == len(due_inside) == 11
    assert result.elapsed_s == pytest.approx(0.55)


def test_a_failed_chunk_ends_its_sequence_and_its_other_chunks_count_as_skipped() -> None:
    def verdict(sent: Sent) -> str | None:
        return "grpc stream error" if sent.sequence_id == 1 and not sent.start else None

    target = ServiceTarget(service_s=0.001, verdict=verdict)
    result, _ = _drive(target, SequenceSpec(slots=2, chunks=4, interval_s=0.05, first_id=1))
    assert result.errors == {"grpc stream error": 1, SKIPPED: 2}
    assert result.successes == 5 and result.sequences == 1 and result.sequences_failed == 1
    assert len([s for s in target.sent if s.sequence_id == 1]) == 2


def test_an_unanswered_chunk_times_out() -> None:
    target = ServiceTarget(service_s=0.001, verdict=lambda sent: "hang" if sent.end else None)
    result, _ = _drive(target, SequenceSpec(slots=1, chunks=3, interval_s=0.05, timeout_s=2.0))
    assert result.errors == {"timeout": 1} and result.successes == 2


def test_client_processes_drive_disjoint_slots_with_interleaved_phases() -> None:
    spec = SequenceSpec(slots=5, chunks=2, interval_s=0.1, first_id=10)
    job = Job("grpc-stream", ENDPOINT, "recognizer", None, spec, [TENSORS])
    parts = [j.spec for j in split(job, 2)]
    assert all(isinstance(p, SequenceSpec) for p in parts)
    slots = [(p.first_slot + i) for p in parts if isinstance(p, SequenceSpec) for i in range(p.slots)]
    assert slots == [0, 1, 2, 3, 4]
    ids = {
        p.sequence_id(p.first_slot + i, n)
        for p in parts
        if isinstance(p, SequenceSpec)
        for i in range(p.slots)
        for n in range(3)
    }
    assert len(ids) == 15
    phases = sorted(p.phase_s(p.first_slot + i) for p in parts if isinstance(p, SequenceSpec) for i in range(p.slots))
    assert phases == pytest.approx([0.0, 0.02, 0.04, 0.06, 0.08])
    merged = merge([RunResult(sequences=2), RunResult(sequences=3, sequences_failed=1)])
    assert (merged.sequences, merged.sequences_failed) == (5, 1)


def test_the_spec_refuses_what_cannot_run() -> None:
    for bad in ({"slots": 0}, {"chunks": 0}, {"interval_s": 0.0}, {"first_id": 0}, {"duration_s": -1.0}):
        with pytest.raises(ValueError):
            SequenceSpec(**{"slots": 1, "chunks": 1, "interval_s": 0.1, **bad})  # type: ignore[arg-type]


# -- the search ----------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(threshold=st.integers(0, 3000), start=st.integers(1, 64), limit=st.integers(64, 2048))
def test_the_search_finds_the_most_sequences_that_pass(threshold: int, start: int, limit: int) -> None:
    search = StreamSearch(start=start, limit=limit)
    while (count := search.next()) is not None:
        assert 1 <= count <= limit
        search.record(count, count <= threshold)
    best = min(threshold, limit)
    assert search.sustained <= best
    assert best - search.sustained <= max(1, math.ceil(0.05 * best))
    assert len(search.runs) <= StreamSearch.most_runs(start, limit)


def test_a_noisy_failure_below_a_pass_lowers_the_answer() -> None:
    search = StreamSearch(start=8, limit=64)
    for count, ok in [(8, True), (16, True), (32, False), (24, False), (12, False)]:
        search.record(count, ok)
    assert search.sustained == 8 and search.failed == 12
    assert search.next() == 10


# -- the report and the command ------------------------------------------------------------------


def test_the_report_names_the_sequences_and_the_real_time_slo() -> None:
    result = RunResult(latencies=[0.005] * 98 + [0.2, 0.3], elapsed_s=2.0, sequences=10)
    report = build_report("sequences", 10, result, real_time_speech(), None, (10, 0.1))
    assert report.label == "seq=10" and not report.slos_met  # p99 over 100 ms
    assert [c.met for c in report.slos] == [True, True, False]
    table = render_table([report])
    assert "10 concurrent sequences of 10 chunks, one every 100 ms (100.0 chunks/s offered)" in table
    assert "SLO p99=100ms: MISSED" in table
    document = report_json(report)
    assert document["sequences"] == {
        "concurrent": 10,
        "chunks_per_sequence": 10,
        "chunk_interval_s": 0.1,
        "completed": 10,
        "failed": 0,
    }
    texts = ["p50=20ms", "p99=100ms"]
    assert search_summary(12, 13, texts) == (
        "search: sustains 12 concurrent real-time sequences within p50=20ms, p99=100ms and no error; 13 did not"
    )
    assert "no count" in search_summary(0, 1, texts)


@pytest.mark.parametrize(
    "arguments",
    [
        ["--sequences", "0"],
        ["--search"],
        ["--sequences", "2", "-c", "3"],
        ["--sequences", "2", "-n", "10"],
        ["--sequences", "2", "--protocol", "v1"],
        ["--sequences", "9", "--search", "--max-sequences", "4"],
    ],
)
def test_the_command_refuses_sequence_arguments_that_do_not_fit(
    arguments: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "recognizer", "-u", "127.0.0.1:1", *arguments]) == 2
    assert "tensorgate bench:" in capsys.readouterr().err


def test_a_server_that_does_not_answer_fails_the_run_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    # Nothing listens on port 1: the command says so and exits 1 (its metadata fetch fails first).
    arguments = ["bench", "recognizer", "-u", "127.0.0.1:1", "--protocol", "v2-binary", "--shape", "audio=1,160"]
    assert main([*arguments, "--sequences", "1", "--timeout", "2s"]) == 1
    assert "tensorgate bench:" in capsys.readouterr().err
