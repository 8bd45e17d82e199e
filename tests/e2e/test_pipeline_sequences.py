"""A pipeline whose steps are sequence models: the request's ``sequence_id``, ``sequence_start`` and
``sequence_end`` reach every step, so each step keeps its implicit state per sequence, over gRPC
(tritonclient's sync calls and its stream) and HTTP; a request without an id is refused by the
first step, named."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml
from model_builders import write_python_model
from tritonclient.utils import InferenceServerException

from tensorgate.testing import ServerProcess

# OUTPUT = INPUT + the sum of every INPUT the sequence sent before (the state ``total``).
ACCUMULATE = """
from tensorgate import PythonModel


class Accumulate(PythonModel):
    def execute(self, inputs):
        total = inputs["total_in"] + inputs["INPUT"]
        return {"OUTPUT": total, "total_out": total}
"""
SEQUENCES = {
    "max_sequence_idle_microseconds": 10_000_000,
    "oldest": {"max_candidate_sequences": 16, "max_queue_delay_microseconds": 1000},
    "state": [
        {
            "input_name": "total_in",
            "output_name": "total_out",
            "data_type": "TYPE_FP32",
            "dims": [4],
            "initial_state": {"name": "zeros", "data_type": "TYPE_FP32", "dims": [4], "zero_data": True},
        }
    ],
}
TENSOR = {"datatype": "FP32", "shape": [-1, 4]}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo: Path = tmp_path_factory.mktemp("pipeline-sequences")
    for name in ("first", "second"):
        write_python_model(repo, name, code=ACCUMULATE, sequence_batching=SEQUENCES)
    (repo / "twice" / "1").mkdir(parents=True)
    config = {
        "backend": "pipeline",
        "inputs": [{"name": "INPUT", **TENSOR}],
        "outputs": [{"name": "OUTPUT", **TENSOR}],
        "steps": [
            {"model": "first", "inputs": {"INPUT": "INPUT"}, "outputs": {"OUTPUT": "middle"}},
            {"model": "second", "inputs": {"INPUT": "middle"}, "outputs": {"OUTPUT": "OUTPUT"}},
        ],
    }
    (repo / "twice" / "config.yaml").write_text(yaml.safe_dump(config))
    with ServerProcess("--model-repository", str(repo)) as started:
        yield started


def _expected(chunks: list[float]) -> list[float]:
    """What ``twice`` answers after each chunk: the second step sums the first step's running sums."""
    firsts = np.cumsum(chunks)
    return np.cumsum(firsts).tolist()


def _input(module: Any, value: float) -> Any:
    tensor = module.InferInput("INPUT", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.full((1, 4), value, np.float32))
    return tensor


def test_each_step_keeps_state_per_sequence_over_grpc_and_http(server: ServerProcess) -> None:
    grpc = grpcclient.InferenceServerClient(server.grpc_address)
    http = httpclient.InferenceServerClient(server.http_address)
    values = {101: [1.0, 2.0, 3.0, 4.0], "utterance-b": [10.0, 20.0, 30.0, 40.0]}
    answers: dict[int | str, list[float]] = {key: [] for key in values}
    for index in range(4):  # the two sequences interleaved, one over each protocol
        for key, client, module in ((101, grpc, grpcclient), ("utterance-b", http, httpclient)):
            result = client.infer(
                "twice",
                [_input(module, values[key][index])],
                sequence_id=key,
                sequence_start=index == 0,
                sequence_end=index == 3,
            )
            answers[key].append(float(result.as_numpy("OUTPUT")[0, 0]))
    assert answers == {key: _expected(chunks) for key, chunks in values.items()}


def test_over_the_grpc_stream(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_address)
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        chunks = [0.5, 1.5, 2.5]
        got = []
        for index, value in enumerate(chunks):
            client.async_stream_infer(
                "twice", [_input(grpcclient, value)], sequence_id=7, sequence_start=index == 0, sequence_end=index == 2
            )
            result, error = results.get(timeout=30)
            assert error is None
            got.append(float(result.as_numpy("OUTPUT")[0, 0]))
    finally:
        client.stop_stream()
    assert got == _expected(chunks)


def test_a_request_without_a_sequence_id_is_refused_by_the_first_step(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_address)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("twice", [_input(grpcclient, 1.0)])
    assert "StatusCode.INVALID_ARGUMENT" in str(caught.value.status())
    assert "pipeline 'twice' step 1 ('first')" in caught.value.message()
    assert "correlation ID" in caught.value.message()
