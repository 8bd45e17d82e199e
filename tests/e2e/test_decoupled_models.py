"""Decoupled models written for tensorgate (``PythonModel.execute_decoupled``) and for Triton
(``TritonPythonModel`` with response senders), end to end in a real server with real clients:
responses sent from ``execute`` and from the model's own thread after it returned, the final flag on
the last response, errors the model sends or raises (Triton's words where Triton has them), dynamic
batching giving each request of a batch its own sender, deadlines cancelling in the model, and the
metrics. Each model runs in a thread of the server and in a worker process.

Waits are for answers (with a deadline) or polls of a file the model writes, never fixed sleeps.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import yaml
from model_builders import metric, wait_until
from tritonclient.utils import InferenceServerException

from tensorgate.testing import ServerProcess

WAIT_S = 30.0

# COUNT responses VALUE = 0..COUNT-1; MODE says how: "stream" ends with the final flag alone,
# "last" puts it on the last response, "thread" sends every response from a thread after
# execute returned, "error" sends an error response halfway and goes on, "raise" raises before
# sending, "bad" sends an output the model does not declare, "slow" sends one every 20 ms until
# cancelled (noting the cancellation in the file named by the parameter "cancelled").
COUNTDOWN = """
import threading
from pathlib import Path

import numpy as np

from tensorgate import ModelError, PythonModel


class Countdown(PythonModel):
    def load(self, context):
        self.cancelled = Path(context.parameters["cancelled"])

    def execute_decoupled(self, inputs, sender):
        count = int(inputs["COUNT"].reshape(-1)[0])
        mode = inputs["MODE"].reshape(-1)[0].decode()
        value = lambda i: {"VALUE": np.array([i], np.int32)}
        if mode == "raise":
            raise ModelError("no countdown today")
        if mode == "crash":
            raise RuntimeError("secret detail from /internal/path")
        if mode == "bad":
            sender.send({"NOPE": np.array([1], np.int32)})
        if mode == "thread":
            threading.Thread(target=self.later, args=(sender, count), daemon=True).start()
            return
        if mode == "slow":
            threading.Thread(target=self.slow, args=(sender, count), daemon=True).start()
            return
        for i in range(count):
            if mode == "error" and i == count // 2:
                sender.send(error=f"the model refused {i}")
            sender.send(value(i), final=(mode == "last" and i == count - 1))
        if mode != "last":
            sender.send(final=True)

    def later(self, sender, count):
        for i in range(count):
            sender.send({"VALUE": np.array([i], np.int32)})
        sender.send(final=True)

    def slow(self, sender, count):
        stop = threading.Event()
        for i in range(count):
            if sender.is_cancelled():
                self.cancelled.write_text(str(count))
                sender.send(final=True)
                return
            sender.send({"VALUE": np.array([i], np.int32)})
            stop.wait(0.02)
        sender.send(final=True)
"""

# Triton's form, batched: every response carries SIZE, the number of requests execute was given,
# and X, its own request's input. A request whose X is -1 holds its execute while the file named
# by the parameter "hold" exists (so requests queue behind it and form a batch); "<hold>.running"
# says it is holding. MODE: "error"
# answers each request with an error response and the final flag; "raise" raises; "list" returns a
# list, which a decoupled model may not.
BATCHED = """
import json
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        assert pb_utils.using_decoupled_model_transaction_policy(config)
        self.hold = Path(json.loads(args["model_config"])["parameters"]["hold"]["string_value"])

    def execute(self, requests):
        modes = {pb_utils.get_input_tensor_by_name(r, "MODE").as_numpy().reshape(-1)[0].decode() for r in requests}
        if "raise" in modes:
            raise pb_utils.TritonModelException("refused by the model")
        if "list" in modes:
            return [pb_utils.InferenceResponse([]) for _ in requests]
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if int(x.reshape(-1)[0]) == -1:
                Path(str(self.hold) + ".running").touch()
                deadline = time.monotonic() + 30
                while self.hold.exists() and time.monotonic() < deadline:
                    time.sleep(0.005)
        for request in requests:
            sender = request.get_response_sender()
            if "error" in modes:
                error = pb_utils.TritonError("An error occurred during execution")
                final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                sender.send(pb_utils.InferenceResponse(error=error), flags=final)
                continue
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            size = pb_utils.Tensor("SIZE", np.full(x.shape, len(requests), np.int32))
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("X", x), size]))
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("X", x * 10), size]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            try:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except pb_utils.TritonModelException as exc:
                assert str(exc) == "Unable to send response. Response sender has been closed.", exc
        return None
