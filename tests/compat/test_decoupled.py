"""Triton's decoupled model (``repeat_int32``, its repeat example) served by tensorgate and called the
ways Triton's clients call it: ``tritonclient.grpc`` streams (``start_stream`` /
``async_stream_infer``), the asyncio client's ``stream_infer``, the flow of Triton's
``simple_grpc_custom_repeat.py``, the final-response flags, the unary calls it refuses, the generate
extension's Server-Sent Events, and cancellation when the client goes away. In a thread of the server
(the example repository as Triton ships it) and in a worker process (the same model with a
``config.yaml`` asking for ``isolation: process``).

Nothing waits a fixed time: answers are awaited on queues with a deadline, and what the model saw
(a cancellation) is polled for with one.
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcclient_aio
import tritonclient.http as httpclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from triton_repository import build_repeat_repository
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tensorgate.testing import ServerProcess

MODEL = "repeat_int32"
WAIT_S = 30.0  # the most any answer is waited for: a hang fails the test instead of stalling it


@dataclass(frozen=True)
class Served:
    server: ServerProcess
    repository: Path  # where the model notes the cancellations it saw


@pytest.fixture(scope="module")
def process_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    repo = build_repeat_repository(tmp_path_factory.mktemp("repeat-process"), isolation="process")
    with ServerProcess("--model-repository", str(repo)) as server:
        yield Served(server, repo)


@pytest.fixture(params=["thread", "process"])
def served(request: pytest.FixtureRequest) -> Served:
    """The model in a thread of the server (Triton's repository as it is) or in a worker process."""
    if request.param == "thread":
        return Served(request.getfixturevalue("triton_server"), request.getfixturevalue("triton_repo"))
    return request.getfixturevalue("process_served")  # type: ignore[no-any-return]


@pytest.fixture()
def server(served: Served) -> ServerProcess:
    return served.server


def repeat_inputs(module: Any, values: list[int], delay_ms: int = 0, wait_ms: int = 0) -> list[Any]:
    count = len(values)
    inputs = [
        module.InferInput("IN", [count], "INT32"),
        module.InferInput("DELAY", [count], "UINT32"),
        module.InferInput("WAIT", [1], "UINT32"),
    ]
    inputs[0].set_data_from_numpy(np.array(values, dtype=np.int32))
    inputs[1].set_data_from_numpy(np.full(count, delay_ms, dtype=np.uint32))
    inputs[2].set_data_from_numpy(np.array([wait_ms], dtype=np.uint32))
    return inputs


class Stream:
    """A ``tritonclient.grpc`` stream whose callback puts each answer on a queue."""

    def __init__(self, server: ServerProcess) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc_address)
        self.answers: queue.Queue[tuple[Any, InferenceServerException | None]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.answers.put((result, error)))

    def next(self) -> tuple[Any, InferenceServerException | None]:
        return self.answers.get(timeout=WAIT_S)

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.fixture()
def stream(server: ServerProcess) -> Iterator[Stream]:
    opened = Stream(server)
    yield opened
    opened.close()


