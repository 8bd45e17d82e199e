"""Stateful sequences end to end: implicit state kept by the server across a sequence's requests,
bit-exact with the model run in-process; a worker killed mid-utterance under 16 streams loses no
utterance; a hot reload leaves open sequences on their version; direct binding; idle sequences.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import pytest
import tritonclient.grpc.aio as grpcclient
import tritonclient.http as httpclient
from model_builders import metric, write_python_model
from tritonclient.utils import InferenceServerException

from tensorgate.testing import ServerProcess

WIDTH = 8

# A recurrent cell over a state of WIDTH floats, elementwise only, so a row's result does not
# depend on what else shares its batch: h' = tanh(h * A + x * B + C); OUTPUT is h'. Each instance
# reports its index in INSTANCE, and waits ``delay_ms`` per call.
RECURRENT = """
import time

import numpy as np

from tensorgate import PythonModel

RNG = np.random.default_rng(7)
A, B, C = (RNG.uniform(-1, 1, 8).astype(np.float32) for _ in range(3))


class Recurrent(PythonModel):
    def load(self, context):
        self.index = int(context.instance.rsplit("_", 1)[-1].split("r")[0] or 0)
        self.delay = float(context.parameters.get("delay_ms", 0)) / 1000.0
        self.offset = float(context.parameters.get("offset", 0))

    def execute(self, inputs):
        if self.delay:
            time.sleep(self.delay)
        h = np.tanh(inputs["H_IN"] * A + inputs["INPUT"] * B + C).astype(np.float32)
        rows = h.shape[0]
        return {
            "OUTPUT": h + np.float32(self.offset),
            "H_OUT": h,
            "INSTANCE": np.full((rows, 1), self.index, dtype=np.int32),
        }