"""


def _write(repo: Path, name: str, code: str, config: dict[str, Any]) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(code)
    (repo / name / "config.yaml").write_text(yaml.safe_dump(config))


def build(repo: Path, isolation: str) -> Path:
    group = [{"count": 1, "isolation": isolation}]
    policy = {"decoupled": True}
    _write(
        repo,
        "countdown",
        COUNTDOWN,
        {
            "backend": "python",
            "max_batch_size": 0,
            "model_transaction_policy": policy,
            "inputs": [
                {"name": "COUNT", "datatype": "INT32", "shape": [1]},
                {"name": "MODE", "datatype": "BYTES", "shape": [1]},
            ],
            "outputs": [{"name": "VALUE", "datatype": "INT32", "shape": [1]}],
            "instance_group": group,
            "parameters": {"cancelled": str(repo / "countdown.cancelled")},
        },
    )
    _write(
        repo,
        "batched",
        BATCHED,
        {
            "backend": "python",
            "max_batch_size": 8,
            "model_transaction_policy": policy,
            "dynamic_batching": {"max_queue_delay_ms": 0, "adaptive_delay": False},
            "inputs": [
                {"name": "X", "datatype": "INT32", "shape": [-1, 1]},
                {"name": "MODE", "datatype": "BYTES", "shape": [-1, 1]},
            ],
            "outputs": [
                {"name": "X", "datatype": "INT32", "shape": [-1, 1]},
                {"name": "SIZE", "datatype": "INT32", "shape": [-1, 1]},
            ],
            "instance_group": group,
            "parameters": {"hold": str(repo / "hold")},
        },
    )
    return repo


@pytest.fixture(scope="module", params=["thread", "process"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, Path]]:
    repo = build(tmp_path_factory.mktemp(f"decoupled-{request.param}"), request.param)
    with ServerProcess("--model-repository", str(repo)) as server:
        yield server, repo


@pytest.fixture()
def server(served: tuple[ServerProcess, Path]) -> ServerProcess:
    return served[0]


class Stream:
    def __init__(self, server: ServerProcess) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc_address)
        self.answers: queue.Queue[tuple[Any, InferenceServerException | None]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.answers.put((result, error)))

    def send(self, model: str, inputs: list[Any], request_id: str, **kwargs: Any) -> None:
        self.client.async_stream_infer(model, inputs, request_id=request_id, enable_empty_final_response=True, **kwargs)

    def until_final(self, count: int = 1, errors_end: bool = True) -> list[tuple[Any, InferenceServerException | None]]:
        """Answers until ``count`` requests have had their last one. tritonclient hands an error
        without its answer (no id, no final flag): with ``errors_end`` an error is a request's last."""
        answers: list[tuple[Any, InferenceServerException | None]] = []
        ended = 0
        while ended < count:
            result, error = self.answers.get(timeout=WAIT_S)
            answers.append((result, error))
            if result is not None:
                ended += bool(result.get_response().parameters["triton_final_response"].bool_param)
            else:
                ended += errors_end
        return answers

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.stop_stream()
        self.client.close()


def countdown(count: int, mode: str) -> list[Any]:
    inputs = [grpcclient.InferInput("COUNT", [1], "INT32"), grpcclient.InferInput("MODE", [1], "BYTES")]
    inputs[0].set_data_from_numpy(np.array([count], np.int32))
    inputs[1].set_data_from_numpy(np.array([mode.encode()], dtype=object))
    return inputs


def batched(x: int, mode: str = "echo") -> list[Any]:
    inputs = [grpcclient.InferInput("X", [1, 1], "INT32"), grpcclient.InferInput("MODE", [1, 1], "BYTES")]
    inputs[0].set_data_from_numpy(np.array([[x]], np.int32))
    inputs[1].set_data_from_numpy(np.array([[mode.encode()]], dtype=object))
    return inputs


def values(answers: list[tuple[Any, Any]]) -> list[int]:
    return [int(r.as_numpy("VALUE")[0]) for r, e in answers if r is not None and r.as_numpy("VALUE") is not None]


def finals(answers: list[tuple[Any, Any]]) -> list[bool]:
    return [bool(r.get_response().parameters["triton_final_response"].bool_param) for r, _ in answers if r is not None]


@pytest.mark.parametrize("mode", ["stream", "last", "thread"])
def test_a_python_model_streams_from_execute_or_its_own_thread(server: ServerProcess, mode: str) -> None:
    with Stream(server) as stream:
        stream.send("countdown", countdown(5, mode), "r")
        answers = stream.until_final()
    assert values(answers) == [0, 1, 2, 3, 4]
    # The final flag rides on the last response ("last"), or comes alone, as an empty answer.
    assert finals(answers) == ([False] * 4 + [True] if mode == "last" else [False] * 5 + [True])