def final(result: Any) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` until it holds, for at most ``WAIT_S``."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {WAIT_S:.0f} s")
        time.sleep(0.01)


# -- Triton's example client -----------------------------------------------------------------------


def test_simple_grpc_custom_repeat(server: ServerProcess) -> None:
    """simple_grpc_custom_repeat.py: IN = 100..109, OUT requested; ten responses, 100..109 in order
    (its 1000 ms delays shortened, so the test is quick)."""
    repeat_count, data_offset = 10, 100
    inputs = repeat_inputs(grpcclient, list(range(data_offset, data_offset + repeat_count)), delay_ms=2, wait_ms=2)
    outputs = [grpcclient.InferRequestedOutput("OUT")]
    completed: queue.Queue[Any] = queue.Queue()

    def callback(user_data: queue.Queue[Any], result: Any, error: InferenceServerException | None) -> None:
        user_data.put(error if error else result)

    with grpcclient.InferenceServerClient(url=server.grpc_address) as triton_client:
        triton_client.start_stream(callback=partial(callback, completed))
        triton_client.async_stream_infer(model_name=MODEL, inputs=inputs, outputs=outputs)
        result_list = []
        for _ in range(repeat_count):
            data_item = completed.get(timeout=WAIT_S)
            assert not isinstance(data_item, InferenceServerException), data_item
            result_list.append(data_item.as_numpy("OUT"))
            assert data_item.as_numpy("IDX") is None  # only the output it asked for
    assert [r.tolist() for r in result_list] == [[v] for v in range(data_offset, data_offset + repeat_count)]


# -- responses, ids and the final flag ---------------------------------------------------------------


def test_each_response_echoes_the_request_id_and_the_last_is_marked_final(stream: Stream) -> None:
    stream.client.async_stream_infer(
        MODEL, repeat_inputs(grpcclient, [7, 8, 9]), request_id="req-1", enable_empty_final_response=True
    )
    answers = [stream.next() for _ in range(4)]
    assert all(error is None for _, error in answers)
    results = [result for result, _ in answers]
    assert [r.get_response().id for r in results] == ["req-1"] * 4
    assert [final(r) for r in results] == [False, False, False, True]
    assert [r.as_numpy("OUT").tolist() for r in results[:3]] == [[7], [8], [9]]
    assert [r.as_numpy("IDX").tolist() for r in results[:3]] == [[0], [1], [2]]
    last = results[3].get_response()  # the final flag alone: an empty answer, as Triton sends it
    assert not last.outputs and last.model_name == MODEL


def test_without_asking_the_final_flag_alone_sends_nothing(stream: Stream) -> None:
    stream.client.async_stream_infer(MODEL, repeat_inputs(grpcclient, [1, 2]), request_id="a")
    stream.client.async_stream_infer(
        MODEL, repeat_inputs(grpcclient, [3]), request_id="b", enable_empty_final_response=True
    )
    seen = [stream.next()[0] for _ in range(4)]  # a: 2 responses; b: 1 and its empty final
    by_id: dict[str, list[Any]] = {}
    for result in seen:
        by_id.setdefault(result.get_response().id, []).append(result)
    assert [final(r) for r in by_id["a"]] == [False, False]
    assert [final(r) for r in by_id["b"]] == [False, True]
    assert stream.answers.empty()


def test_responses_of_several_requests_interleave(stream: Stream) -> None:
    """Each execute returns at once (WAIT 0) and sends from its own thread: one instance streams both
    requests side by side, and each keeps its own order."""
    stream.client.async_stream_infer(MODEL, repeat_inputs(grpcclient, [10, 11, 12, 13], delay_ms=5), request_id="x")
    stream.client.async_stream_infer(MODEL, repeat_inputs(grpcclient, [20, 21, 22, 23], delay_ms=5), request_id="y")
    order = [stream.next()[0] for _ in range(8)]
    ids = [r.get_response().id for r in order]
    assert [int(r.as_numpy("OUT")[0]) for r in order if r.get_response().id == "x"] == [10, 11, 12, 13]
    assert [int(r.as_numpy("OUT")[0]) for r in order if r.get_response().id == "y"] == [20, 21, 22, 23]
    assert ids.index("y") < len(ids) - ids[::-1].index("x") - 1  # y began before x ended


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(st.integers(-(2**31), 2**31 - 1), max_size=40))
def test_n_responses_in_order(stream: Stream, values: list[int]) -> None:
    request_id = f"n{len(values)}-{hash(tuple(values)) & 0xFFFF}"
    stream.client.async_stream_infer(
        MODEL, repeat_inputs(grpcclient, values), request_id=request_id, enable_empty_final_response=True
    )
    results = [stream.next()[0] for _ in range(len(values) + 1)]
    assert [int(r.as_numpy("OUT")[0]) for r in results[:-1]] == values
    assert [int(r.as_numpy("IDX")[0]) for r in results[:-1]] == list(range(len(values)))
    assert [final(r) for r in results] == [False] * len(values) + [True]
    assert {r.get_response().id for r in results} == {request_id}


async def test_the_asyncio_client_streams(server: ServerProcess) -> None:
    async with grpcclient_aio.InferenceServerClient(server.grpc_address) as client:

        async def requests() -> AsyncIterator[dict[str, Any]]:
            yield {"model_name": MODEL, "inputs": repeat_inputs(grpcclient_aio, [4, 5, 6]), "request_id": "aio"}

        got = []
        async for result, error in client.stream_infer(inputs_iterator=requests()):
            assert error is None
            got.append((result.get_response().id, int(result.as_numpy("OUT")[0]), final(result)))
    assert got == [("aio", 4, False), ("aio", 5, False), ("aio", 6, False)]


# -- errors --------------------------------------------------------------------------------------------


def test_unary_grpc_infer_is_refused_in_tritons_words(server: ServerProcess) -> None:
    with (
        grpcclient.InferenceServerClient(server.grpc_address) as client,
        pytest.raises(InferenceServerException) as caught,
    ):
        client.infer(MODEL, repeat_inputs(grpcclient, [1]))
    assert caught.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in caught.value.message()


def test_unary_http_infer_is_refused_in_tritons_words(server: ServerProcess) -> None:
    with (
        httpclient.InferenceServerClient(server.http_address) as client,
        pytest.raises(InferenceServerException) as caught,
    ):
        client.infer(MODEL, repeat_inputs(httpclient, [1]))
    assert caught.value.status() == "501"
    assert caught.value.message() == "HTTP end point doesn't support models with decoupled transaction policy"


def test_a_request_the_model_cannot_take_answers_an_error_on_the_stream(stream: Stream) -> None:
    bad = repeat_inputs(grpcclient, [1, 2])
    bad[1] = grpcclient.InferInput("DELAY", [1], "UINT32")  # one delay for two values: the model raises
    bad[1].set_data_from_numpy(np.zeros(1, np.uint32))
    stream.client.async_stream_infer(MODEL, bad, request_id="bad")
    result, error = stream.next()
    assert result is None and error is not None
    assert "expected DELAY to hold 2 values (one per IN), got 1" in error.message()
    missing = repeat_inputs(grpcclient, [1])[:2]  # no WAIT: refused before the model, with Triton's words
    stream.client.async_stream_infer(MODEL, missing, request_id="missing")
    result, error = stream.next()
    assert error is not None and "expected 3 inputs but got 2 inputs for model 'repeat_int32'" in error.message()
    # The stream goes on.
    stream.client.async_stream_infer(MODEL, repeat_inputs(grpcclient, [5]), request_id="ok")
    result, error = stream.next()
    assert error is None and int(result.as_numpy("OUT")[0]) == 5


def test_the_raw_stream_names_each_error_with_its_request_and_the_final_flag(server: ServerProcess) -> None:
    request = service_pb2.ModelInferRequest(model_name=MODEL, id="no-inputs")
    with grpc.insecure_channel(server.grpc_address) as channel:
        answers = list(
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter([request]), timeout=WAIT_S)
        )
    (answer,) = answers
    assert answer.error_message.startswith("expected 3 inputs but got 0 inputs")
    assert answer.infer_response.id == "no-inputs" and answer.infer_response.model_name == MODEL
    assert answer.infer_response.parameters["triton_final_response"].bool_param


# -- HTTP: the generate extension ----------------------------------------------------------------------


def _events(body: str) -> list[dict[str, Any]]:
    return [orjson.loads(line.removeprefix("data: ")) for line in body.split("\n\n") if line.startswith("data: ")]


def test_generate_stream_sends_each_response_as_an_event(server: ServerProcess) -> None:
    body = {"IN": [3, 1, 4, 1, 5], "DELAY": [0, 0, 0, 0, 0], "WAIT": 0}
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as client:
        answer = client.post(f"/v2/models/{MODEL}/generate_stream", json=body)
    assert answer.status_code == 200 and answer.headers["content-type"] == "text/event-stream"
    assert _events(answer.text) == [
        {"model_name": MODEL, "model_version": "1", "OUT": value, "IDX": index}
        for index, value in enumerate([3, 1, 4, 1, 5])
    ]


def test_generate_answers_a_model_that_sends_one_response(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as client:
        one = client.post(f"/v2/models/{MODEL}/generate", json={"IN": 42, "DELAY": 0, "WAIT": 0})
        three = client.post(f"/v2/models/{MODEL}/generate", json={"IN": [1, 2, 3], "DELAY": [0, 0, 0], "WAIT": 0})
        shapeless = client.post(f"/v2/models/{MODEL}/generate", json={"IN": [[1]], "DELAY": [0], "WAIT": 0})
    assert one.status_code == 200 and one.json() == {"model_name": MODEL, "model_version": "1", "OUT": 42, "IDX": 0}
    assert three.status_code == 400
    assert three.json()["error"].startswith("generate expects model to produce exactly 1 response")
    assert shapeless.status_code == 400 and "a value or a flat list" in shapeless.json()["error"]


# -- cancellation ---------------------------------------------------------------------------------------


def _cancelled(repository: Path) -> list[str]:
    log = repository / MODEL / "cancelled.log"
    return log.read_text().split() if log.exists() else []


def _metric(server: ServerProcess, name: str) -> float:
    text = httpx.get(server.metrics_url, timeout=WAIT_S).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and f'model="{MODEL}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_cancelled_grpc_stream_cancels_the_request_in_the_model(served: Served) -> None:
    server = served.server
    marker = int(time.monotonic_ns() % 1_000_000_000)
    before = _metric(server, "tensorgate_stream_cancellations_total")
    opened = Stream(server)
    # 1000 responses 20 ms apart: twenty seconds of work, far more than the test waits for.
    opened.client.async_stream_infer(MODEL, repeat_inputs(grpcclient, [marker] * 1000, delay_ms=20), request_id="c")
    result, error = opened.next()
    assert error is None and int(result.as_numpy("OUT")[0]) == marker
    opened.close(cancel=True)
    wait_for(lambda: str(marker) in _cancelled(served.repository), "the model seeing is_cancelled()")
    wait_for(lambda: _metric(server, "tensorgate_stream_cancellations_total") > before, "the cancellation counted")
    # The instance is not left stuck: the next request is answered.
    with Stream(server) as again:
        again.client.async_stream_infer(MODEL, repeat_inputs(grpcclient, [1, 2]), request_id="after")
        assert [int(again.next()[0].as_numpy("OUT")[0]) for _ in range(2)] == [1, 2]


def test_an_sse_client_that_disconnects_cancels_the_request_in_the_model(served: Served) -> None:
    server = served.server
    marker = int(time.monotonic_ns() % 1_000_000_000) + 1
    body = {"IN": [marker] * 1000, "DELAY": [20] * 1000, "WAIT": 0}
    with (
        httpx.Client(base_url=server.url, timeout=WAIT_S) as client,
        client.stream("POST", f"/v2/models/{MODEL}/generate_stream", json=body) as answer,
    ):
        first = next(answer.iter_lines())
        assert orjson.loads(first.removeprefix("data: "))["OUT"] == marker
    # Leaving the block closed the connection with 999 responses to go.
    wait_for(lambda: str(marker) in _cancelled(served.repository), "the model seeing is_cancelled()")
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as client:
        one = client.post(f"/v2/models/{MODEL}/generate", json={"IN": 9, "DELAY": 0, "WAIT": 0})
    assert one.json()["OUT"] == 9


async def test_an_aio_stream_cancelled_midway_cancels_the_request(served: Served) -> None:
    server = served.server
    marker = int(time.monotonic_ns() % 1_000_000_000) + 2
    async with grpcclient_aio.InferenceServerClient(server.grpc_address) as client:

        async def requests() -> AsyncIterator[dict[str, Any]]:
            yield {"model_name": MODEL, "inputs": repeat_inputs(grpcclient_aio, [marker] * 1000, delay_ms=20)}
            await asyncio.Event().wait()  # the stream stays open until cancelled

        responses = client.stream_infer(inputs_iterator=requests())
        result, error = await asyncio.wait_for(responses.__anext__(), WAIT_S)
        assert error is None and int(result.as_numpy("OUT")[0]) == marker
        responses.cancel()
    await asyncio.to_thread(wait_for, lambda: str(marker) in _cancelled(served.repository), "is_cancelled()")