"""


def _config(strategy: dict[str, Any], idle_us: int) -> dict[str, Any]:
    return {
        "outputs": [
            {"name": "OUTPUT", "datatype": "FP32", "shape": [-1, WIDTH]},
            {"name": "INSTANCE", "datatype": "INT32", "shape": [-1, 1]},
        ],
        "sequence_batching": {
            "max_sequence_idle_microseconds": idle_us,
            **strategy,
            "state": [
                {
                    "input_name": "H_IN",
                    "output_name": "H_OUT",
                    "data_type": "TYPE_FP32",
                    "dims": [WIDTH],
                    "initial_state": {"data_type": "TYPE_FP32", "dims": [WIDTH], "zero_data": True},
                }
            ],
        },
    }


def _write(
    repo: Path, name: str = "rnn", *, strategy: dict[str, Any] | None = None, idle_us: int = 1_000_000, **config: Any
) -> Path:
    """The recurrent model; a shutdown waits for its open sequences until they end or go idle."""
    oldest = {"oldest": {"max_candidate_sequences": 64, "max_queue_delay_microseconds": 1000}}
    settings = _config(strategy or oldest, idle_us)
    return write_python_model(repo, name, code=RECURRENT, width=WIDTH, **settings, **config)


def _reference(steps: list[np.ndarray]) -> list[np.ndarray]:
    """The model's class run in this process, chunk by chunk, carrying its state by hand."""
    spec = importlib.util.spec_from_loader("recurrent_reference", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    exec(RECURRENT, module.__dict__)
    model = module.Recurrent()
    model.index, model.delay, model.offset = 0, 0.0, 0.0
    h = np.zeros((1, WIDTH), np.float32)
    outputs = []
    for x in steps:
        produced = model.execute({"INPUT": x, "H_IN": h})
        h = produced["H_OUT"]
        outputs.append(produced["OUTPUT"])
    return outputs


def _chunks(seed: int, count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(-2, 2, (1, WIDTH)).astype(np.float32) for _ in range(count)]


async def _stream(
    address: str,
    sequence_id: int,
    chunks: list[np.ndarray],
    model: str = "rnn",
    heard: asyncio.Queue[int] | None = None,
) -> list[Any]:
    """One sequence over its own gRPC stream, one chunk in flight at a time: its answers in order
    (each also announced on ``heard``, when given)."""
    client = grpcclient.InferenceServerClient(address)
    answers: list[Any] = []
    turn = asyncio.Event()
    turn.set()

    async def requests() -> Any:
        for count, chunk in enumerate(chunks):
            await turn.wait()
            turn.clear()
            tensor = grpcclient.InferInput("INPUT", list(chunk.shape), "FP32")
            tensor.set_data_from_numpy(chunk)
            yield {
                "model_name": model,
                "inputs": [tensor],
                "request_id": f"{sequence_id}-{count}",
                "sequence_id": sequence_id,
                "sequence_start": count == 0,
                "sequence_end": count == len(chunks) - 1,
            }

    try:
        async for result, error in client.stream_infer(requests()):
            if error is not None:
                raise error
            answers.append(result)
            if heard is not None:
                heard.put_nowait(sequence_id)
            turn.set()
            if len(answers) == len(chunks):
                break
    finally:
        await client.close()
    return answers


@pytest.fixture(scope="module")
def recurrent_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("sequences")
    _write(repo, instance_group=[{"count": 2, "isolation": "process"}], parameters={"delay_ms": 2})
    with ServerProcess("--model-repository", str(repo), "--no-access-log") as server:
        yield server


async def test_implicit_state_over_100_chunks_equals_the_model_in_process(recurrent_server: ServerProcess) -> None:
    """Four sequences of 100 chunks side by side (their requests share batches): every answer of
    each is bit for bit what the model gives in-process, chunk by chunk, with the state carried by
    hand."""
    chunks = {sequence_id: _chunks(sequence_id, 100) for sequence_id in (11, 12, 13, 14)}
    answers = await asyncio.gather(*(_stream(recurrent_server.grpc_address, s, c) for s, c in chunks.items()))
    for (sequence_id, steps), served in zip(chunks.items(), answers, strict=True):
        expected = _reference(steps)
        for step, (result, want) in enumerate(zip(served, expected, strict=True)):
            assert result.get_response().id == f"{sequence_id}-{step}"
            assert np.array_equal(result.as_numpy("OUTPUT"), want), (sequence_id, step)
            assert {o.name for o in result.get_response().outputs} == {"OUTPUT", "INSTANCE"}


async def test_a_worker_killed_mid_utterance_loses_no_utterance(recurrent_server: ServerProcess) -> None:
    """Sixteen utterances stream at once over gRPC; a worker process holding some of them is killed
    with SIGKILL partway. Each utterance still completes, with every answer what an undisturbed
    run gives: the state was the server's, so the next chunk ran on the other worker, or on the
    restarted one, from where it was."""
    assert recurrent_server.process is not None
    server = psutil.Process(recurrent_server.process.pid)
    chunks = {sequence_id: _chunks(sequence_id, 60) for sequence_id in range(100, 116)}
    restarts = await asyncio.to_thread(metric, recurrent_server.metrics_url, "tensorgate_instance_restarts_total")
    heard: asyncio.Queue[int] = asyncio.Queue()
    streams = asyncio.gather(*(_stream(recurrent_server.grpc_address, s, c, heard=heard) for s, c in chunks.items()))
    for _ in range(16 * 10):  # the utterances are a sixth of the way through when the kill lands
        await asyncio.wait_for(heard.get(), 30)
    victim = server.children()[0]
    os.kill(victim.pid, signal.SIGKILL)
    answers = await asyncio.wait_for(streams, 120)
    for (sequence_id, steps), served in zip(chunks.items(), answers, strict=True):
        expected = _reference(steps)
        assert len(served) == len(steps), sequence_id
        for step, (result, want) in enumerate(zip(served, expected, strict=True)):
            assert np.array_equal(result.as_numpy("OUTPUT"), want), (sequence_id, step)

    def restarted() -> bool:
        return metric(recurrent_server.metrics_url, "tensorgate_instance_restarts_total") >= restarts + 1

    await asyncio.to_thread(_until, restarted)  # the killed worker was restarted
    ended = await asyncio.to_thread(
        metric, recurrent_server.metrics_url, "tensorgate_sequences_ended_total", reason="end"
    )
    assert ended >= len(chunks)


def test_a_hot_reload_leaves_open_sequences_on_their_version(tmp_path: Path) -> None:
    """Version 2 (which adds 100 to every answer) appears while a sequence is open on version 1:
    that sequence finishes on version 1, with its state; a new one starts on version 2; version 1
    unloads once its last sequence ended."""
    repo = tmp_path / "models"
    _write(repo, parameters={"offset": 0}, idle_us=10_000_000)
    args = ("--model-repository", str(repo), "--model-control", "poll", "--repository-poll-secs", "0.2")
    with ServerProcess(*args, "--no-access-log") as server:
        client = httpclient.InferenceServerClient(server.http_address)
        steps = _chunks(5, 6)
        expected = _reference(steps)

        def send(sequence_id: int, step: int, chunk: np.ndarray, start: bool, end: bool) -> Any:
            tensor = httpclient.InferInput("INPUT", [1, WIDTH], "FP32")
            tensor.set_data_from_numpy(chunk)
            return client.infer("rnn", [tensor], sequence_id=sequence_id, sequence_start=start, sequence_end=end)

        for step in range(3):
            result = send(1, step, steps[step], step == 0, False)
            assert result.get_response()["model_version"] == "1"
        version_two = repo / "rnn" / "2"
        version_two.mkdir()
        (version_two / "model.py").write_text(RECURRENT)
        config = (repo / "rnn" / "config.yaml").read_text()  # v2 is told apart by its offset
        (repo / "rnn" / "config.yaml").write_text(config.replace("offset: 0", "offset: 100"))
        _until(lambda: client.get_model_metadata("rnn")["versions"] == ["2"] or _ready(client, "2"))
        fresh = send(2, 0, steps[0], True, True)
        assert fresh.get_response()["model_version"] == "2"
        np.testing.assert_array_equal(fresh.as_numpy("OUTPUT"), expected[0] + np.float32(100))
        for step in range(3, 6):
            result = send(1, step, steps[step], False, step == 5)
            assert result.get_response()["model_version"] == "1"  # where the sequence began
            assert np.array_equal(result.as_numpy("OUTPUT"), expected[step])
        _until(lambda: not _ready(client, "1"))
        ended = metric(server.metrics_url, "tensorgate_sequences_ended_total", model="rnn", version="1")
        assert ended == 1.0
        client.close()


def _ready(client: Any, version: str) -> bool:
    try:
        return bool(client.is_model_ready("rnn", version))
    except InferenceServerException:
        return False


def _until(holds: Any, timeout_s: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not holds():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.05)


async def test_direct_binds_each_sequence_to_one_slot_of_one_instance(tmp_path: Path) -> None:
    """Direct strategy, two instances of two slots each: four sequences fill the four slots, two to
    an instance, each sequence always on its own instance; a fifth is refused 503 until one ends."""
    _write(
        tmp_path / "models",
        strategy={"direct": {}},
        max_batch_size=2,
        instance_group=[{"count": 2}],
        parameters={"delay_ms": 1},
    )
    with ServerProcess("--model-repository", str(tmp_path / "models"), "--no-access-log") as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:

            async def send(sequence_id: int, start: bool = False, end: bool = False) -> httpx.Response:
                body = {
                    "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, WIDTH], "data": [0.5] * WIDTH}],
                    "parameters": {"sequence_id": sequence_id, "sequence_start": start, "sequence_end": end},
                }
                return await client.post("/v2/models/rnn/infer", json=body)

            def instance(response: httpx.Response) -> int:
                assert response.status_code == 200, response.text
                outputs = {o["name"]: o for o in response.json()["outputs"]}
                return int(outputs["INSTANCE"]["data"][0])

            homes = {s: instance(await send(s, start=True)) for s in (1, 2, 3, 4)}
            assert sorted(homes.values()) == [0, 0, 1, 1]
            full = await send(5, start=True)
            assert full.status_code == 503 and "has 4 sequences in progress" in full.json()["error"]
            for _ in range(3):
                answers = await asyncio.gather(*(send(s) for s in homes))
                assert [instance(a) for a in answers] == list(homes.values())
            await send(1, end=True)
            assert (await send(5, start=True)).status_code == 200  # the freed slot takes it


def test_an_idle_sequence_is_ended_and_its_state_freed(tmp_path: Path) -> None:
    _write(tmp_path / "models", idle_us=300_000)
    with ServerProcess("--model-repository", str(tmp_path / "models"), "--no-access-log") as server:
        client = httpclient.InferenceServerClient(server.http_address)
        tensor = httpclient.InferInput("INPUT", [1, WIDTH], "FP32")
        tensor.set_data_from_numpy(np.ones((1, WIDTH), np.float32))
        client.infer("rnn", [tensor], sequence_id="idle-one", sequence_start=True)
        assert metric(server.metrics_url, "tensorgate_sequences_open", model="rnn") == 1.0
        _until(lambda: metric(server.metrics_url, "tensorgate_sequences_ended_total", reason="idle") == 1.0)
        assert metric(server.metrics_url, "tensorgate_sequences_open", model="rnn") == 0.0
        with pytest.raises(InferenceServerException) as raised:
            client.infer("rnn", [tensor], sequence_id="idle-one")
        assert raised.value.status() == "400"
        assert "sequence idle-one of model 'rnn' was ended after 0.3 s idle" in raised.value.message()
        client.close()
