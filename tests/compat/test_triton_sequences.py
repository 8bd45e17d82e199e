"""Triton's sequence examples (``simple_{http,grpc}_sequence_sync_infer_client.py``,
``simple_grpc_sequence_stream_infer_client.py`` and their asyncio forms) run with ``tritonclient``
against Triton's ``simple_sequence`` served by tensorgate, with the examples' data and checks; and
every control tensor and the implicit state of a sequence, seen from inside a Triton Python model.
"""

from __future__ import annotations

import asyncio
import queue
import uuid
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcclient_aio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpclient_aio
from tritonclient.utils import InferenceServerException

from tensorgate.testing import ServerProcess

# The examples' data: each sequence sends its first value, then VALUES (or their negations).
VALUES = [11, 7, 5, 3, 2, 0, 1]


def _expected(first: int, negate: bool) -> list[int]:
    """simple_sequence answers INPUT + START: the first value plus one, then each value as sent."""
    return [first + 1] + [-v if negate else v for v in VALUES]


def _sequences() -> list[tuple[int | str, int, bool]]:
    """(id, first value, negate), as the examples choose them: two integer ids and a string id."""
    return [(1000, 0, False), (1001, 100, True), (str(uuid.uuid4()), 20, True)]


def _input(module: Any, value: int) -> list[Any]:
    tensor = module.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.full((1, 1), value, dtype=np.int32))
    return [tensor]


def _sent(first: int, negate: bool) -> list[int]:
    return [first] + [-v if negate else v for v in VALUES]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_simple_sequence_sync_infer_clients(triton_server: ServerProcess, protocol: str) -> None:
    module = httpclient if protocol == "http" else grpcclient
    address = triton_server.http_address if protocol == "http" else triton_server.grpc_address
    client = module.InferenceServerClient(address)
    try:
        for sequence_id, first, negate in _sequences():
            values = _sent(first, negate)
            got = []
            for count, value in enumerate(values, start=1):
                result = client.infer(
                    "simple_sequence",
                    _input(module, value),
                    sequence_id=sequence_id,
                    sequence_start=count == 1,
                    sequence_end=count == len(values),
                )
                got.append(int(result.as_numpy("OUTPUT")[0][0]))
            assert got == _expected(first, negate), sequence_id
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
async def test_simple_sequence_aio_sync_infer_clients(triton_server: ServerProcess, protocol: str) -> None:
    module = httpclient_aio if protocol == "http" else grpcclient_aio
    address = triton_server.http_address if protocol == "http" else triton_server.grpc_address
    client = module.InferenceServerClient(address)

    async def one(sequence_id: int | str, first: int, negate: bool) -> list[int]:
        values = _sent(first, negate)
        got = []
        for count, value in enumerate(values, start=1):
            result = await client.infer(
                "simple_sequence",
                _input(module, value),
                sequence_id=sequence_id,
                sequence_start=count == 1,
                sequence_end=count == len(values),
            )
            got.append(int(result.as_numpy("OUTPUT")[0][0]))
        return got

    try:
        sequences = _sequences()
        answers = await asyncio.gather(*(one(*s) for s in sequences))  # the three side by side
        assert answers == [_expected(first, negate) for _, first, negate in sequences]
    finally:
        await client.close()


def test_simple_sequence_stream_infer_client(triton_server: ServerProcess) -> None:
    """Three sequences sent down one stream, interleaved as the example sends them; each answer is
    routed back by its request id (``<sequence id>_<n>``), which the server must echo."""
    answers: queue.Queue[Any] = queue.Queue()

    def callback(completed: queue.Queue[Any], result: Any, error: Any) -> None:
        completed.put(error if error is not None else result)

    sequences = _sequences()
    with grpcclient.InferenceServerClient(triton_server.grpc_address) as client:
        client.start_stream(callback=partial(callback, answers))
        for sequence_id, first, negate in sequences:
            values = _sent(first, negate)
            for count, value in enumerate(values, start=1):
                client.async_stream_infer(
                    model_name="simple_sequence",
                    inputs=_input(grpcclient, value),
                    outputs=[grpcclient.InferRequestedOutput("OUTPUT")],
                    request_id=f"{sequence_id}_{count}",
                    sequence_id=sequence_id,
                    sequence_start=count == 1,
                    sequence_end=count == len(values),
                )
        by_sequence: dict[str, list[int]] = {str(s): [] for s, _, _ in sequences}
        for _ in range(len(sequences) * (len(VALUES) + 1)):
            item = answers.get(timeout=30)
            assert not isinstance(item, InferenceServerException), item
            sequence_id, _, _ = item.get_response().id.rpartition("_")
            by_sequence[sequence_id].append(int(item.as_numpy("OUTPUT")[0][0]))
        client.stop_stream()
    for sequence_id, first, negate in sequences:
        assert by_sequence[str(sequence_id)] == _expected(first, negate)


async def test_simple_sequence_aio_stream_infer_client(triton_server: ServerProcess) -> None:
    sequences = _sequences()

    async def requests() -> AsyncIterator[dict[str, Any]]:
        for sequence_id, first, negate in sequences:
            values = _sent(first, negate)
            for count, value in enumerate(values, start=1):
                yield {
                    "model_name": "simple_sequence",
                    "inputs": _input(grpcclient_aio, value),
                    "request_id": f"{sequence_id}_{count}",
                    "sequence_id": sequence_id,
                    "sequence_start": count == 1,
                    "sequence_end": count == len(values),
                }

    by_sequence: dict[str, list[int]] = {str(s): [] for s, _, _ in sequences}
    async with grpcclient_aio.InferenceServerClient(triton_server.grpc_address) as client:
        received = 0
        async for result, error in client.stream_infer(requests()):
            assert error is None, error
            sequence_id, _, _ = result.get_response().id.rpartition("_")
            by_sequence[sequence_id].append(int(result.as_numpy("OUTPUT")[0][0]))
            received += 1
            if received == len(sequences) * (len(VALUES) + 1):
                break
    for sequence_id, first, negate in sequences:
        assert by_sequence[str(sequence_id)] == _expected(first, negate)