def test_zero_responses_then_the_final_flag(server: ServerProcess) -> None:
    with Stream(server) as stream:
        stream.send("countdown", countdown(0, "stream"), "zero")
        answers = stream.until_final()
    assert values(answers) == [] and finals(answers) == [True]


def test_an_error_response_reaches_the_client_and_the_stream_goes_on(server: ServerProcess) -> None:
    with Stream(server) as stream:
        stream.send("countdown", countdown(4, "error"), "e")
        answers = stream.until_final(errors_end=False)
    errors = [e.message() for _, e in answers if e is not None]
    assert errors == ["the model refused 2"]
    assert values(answers) == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("raise", "model 'countdown' failed to execute the request: no countdown today"),
        # Any other exception's text stays in the server's log: it may hold paths or data
        ("crash", "model 'countdown' failed to execute the request"),
        ("bad", "the response carries output(s) ['NOPE'] that the model does not declare"),
    ],
)
def test_what_the_model_raises_ends_its_request_with_the_error(server: ServerProcess, mode: str, message: str) -> None:
    with Stream(server) as stream:
        stream.send("countdown", countdown(3, mode), "x")
        ((result, error),) = stream.until_final()
    assert result is None and error is not None and message in error.message()
    assert "secret" not in error.message()


def test_triton_error_responses_and_exceptions_in_tritons_words(server: ServerProcess) -> None:
    messages = []
    with Stream(server) as stream:
        for mode in ("error", "raise", "list"):  # one at a time: batched together, one mode would answer all
            stream.send("batched", batched(1, mode), mode)
            ((_, error),) = stream.until_final()
            assert error is not None
            messages.append(error.message())
    assert messages[0] == "An error occurred during execution"  # the model's words, as Triton sends them
    assert messages[1] == "model 'batched' failed to execute the request: refused by the model"
    assert messages[2].endswith(
        "Python model 'batched' is using the decoupled mode and the execute function must return None."
    )


def test_each_request_of_a_batch_answers_through_its_own_sender(served: tuple[ServerProcess, Path]) -> None:
    server, repo = served
    hold = repo / "hold"
    hold.touch()
    try:
        with Stream(server) as stream:
            stream.send("batched", batched(-1), "holder")
            # The holder's execute runs (it waits for the file), so these queue and go as one batch.
            wait_until(Path(str(hold) + ".running").exists, WAIT_S)
            for x in (1, 2, 3):
                stream.send("batched", batched(x), f"r{x}")
            wait_until(lambda: metric(server.metrics_url, "tensorgate_queue_depth", model="batched") == 3, WAIT_S)
            hold.unlink()
            got = [r for r, e in stream.until_final(4) if r is not None and r.as_numpy("X") is not None]
    finally:
        hold.unlink(missing_ok=True)
    for x in (1, 2, 3):
        answers = [r for r in got if r.get_response().id == f"r{x}"]
        assert [a.as_numpy("X").tolist() for a in answers] == [[[x]], [[x * 10]]]
        assert {int(a.as_numpy("SIZE")[0, 0]) for a in answers} == {3}


def test_a_deadline_ends_the_stream_and_cancels_the_request_in_the_model(served: tuple[ServerProcess, Path]) -> None:
    server, repo = served
    marker = repo / "countdown.cancelled"
    marker.unlink(missing_ok=True)
    with Stream(server) as stream:
        stream.send("countdown", countdown(100_000, "slow"), "slow", timeout=300_000)  # 0.3 s, in µs
        answers = stream.until_final()
    assert values(answers)[:3] == [0, 1, 2]
    (message,) = [e.message() for _, e in answers if e is not None]
    assert "exceeded its deadline of 300 ms" in message
    wait_until(lambda: marker.exists() and marker.read_text() == "100000", WAIT_S)


def test_generate_stream_and_metrics(server: ServerProcess) -> None:
    before = metric(server.metrics_url, "tensorgate_responses_per_request_sum", model="countdown")
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as client:
        answer = client.post("/v2/models/countdown/generate_stream", json={"COUNT": 3, "MODE": "last"})
        refused = client.post("/v2/models/countdown/generate_stream", json={"COUNT": 3, "MODE": "raise"})
    assert answer.status_code == 200
    assert answer.text.count("data: ") == 3 and '"VALUE":2' in answer.text
    assert refused.status_code == 500  # the model raised before the first event: a plain error answer
    assert refused.json()["error"] == "model 'countdown' failed to execute the request: no countdown today"
    wait_until(
        lambda: metric(server.metrics_url, "tensorgate_responses_per_request_sum", model="countdown") >= before + 3,
        WAIT_S,
    )