# -- every control, and implicit state, seen by a Triton Python model --------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_model_sees_each_control_and_its_state(triton_server: ServerProcess, protocol: str) -> None:
    module = httpclient if protocol == "http" else grpcclient
    address = triton_server.http_address if protocol == "http" else triton_server.grpc_address
    sequence_id = 2**62 + 5 if protocol == "grpc" else 77
    values = [4, 5, 6, 7]
    client = module.InferenceServerClient(address)
    try:
        rows = []
        for count, value in enumerate(values, start=1):
            result = client.infer(
                "sequence_accumulate",
                _input(module, value),
                sequence_id=sequence_id,
                sequence_start=count == 1,
                sequence_end=count == len(values),
            )
            rows.append((result.as_numpy("OUTPUT")[0].tolist(), result.as_numpy("CONTROLS")[0].tolist()))
            assert {o["name"] for o in _outputs(result)} == {"OUTPUT", "CONTROLS"}  # the state stays inside
    finally:
        client.close()
    corrid = sequence_id
    assert rows == [
        ([4], [1, 0, 1, corrid]),
        ([9], [0, 0, 1, corrid]),
        ([15], [0, 0, 1, corrid]),
        ([22 + corrid], [0, 1, 1, corrid]),
    ]


def _outputs(result: Any) -> list[dict[str, Any]]:
    response = result.get_response()
    if isinstance(response, dict):
        return list(response["outputs"])
    return [{"name": output.name} for output in response.outputs]


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({}, "inference request to model 'sequence_accumulate' must specify a non-zero or non-empty correlation ID"),
        (
            {"sequence_id": 424242},
            "inference request for sequence 424242 to model 'sequence_accumulate' must specify the START flag on "
            "the first request of the sequence",
        ),
        (
            {"sequence_id": "an-utterance", "sequence_start": True},
            "sequence id 'an-utterance' is a string, but model 'sequence_accumulate' takes its CORRID control as "
            "UINT64: send an integer sequence_id",
        ),
    ],
)
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bad_sequence_requests_are_refused_with_triton_s_words(
    triton_server: ServerProcess, protocol: str, parameters: dict[str, Any], message: str
) -> None:
    module = httpclient if protocol == "http" else grpcclient
    address = triton_server.http_address if protocol == "http" else triton_server.grpc_address
    client = module.InferenceServerClient(address)
    try:
        with pytest.raises(InferenceServerException) as raised:
            client.infer("sequence_accumulate", _input(module, 1), **parameters)
    finally:
        client.close()
    assert message in raised.value.message()
    assert raised.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")


def test_a_second_start_and_a_batch_of_two_are_refused(triton_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(triton_server.http_address)
    try:
        client.infer("sequence_accumulate", _input(httpclient, 1), sequence_id=5150, sequence_start=True)
        with pytest.raises(InferenceServerException, match="sequence 5150 of model 'sequence_accumulate' is already"):
            client.infer("sequence_accumulate", _input(httpclient, 1), sequence_id=5150, sequence_start=True)
        two = httpclient.InferInput("INPUT", [2, 1], "INT32")
        two.set_data_from_numpy(np.ones((2, 1), dtype=np.int32))
        with pytest.raises(InferenceServerException, match="must specify batch-size 1 due to requirements of sequence"):
            client.infer("sequence_accumulate", [two], sequence_id=5150)
        # The refused requests left the sequence as it was: it goes on from its first value.
        result = client.infer("sequence_accumulate", _input(httpclient, 2), sequence_id=5150, sequence_end=True)
        assert result.as_numpy("OUTPUT")[0][0] == 1 + 2 + 5150
    finally:
        client.close()


async def test_oldest_batches_the_requests_of_different_sequences_together(triton_server: ServerProcess) -> None:
    """Sixteen sequences step side by side (oldest strategy, two instances): their requests share
    batches, which the statistics extension shows, and every sequence keeps its own sum."""
    async with grpcclient_aio.InferenceServerClient(triton_server.grpc_address) as client:

        async def sequence(sequence_id: int) -> list[int]:
            sums = []
            for step in range(6):
                result = await client.infer(
                    "sequence_accumulate",
                    _input(grpcclient_aio, sequence_id),
                    sequence_id=sequence_id,
                    sequence_start=step == 0,
                    sequence_end=step == 5,
                )
                sums.append(int(result.as_numpy("OUTPUT")[0][0]))
            return sums

        ids = list(range(9000, 9016))
        answers = await asyncio.gather(*(sequence(i) for i in ids))
        assert answers == [[i * k for k in range(1, 6)] + [6 * i + i] for i in ids]
        assert await _largest_batch(client) > 1


async def _largest_batch(client: Any) -> int:
    statistics = await client.get_inference_statistics("sequence_accumulate", as_json=True)
    stats = statistics["model_stats"][0].get("batch_stats", [])
    return max((int(entry["batch_size"]) for entry in stats), default=0)
